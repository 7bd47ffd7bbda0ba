"""The clean-file fast path: prove that a byte range of JSON lines is clean at C speed, or step aside.

``dataset_scan`` parses a row at a time with the standard library (about a microsecond a row) so that
it can name the line of every defect. Most files have none. Here msgspec decodes a whole chunk into
typed structs in one call (the type checks of ``dataset_rows`` happen in C), numpy checks that each
line holds exactly one row, and the rest of the row rules are C-level passes over the structs.

It only ever answers "clean": at the first thing it cannot prove (a bad row, a blank line, a byte-order
mark, a formatting it does not cover) it returns None, and the caller scans that range line by line,
which finds and explains every defect. So this changes how fast a clean file passes, never what a
report says; ``tests/test_dataset_fast.py`` pins that, verdict for verdict.

Covered: alpaca and sharegpt without ranking (most instruction and chat data). openai rows (which
the converter rewrites) and ranking rows always take the line-by-line scan.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np

from .dataset_entry import RowMapping
from .dataset_rows import OPTIONAL_ALPACA_KEYS, OPTIONAL_CHAT_KEYS, is_blank
from .dataset_scan import carry_to_front
from .dataset_types import INT64_MAX, INT64_MIN, ITEM, NULL, TIMESTAMP_PATTERN, ColumnTypes
from .dataset_types import Path as TypePath

# A thousand-odd rows per decode call: the chunk and the structs made from it stay in the CPU's
# cache, which on two cores sharing memory measured faster than 4 MB chunks (bench_validate).
CHUNK_BYTES = 512 << 10
_LF, _CR, _OPEN, _CLOSE = 0x0A, 0x0D, 0x7B, 0x7D  # \n \r { }

_TEXT = Annotated[str, msgspec.Meta(min_length=1)]  # a string, not empty (checked in C)
_NEVER = Annotated[int, msgspec.Meta(ge=1, le=0)]  # admits no value: the elements of lists seen empty so far
_UNSET = msgspec.UnsetType
# Numbers that pyarrow can hold as int64 (dataset_types.fits_int64): anything else is news, learnt.
_INT64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
_WHOLE = Annotated[float, msgspec.Meta(multiple_of=1, ge=INT64_MIN, lt=2**63)]  # 2.0, not 2.5 or 1e20
_DATE = Annotated[str, msgspec.Meta(pattern=TIMESTAMP_PATTERN)]  # a column of dates so far: any other string is news
# A file whose chunks keep bringing new keys (ids used as keys, say) is left to the line-by-line scan.
MAX_LEARNED_CHUNKS = 32
# Column paths a row struct types at most: more (keys used as ids) would cost more to build than to scan.
MAX_TYPED_PATHS = 1_000
_PLAIN = msgspec.json.Decoder()  # any JSON, as Python objects


class _Unprovable(Exception):
    """The types so far already break a row rule (a bad row was learned): the scan explains."""


_OMIT = object()  # a column no row has had yet: left out of the struct, so that its first row is news
Typer = Callable[[ColumnTypes, TypePath], Any]  # the type of a column, given the types so far
Field = tuple[str, Typer, Any]  # (data column, its typer, default)


@dataclass(frozen=True)
class CleanRange:
    """A range proven clean: every line one good row. ``types``: every column's type and first rows
    (lines from the range's), and so which columns some row has (``types.seen_columns()``)."""

    rows: int
    newlines: int
    types: ColumnTypes


@dataclass(frozen=True)
class _Plan:
    decoder_for: Callable[[ColumnTypes], msgspec.json.Decoder | None]  # rows typed as rules and types demand
    rows_pass: Callable[[list[Any]], bool]  # the rules that typing leaves, over a chunk's rows


def prove_clean(
    path: Path, start: int, end: int, mapping: RowMapping, on_bytes: Callable[[int], None] | None = None
) -> CleanRange | None:
    """``CleanRange`` when every line of ``path[start:end]`` is one row that the line-by-line scan
    would pass; None otherwise (then scan the range that way). ``start`` lies just after a newline.

    Column types (``dataset_types``): the decoder admits only what the rows so far had, each column
    typed as they had it, no key they lacked, no decimal in a column of whole numbers. The first
    chunk, and any chunk it refuses, is first read as plain JSON to learn from (a clash ends the
    proof), then the decoder is rebuilt. So the first row of every column, type and decimal is
    recorded, as the scan records it, and a row that strays from its column's type never passes.
    """
    plan = _plan(mapping)
    if plan is None:
        return None
    rows = newlines = learned = 0
    types = ColumnTypes()
    decoder: msgspec.json.Decoder | None = None
    for chunk in _chunks(path, start, end):
        if on_bytes is not None:
            on_bytes(len(chunk))
        counted = _one_row_per_line(chunk)
        if counted is None or not _is_utf8(chunk):
            return None
        lines, chunk_newlines = counted
        structs = _decode(decoder, chunk)
        if structs is None:  # the first chunk, something new, or a bad row: learn, then try again
            learned += 1
            if learned > MAX_LEARNED_CHUNKS or not _learn_types(types, chunk, rows):
                return None
            if len(types.columns) > MAX_TYPED_PATHS:
                return None
            decoder = plan.decoder_for(types)
            structs = _decode(decoder, chunk)
            if structs is None:
                return None
        if len(structs) != lines or not plan.rows_pass(structs):
            return None
        rows += lines
        newlines += chunk_newlines
    return CleanRange(rows, newlines, types)


def _decode(decoder: msgspec.json.Decoder | None, chunk: memoryview) -> list[Any] | None:
    if decoder is None:
        return None
    try:
        return decoder.decode_lines(chunk)
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None


def _learn_types(types: ColumnTypes, chunk: memoryview, rows_before: int) -> bool:
    """Record the column types of a chunk's rows, read as plain JSON; False where they clash (or it
    is not rows of objects): the line-by-line scan then says where."""
    try:
        values = _PLAIN.decode_lines(chunk)
    except (msgspec.DecodeError, RecursionError):
        return False
    for index, value in enumerate(values, start=rows_before + 1):
        if type(value) is not dict or types.conflict(value, index) is not None:
            return False
    return True


def _plan(mapping: RowMapping) -> _Plan | None:
    if mapping.ranking:
        return None
    if mapping.formatting == "alpaca":
        return _alpaca_plan(mapping.columns)
    if mapping.formatting == "sharegpt":
        return _sharegpt_plan(mapping.columns, mapping.tags)
    return None


# -- typing rows as the rules and the data say ----------------------------------------------------


def _fixed(kind: Any) -> Typer:
    """A required column typed by the row rules alone (every row has it: its first row is the first)."""

    def typer(types: ColumnTypes, path: TypePath) -> Any:
        _refuse_dates(types, path)
        return kind

    return typer


def _refuse_dates(types: ColumnTypes, path: TypePath) -> None:
    """A column the row rules type as text but whose strings are all dates so far (in practice never)
    would need a second type: the scan checks that file instead."""
    column = types.columns.get(path)
    if column is not None and column.dated:
        raise _Unprovable


def _as_data(types: ColumnTypes, path: TypePath) -> Any:
    """A column typed as the rows so far had it; left out until one has."""
    return _data_type(types, path, field=True) if path in types.columns else _OMIT


def _rule_typed(kind: str, strict: Any, complete: Callable[[ColumnTypes, TypePath], bool] | None = None) -> Typer:
    """An optional column that the row rules type as ``strict`` (a JSON ``kind``): null-only until
    a row has a value, and ``strict`` once ``complete`` (what is below it seen too, for lists)."""

    def typer(types: ColumnTypes, path: TypePath) -> Any:
        seen = types.kind(path)
        _refuse_dates(types, path)
        if seen is None:
            return _OMIT
        if seen == NULL:
            return None | _UNSET
        if seen != kind:
            raise _Unprovable
        if complete is None or complete(types, path):
            return strict
        return list[_NEVER] | None | _UNSET  # type: ignore[valid-type]

    return typer


def _pairs_seen(types: ColumnTypes, path: TypePath) -> bool:
    _refuse_dates(types, (*path, ITEM, ITEM))
    return types.kind((*path, ITEM, ITEM)) == "string"


_QUERY = _rule_typed("string", str | None | _UNSET)  # absent, null or a string
_HISTORY = _rule_typed("array", list[tuple[str, str]] | None | _UNSET, _pairs_seen)  # [prompt, response] pairs


def _row_fields(
    fields: dict[str, Field], columns: Mapping[str, Any], optional_keys: tuple[str, ...]
) -> dict[str, Field] | None:
    """``fields`` (typed by the row rules) plus the other mapped optional columns (typed by the data),
    each named by its mapping key and renamed to its data column. None where the mapping cannot be a
    struct: a column that is not a string, one column in two roles (the scan explains)."""
    fields = dict(fields)
    for key in optional_keys:
        if columns.get(key):
            fields.setdefault(key, (columns[key], _as_data, msgspec.UNSET))
    data_columns = [column for column, _, _ in fields.values()]
    if not all(isinstance(c, str) and c for c in data_columns) or len(set(data_columns)) != len(data_columns):
        return None
    return fields


def _struct(name: str, types: ColumnTypes, path: TypePath, fields: dict[str, Field]) -> Any:
    """A struct of ``fields`` and every other key seen at ``path``, typed as seen; it refuses keys
    not seen yet, so that a new one makes the caller learn it."""
    fields = dict(fields)
    taken = {column for column, _, _ in fields.values()}
    for key in types.children(path):
        if key not in taken:
            fields[f"x_{len(fields)}"] = (key, _as_data, msgspec.UNSET)
    spec, rename = [], {}
    for key, (column, typer, default) in fields.items():
        kind = typer(types, (*path, column))
        if kind is not _OMIT:
            spec.append((key, kind, default))
            rename[key] = column
    return msgspec.defstruct(
        name,
        spec,
        rename=rename,
        forbid_unknown_fields=True,
        gc=False,  # rows of strings and numbers hold no cycles: no GC tracking, faster to build and free
    )


def _data_type(types: ColumnTypes, path: TypePath, field: bool) -> Any:
    """The type the rows so far gave ``path`` (a struct field, or the elements of a list): null only
    admits null, a number column admits decimals once it has had one that is not whole."""
    column = types.columns.get(path)
    if column is None:
        return _NEVER  # elements of lists that were all empty so far
    kind: Any
    if column.kind == "string":
        kind = _DATE if column.dated else str
    elif column.kind == "number":  # news, so learnt: the first decimal, then the first not whole
        kind = _INT64 if column.decimal is None else _INT64 | _WHOLE if column.fraction is None else int | float
    elif column.kind == "boolean":
        kind = bool
    elif column.kind == "array":
        kind = list[_data_type(types, (*path, ITEM), field=False)]  # type: ignore[misc]
    elif column.kind == "object":
        kind = _struct("Object", types, path, {})
    else:
        return None | _UNSET if field else None
    return kind | None | _UNSET if field else kind | None


_NO_STRUCT = (TypeError, ValueError, RecursionError, _Unprovable)  # RecursionError: nested too deep to type


def _struct_or_none(name: str, types: ColumnTypes, fields: dict[str, Field]) -> msgspec.json.Decoder | None:
    try:
        return msgspec.json.Decoder(_struct(name, types, (), fields))
    except _NO_STRUCT:
        return None


# -- alpaca ---------------------------------------------------------------------------------------


def _alpaca_plan(columns: Mapping[str, Any]) -> _Plan | None:
    fields: dict[str, Field] = {
        # A null or empty prompt is fine when the query has text, but rare: left to the scan.
        "prompt": (columns["prompt"], _fixed(_TEXT), msgspec.NODEFAULT),
        "response": (columns["response"], _fixed(_TEXT), msgspec.NODEFAULT),
    }
    for key, typer in (("query", _QUERY), ("history", _HISTORY)):
        if columns.get(key):
            fields[key] = (columns[key], typer, msgspec.UNSET)
    row_fields = _row_fields(fields, columns, OPTIONAL_ALPACA_KEYS)
    if row_fields is None:
        return None
    check = partial(_alpaca_rows_pass, operator.attrgetter("prompt"), _query_of, operator.attrgetter("response"))
    return _Plan(partial(_struct_or_none, "AlpacaRow", fields=row_fields), check)


def _query_of(row: Any) -> Any:
    return getattr(row, "query", msgspec.UNSET)  # a struct without it: no row has had one yet


def _alpaca_rows_pass(
    prompt: Callable[[Any], str], query: Callable[[Any], Any], response: Callable[[Any], str], rows: list[Any]
) -> bool:
    """The rules typing leaves: the response is not all blanks, and neither is the prompt, or else
    the query has text."""
    if any(map(str.isspace, map(response, rows))):
        return False
    if not any(map(str.isspace, map(prompt, rows))):
        return True  # the common case
    return not any(is_blank(query(row)) for row in rows if prompt(row).isspace())


# -- sharegpt -------------------------------------------------------------------------------------

# Each message's role as a side: the user side (user, observation), the assistant side (assistant,
# function_call), or system. A row passes when its sides read: system?, then (user, assistant)+.
_USER, _ASSISTANT, _SYSTEM = 1, 2, 3
_SIDES = {
    "user_tag": _USER,
    "observation_tag": _USER,
    "assistant_tag": _ASSISTANT,
    "function_tag": _ASSISTANT,
    "system_tag": _SYSTEM,
}


def _sharegpt_plan(columns: Mapping[str, Any], tags: Mapping[str, Any]) -> _Plan | None:
    role, content = tags["role_tag"], tags["content_tag"]
    sides: dict[Any, int] = {}
    for tag, side in _SIDES.items():
        value = tags[tag]
        if value is not None and sides.setdefault(value, side) != side:
            return None  # one role on two sides: the scan explains that
    names_ok = isinstance(role, str) and isinstance(content, str) and role and content and role != content
    if not (names_ok and tags["user_tag"] and tags["assistant_tag"]):
        return None
    messages = columns["messages"]
    if not isinstance(messages, str) or not messages:
        return None
    fields: dict[str, Field] = {"messages": (messages, _as_data, msgspec.NODEFAULT)}  # typed below
    row_fields = _row_fields(fields, columns, OPTIONAL_CHAT_KEYS)
    if row_fields is None:
        return None
    message_fields: dict[str, Field] = {
        "role": (role, _fixed(str), msgspec.NODEFAULT),
        "content": (content, _fixed(str), msgspec.NODEFAULT),
    }
    check = partial(_sharegpt_rows_pass, sides, operator.attrgetter("messages"))
    return _Plan(partial(_sharegpt_decoder, row_fields, message_fields), check)


def _sharegpt_decoder(
    row_fields: dict[str, Field], message_fields: dict[str, Field], types: ColumnTypes
) -> msgspec.json.Decoder | None:
    """Rows whose messages column is a list of messages: role and content strings, other keys as seen."""
    column = row_fields["messages"][0]
    if types.kind((column,)) != "array" or types.kind((column, ITEM)) != "object":
        return None  # no messages, or not as a list of objects: the scan explains
    try:
        message = _struct("Message", types, (column, ITEM), message_fields)
    except _NO_STRUCT:
        return None
    fields = {**row_fields, "messages": (column, _fixed(list[message]), msgspec.NODEFAULT)}  # type: ignore[valid-type]
    return _struct_or_none("ShareGPTRow", types, fields)


_role_of, _content_of = operator.attrgetter("role"), operator.attrgetter("content")


def _sharegpt_rows_pass(sides: dict[Any, int], messages_of: Callable[[Any], list[Any]], rows: list[Any]) -> bool:
    """Roles in turn (an optional system message first, then the user and assistant sides taking
    turns, ending on the assistant side) and no assistant message without text. The messages of
    all the rows are laid end to end, so that numpy checks every row's order at once."""
    conversations = list(map(messages_of, rows))
    lengths = np.fromiter(map(len, conversations), dtype=np.int64, count=len(conversations))
    if not lengths.all():
        return False  # no messages
    messages = list(chain.from_iterable(conversations))
    try:
        side = np.fromiter(map(sides.__getitem__, map(_role_of, messages)), dtype=np.int8, count=len(messages))
    except KeyError:
        return False  # a role that no tag names
    starts = np.cumsum(lengths) - lengths  # each row's first message
    first_turn = starts + (side[starts] == _SYSTEM)
    turns = starts + lengths - first_turn
    if not bool(((turns > 0) & (turns % 2 == 0)).all()):
        return False  # no turns, or the last user turn has no answer
    position = np.arange(len(messages)) - np.repeat(first_turn, lengths)  # -1: the leading system message
    expected = np.where(position < 0, _SYSTEM, np.where(position % 2 == 0, _USER, _ASSISTANT))
    if not bool((side == expected).all()):
        return False  # roles out of order
    contents = list(map(_content_of, messages))
    if all(contents) and not any(map(str.isspace, contents)):
        return True  # the common case
    return not any(s == _ASSISTANT and is_blank(text) for s, text in zip(side.tolist(), contents, strict=True))


# -- the bytes ------------------------------------------------------------------------------------


def _chunks(path: Path, start: int, end: int) -> Iterator[memoryview]:
    """The range in pieces of about ``CHUNK_BYTES``, each ending just after a newline (the last one
    may not). One buffer, reused; a line longer than a chunk makes it grow."""
    buf = bytearray(2 * CHUNK_BYTES)
    view = memoryview(buf)
    kept = 0  # bytes after the last chunk's final newline, moved to the front
    remaining = end - start
    with open(path, "rb", buffering=0) as handle:
        handle.seek(start)
        while True:
            if len(buf) - kept < CHUNK_BYTES:  # a long line fills the buffer: a bigger one (the caller
                buf = bytearray(2 * len(buf))  # may still hold a view of the old one)
                buf[:kept] = view[:kept]
                view = memoryview(buf)
            n = handle.readinto(view[kept : kept + min(CHUNK_BYTES, remaining)]) if remaining > 0 else 0
            remaining -= n
            filled = kept + n
            if remaining <= 0:
                if filled:
                    yield view[:filled]
                return
            cut = buf.rfind(b"\n", 0, filled) + 1
            if cut:
                yield view[:cut]
                kept = carry_to_front(buf, view, cut, filled)
            else:
                kept = filled  # no newline yet: read on behind it


def _one_row_per_line(chunk: memoryview) -> tuple[int, int] | None:
    """``(lines, newlines)`` when every line starts with ``{`` and ends with ``}`` (``}\\r`` in a
    CRLF file), nothing else; else None. Only the range's last chunk may lack a final newline.

    Why that and a row count equal to the line count prove one row per line: inside a JSON value a
    ``}`` can be followed only by ``,``, ``}``, ``]`` or the end, never by ``{``, and a raw newline
    cannot sit inside a string. So every ``}\\n{`` is a boundary between two top-level values, each
    line holds one or more whole rows, and as many rows as lines means exactly one each.
    """
    data = np.frombuffer(chunk, dtype=np.uint8)
    if not len(data) or data[0] != _OPEN:
        return None
    ends = np.flatnonzero(data == _LF)
    closed = len(ends) and ends[-1] == len(data) - 1
    starts = ends[:-1] + 1 if closed else ends + 1
    if not _all_equal(data[starts], _OPEN):
        return None
    last = ends if closed else np.append(ends, len(data))  # one past each line's last byte
    crlf = _all_equal(data[last - 1], _CR)  # then every line is at least "{\\r": last - 2 is in the line
    if not _all_equal(data[last - (2 if crlf else 1)], _CLOSE):
        return None
    return len(last), len(ends)


def _all_equal(values: np.ndarray, byte: int) -> bool:
    return bool((values == byte).all())


def _is_utf8(chunk: memoryview) -> bool:
    """msgspec checks the strings it keeps, not those of columns it skips: check every byte."""
    if int(np.frombuffer(chunk, dtype=np.uint8).max()) < 0x80:
        return True
    try:
        str(chunk, "utf-8")
    except UnicodeDecodeError:
        return False
    return True
