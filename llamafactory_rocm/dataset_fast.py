"""The clean-file fast path: prove that a byte range of JSON lines is clean at C speed, or step aside.

``dataset_scan`` parses a row at a time with the standard library (about a microsecond a row) so that
it can name the line of every defect. Most files have none. Here msgspec decodes a whole chunk into
typed structs in one call (the type checks of ``dataset_rows`` happen in C), numpy checks that each
line holds exactly one row, and the rest of the row rules are C-level passes over the structs.

It only ever answers "clean": at the first thing it cannot prove (a bad row, a blank line, a byte-order
mark, a formatting it does not cover) it returns None, and the caller scans that range line by line,
which finds and explains every defect. So this changes how fast a clean file passes, never what a
report says; ``tests/test_dataset_fast.py`` pins that, verdict for verdict.

Covered: alpaca without ranking (the shape of most instruction data). sharegpt, openai and ranking
rows always take the line-by-line scan.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np

from .dataset_entry import RowMapping
from .dataset_rows import OPTIONAL_ALPACA_KEYS

# A thousand-odd rows per decode call: the chunk and the structs made from it stay in the CPU's
# cache, which on two cores sharing memory measured faster than 4 MB chunks (bench_validate).
CHUNK_BYTES = 512 << 10
_LF, _CR, _OPEN, _CLOSE = 0x0A, 0x0D, 0x7B, 0x7D  # \n \r { }

# How the struct types the optional columns that the row rules look into; the others are only
# looked for (a mapped column that no row has is a KeyError in the converter).
_TEXT = Annotated[str, msgspec.Meta(min_length=1)]  # a string, not empty (checked in C)
_OPTIONAL_TYPES: dict[str, Any] = {
    "query": str | None | msgspec.UnsetType,  # absent, null or a string
    "history": list[tuple[str, str]] | None | msgspec.UnsetType,  # or a list of [prompt, response] pairs
}


@dataclass(frozen=True)
class CleanRange:
    """A range proven clean: every line one good row. ``seen`` holds the optional mapped columns
    that at least one of its rows has."""

    rows: int
    newlines: int
    seen: frozenset[str]


@dataclass(frozen=True)
class _Plan:
    decoder: msgspec.json.Decoder
    prompt: Callable[[Any], Any]
    query: Callable[[Any], Any]
    response: Callable[[Any], Any]
    optional: dict[str, Callable[[Any], Any]]  # data column -> its getter (UNSET where a row lacks it)


def prove_clean(
    path: Path, start: int, end: int, mapping: RowMapping, on_bytes: Callable[[int], None] | None = None
) -> CleanRange | None:
    """``CleanRange`` when every line of ``path[start:end]`` is one row that the line-by-line scan
    would pass; None otherwise (then scan the range that way). ``start`` lies just after a newline."""
    plan = _plan(mapping)
    if plan is None:
        return None
    rows = newlines = 0
    seen: set[str] = set()
    for chunk, final in _chunks(path, start, end):
        if on_bytes is not None:
            on_bytes(len(chunk))
        counted = _one_row_per_line(chunk, final)
        if counted is None or not _is_utf8(chunk):
            return None
        try:
            structs = plan.decoder.decode_lines(chunk)
        except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
            return None
        lines, chunk_newlines = counted
        if len(structs) != lines or not _rows_pass(plan, structs):
            return None
        rows += lines
        newlines += chunk_newlines
        for column, get in plan.optional.items():
            if column not in seen and any(map(operator.is_not, map(get, structs), repeat(msgspec.UNSET))):
                seen.add(column)
    return CleanRange(rows, newlines, frozenset(seen))


# -- the row rules, as passes over a chunk's structs ----------------------------------------------


def _plan(mapping: RowMapping) -> _Plan | None:
    """A decoder whose struct has exactly the mapped columns, typed as the row rules demand."""
    if mapping.formatting != "alpaca" or mapping.ranking:
        return None
    cols = mapping.columns
    # field -> (data column, type, default); a field's name is its mapping key, so always a valid name
    fields: dict[str, tuple[Any, Any, Any]] = {
        # A null or empty prompt is fine when the query has text, but rare: left to the scan.
        "prompt": (cols["prompt"], _TEXT, msgspec.NODEFAULT),
        "response": (cols["response"], _TEXT, msgspec.NODEFAULT),
    }
    for key in OPTIONAL_ALPACA_KEYS:
        if cols.get(key):
            fields[key] = (cols[key], _OPTIONAL_TYPES.get(key, Any), msgspec.UNSET)
    columns = [column for column, _, _ in fields.values()]
    if not all(isinstance(c, str) and c for c in columns) or len(set(columns)) != len(columns):
        return None  # an unmapped prompt or response, one column in two roles: the scan explains those
    try:
        struct = msgspec.defstruct(
            "AlpacaRow",
            [(name, kind, default) for name, (_, kind, default) in fields.items()],
            rename={name: column for name, (column, _, _) in fields.items()},
            gc=False,  # rows of strings hold no cycles: no GC tracking, faster to build and free
        )
    except (TypeError, ValueError):
        return None
    getters = {name: operator.attrgetter(name) for name in fields}
    return _Plan(
        decoder=msgspec.json.Decoder(struct),
        prompt=getters["prompt"],
        query=getters.get("query", _always_unset),
        response=getters["response"],
        optional={fields[name][0]: getters[name] for name in fields if name in OPTIONAL_ALPACA_KEYS},
    )


def _always_unset(_row: Any) -> Any:
    return msgspec.UNSET


def _rows_pass(plan: _Plan, structs: list[Any]) -> bool:
    """The alpaca rules of ``dataset_rows`` that typing leaves: the response is not all blanks, and
    neither is the prompt, or else the query has text."""
    if any(map(str.isspace, map(plan.response, structs))):
        return False
    if not any(map(str.isspace, map(plan.prompt, structs))):
        return True  # the common case
    blank_prompt_rows = (row for row in structs if plan.prompt(row).isspace())
    return not any(_blank(plan.query(row)) for row in blank_prompt_rows)


def _blank(value: Any) -> bool:
    return not isinstance(value, str) or not value or value.isspace()


# -- the bytes ------------------------------------------------------------------------------------


def _chunks(path: Path, start: int, end: int) -> Iterator[tuple[memoryview, bool]]:
    """``(chunk, final)``: the range in pieces that end just after a newline (the final one may not).
    One reused buffer. A line longer than a chunk comes out unterminated and not final, which
    ``_one_row_per_line`` refuses: such files take the line-by-line scan."""
    buf = bytearray(2 * CHUNK_BYTES)
    view = memoryview(buf)
    kept = 0  # bytes after the last chunk's final newline, moved to the front
    remaining = end - start
    with open(path, "rb", buffering=0) as handle:
        handle.seek(start)
        while True:
            n = handle.readinto(view[kept : kept + min(CHUNK_BYTES, remaining)]) if remaining > 0 else 0
            remaining -= n
            filled = kept + n
            final = remaining <= 0
            if final and not filled:
                return
            cut = filled if final else (buf.rfind(b"\n", 0, filled) + 1 or filled)
            yield view[:cut], final
            if final:
                return
            kept = filled - cut
            buf[:kept] = view[cut:filled]


def _one_row_per_line(chunk: memoryview, final: bool) -> tuple[int, int] | None:
    """``(lines, newlines)`` when every line starts with ``{`` and ends with ``}`` (``}\\r`` in a
    CRLF file), nothing else; else None.

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
    if not closed and not final:
        return None
    starts = ends[:-1] + 1 if closed else ends + 1
    if not _all_equal(data[starts], _OPEN):
        return None
    last = ends if closed else np.append(ends, len(data))  # one past each line's last byte
    crlf = _all_equal(data[last - 1], _CR)  # then every line is at least "{\r": last - 2 is in the line
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
