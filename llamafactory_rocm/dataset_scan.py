"""Stream the rows of a JSON-array or JSON-lines file with their line numbers, in bounded memory.

``iter_rows`` reads the file in chunks, decodes them as UTF-8 (recording the line of any byte that
is not) and parses one value at a time with ``json.JSONDecoder.raw_decode`` over a sliding buffer,
so a file of a million rows is never held whole. Problems come out of the same stream as the rows,
as ``ScanError`` values, so that the caller reports everything in line order.
"""

from __future__ import annotations

import codecs
import json
import re
import sys
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

CHUNK_BYTES = 1 << 20  # big enough that per-chunk overhead vanishes, small enough to stay in cache
_UTF8_BOM = "\ufeff"
_WS = re.compile(r"[ \t\n\r]*")
_SEPARATOR = re.compile(r"[ \t\n\r]*([,\]])")
_LINE_TAIL = re.compile(r"[ \t\r]*(?:\n|\Z)")
_SLACK = 8  # an error this close to the buffer's end may be a token cut by the chunk boundary


@dataclass(frozen=True)
class ScanError:
    """A defect found while reading: ``is_row`` when it stands for a row that could not be read."""

    message: str
    is_row: bool = False


EMPTY_ARRAY = "the file is an empty JSON array ([]): there are no rows"


@dataclass
class ScanStats:
    """What the scan learnt about the file as a whole (filled in as it goes)."""

    layout: str | None = None  # "json-array" | "json-lines"; None for an empty file
    bytes_read: int = 0
    empty: bool = False
    end_line: int = 1  # JSON lines: the line the scan ended on (1 + the newlines read)


def iter_rows(
    path: Path,
    stats: ScanStats | None = None,
    *,
    chunk_bytes: int = CHUNK_BYTES,
    on_bytes: Callable[[int], None] | None = None,
    start: int = 0,
    end: int | None = None,
) -> Iterator[tuple[int, Any]]:
    """Yield ``(line, value)`` for every row, and ``(line, ScanError)`` for every defect, in order.

    ``start``/``end`` read only that byte range, as JSON lines, with line 1 at ``start`` (for a
    range cut just after a newline; see dataset_parallel).
    """
    stats = stats if stats is not None else ScanStats()
    # json's parser stops at the recursion limit, which counts the frames above it too: the same
    # depth of JSON (about 1,000) reads the same from a script, the CLI or a worker process.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(_stack_depth() + JSON_DEPTH)
    try:
        with open(path, "rb") as handle:
            source: Any = handle
            if start or end is not None:
                handle.seek(start)
                source = _Window(handle, (end if end is not None else 1 << 62) - start)
            chunks = _decoded_chunks(source, chunk_bytes, stats, on_bytes)
            layout = "json-lines" if start else None
            yield from _merge_in_line_order(_parse(chunks, stats, layout))
    finally:
        sys.setrecursionlimit(limit)


JSON_DEPTH = 1000  # Python's default recursion limit, counted from the scan rather than from the process


def _stack_depth() -> int:
    frame, depth = sys._getframe(1), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


class _Window:
    """``readinto`` of at most ``remaining`` bytes: one byte range of a file."""

    def __init__(self, handle: Any, remaining: int) -> None:
        self._handle, self._remaining = handle, remaining

    def readinto(self, view: memoryview) -> int:
        if self._remaining <= 0:
            return 0
        n = self._handle.readinto(view[: self._remaining] if len(view) > self._remaining else view)
        self._remaining -= n
        return n


# -- decoding -------------------------------------------------------------------------------------

Utf8Errors = list[tuple[int, str]]  # (character offset in the chunk's text, message)


def _decoded_chunks(
    handle: Any, chunk_bytes: int, stats: ScanStats, on_bytes: Callable[[int], None] | None
) -> Iterator[tuple[str, bool, Utf8Errors]]:
    """``(text, eof, utf8_errors)`` per chunk; a chunk ends after a newline where it has one.

    One reused buffer (``readinto``): a fresh megabyte per read costs more than the decoding here.
    Whatever follows the chunk's last newline is carried to the front of the buffer for the next
    read; that carry never exceeds one chunk, so twice the chunk is room enough.
    """
    buf = bytearray(2 * chunk_bytes + 4)
    view = memoryview(buf)
    kept = 0  # bytes carried at the front of buf
    column = 0  # bytes of the current line before the chunk (a line may span chunks)
    try:
        while True:
            n = handle.readinto(view[kept : kept + chunk_bytes])
            if on_bytes is not None and n:
                on_bytes(n)
            stats.bytes_read += n
            end = kept + n
            eof = n == 0
            cut = end if eof else _cut_point(buf, end)
            text, errors = _decode(view[:cut], column)
            yield text, eof, errors
            if eof:
                return
            newline = buf.rfind(b"\n", 0, cut)
            column = cut - (newline + 1) if newline >= 0 else column + cut
            kept = carry_to_front(buf, view, cut, end)
    finally:
        view.release()


def carry_to_front(buf: bytearray, view: memoryview, start: int, end: int) -> int:
    """Move ``buf[start:end]`` to the front of ``buf`` (a view of it may be held, so its size stays);
    returns the bytes moved. The slice assignment is a memcpy: where the two overlap, copy first."""
    kept = end - start
    buf[:kept] = bytes(view[start:end]) if kept > start else view[start:end]
    return kept


def _cut_point(buf: bytearray, end: int) -> int:
    """After the last newline; in a line longer than the chunk, before a split UTF-8 sequence."""
    newline = buf.rfind(b"\n", 0, end)
    if newline >= 0:
        return newline + 1
    # Step back over continuation bytes (0b10xxxxxx) to the lead byte of a sequence that may be cut.
    for back in range(1, min(4, end) + 1):
        byte = buf[end - back]
        if byte & 0xC0 != 0x80:
            return end - back if byte >= 0xC0 else end
    return end


def _decode(data: memoryview, column: int) -> tuple[str, Utf8Errors]:
    try:
        return str(data, "utf-8"), []
    except UnicodeDecodeError:
        return _decode_with_errors(bytes(data), column)


def _decode_with_errors(data: bytes, first_column: int) -> tuple[str, Utf8Errors]:
    """Decode, replacing bad bytes with U+FFFD, and note where each bad byte is."""
    view = memoryview(data)
    parts: list[str] = []
    errors: Utf8Errors = []
    offset = 0  # characters decoded so far
    start = 0
    while start < len(data):
        try:
            text, _ = codecs.utf_8_decode(view[start:], "strict", True)
            parts.append(text)
            break
        except UnicodeDecodeError as err:
            bad = start + err.start
            good = codecs.utf_8_decode(view[start:bad], "strict", True)[0]
            parts += [good, "\ufffd"]
            offset += len(good)
            line_start = data.rfind(b"\n", 0, bad) + 1
            column = bad - line_start + 1 + (first_column if line_start == 0 else 0)
            errors.append((offset, _utf8_message(data[bad], column)))
            offset += 1
            start += err.end
    return "".join(parts), errors


def _utf8_message(byte: int, column: int) -> str:
    return (
        f"not UTF-8: byte 0x{byte:02X} at byte {column} of the line (the file looks Latin-1 or "
        "Windows-1252 encoded); re-save it as UTF-8"
    )


def _place(errors: Utf8Errors, buf: str, base: int, line: int) -> _Utf8Batch:
    """Line numbers for a chunk's UTF-8 errors, its text starting at ``buf[base]`` and ``buf[0]``
    lying on ``line``."""
    placed: list[tuple[int, ScanError]] = []
    at = 0
    for offset, message in errors:
        index = base + offset
        line += buf.count("\n", at, index)
        at = index
        placed.append((line, ScanError(message)))
    return _Utf8Batch(placed)


def _merge_in_line_order(events: Iterator[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
    """The parser sends a chunk's UTF-8 errors before its rows; hold each until the rows of its line
    have gone, so that the order does not depend on where the chunks were cut. One per line."""
    held: list[tuple[int, Any]] = []
    last = 0  # line of the last UTF-8 error kept
    for line, value in events:
        if type(value) is _Utf8Batch:
            for error in value.errors:
                if error[0] != last:
                    held.append(error)
                    last = error[0]
            continue
        while held and held[0][0] < line:
            yield held.pop(0)
        yield line, value
    yield from held


@dataclass(frozen=True)
class _Utf8Batch:
    errors: list[tuple[int, ScanError]]


# -- parsing --------------------------------------------------------------------------------------


def _parse(chunks: Iterator[tuple[str, bool, Utf8Errors]], stats: ScanStats, layout: str | None) -> Iterator[Any]:
    """Find the layout from the first character (unless given), then hand the chunks to its parser."""
    buf = ""
    bom: bool | None = None
    for text, eof, errors in chunks:
        if bom is None and text:
            bom = text.startswith(_UTF8_BOM)
            if bom:
                text = text[1:]
                errors = [(offset - 1, message) for offset, message in errors]
        if errors:
            yield 0, _place(errors, buf + text, len(buf), 1)
        buf += text
        start = _WS.match(buf).end()
        if start == len(buf) and not eof:
            continue  # only whitespace so far
        line = 1 + buf.count("\n", 0, start)
        head = buf[start : start + 1]
        if head == "[" and layout is None:
            stats.layout = "json-array"
            if bom:  # datasets' JSON-lines reader skips a byte-order mark; its JSON-array path fails on it
                yield line, ScanError(_BOM_MESSAGE)
            yield from _parse_array(buf[start:], line, eof, chunks)
        elif head:
            stats.layout = "json-lines"
            yield from _parse_lines(buf[start:], line, eof, chunks, stats)
        else:
            stats.empty = True
        return


_BOM_MESSAGE = (
    "the file starts with a UTF-8 byte-order mark, which the loader rejects in a JSON array; "
    "re-save it as UTF-8 without BOM"
)


def _as_decode_error(caught: Exception, buf: str, pos: int) -> json.JSONDecodeError:
    """json raises RecursionError on a value nested about 1,000 levels deep, and ValueError on an
    integer longer than Python converts (4,300 digits): bad rows like any other."""
    if isinstance(caught, json.JSONDecodeError):
        return caught
    if isinstance(caught, RecursionError):
        return json.JSONDecodeError("nested too deeply for Python's json (about 1,000 levels)", buf, pos)
    return json.JSONDecodeError(_TOO_MANY_DIGITS, buf, pos)


_TOO_MANY_DIGITS = (
    f"an integer of more than {sys.get_int_max_str_digits():,} digits, which Python's json does not read (pyarrow "
    "reads it as inf, pandas stops at it). Write it as a string"
)


def _needs_more(err: json.JSONDecodeError, buf: str, eof: bool) -> bool:
    """Was the value cut by the end of the buffer (read more), rather than malformed?"""
    return not eof and (err.pos >= len(buf) - _SLACK or err.msg.startswith("Unterminated string"))


def _refill(buf: str, pos: int, line: int, chunks: Iterator) -> tuple[str, bool, _Utf8Batch | None]:
    """The unparsed rest of the buffer plus the next chunk; ``line`` is the line of ``buf[pos]``."""
    text, eof, errors = next(chunks)
    rest = buf[pos:]
    new = rest + text
    return new, eof, (_place(errors, new, len(rest), line) if errors else None)


def _parse_lines(buf: str, line: int, eof: bool, chunks: Iterator, stats: ScanStats) -> Iterator[Any]:
    """One JSON value per line; a bad line is reported and skipped, so every bad line is found."""
    too_big: list[str] = []  # decimals of the current row beyond a double (pyarrow stops at them)
    decode = json.JSONDecoder(parse_float=partial(_decimal, too_big)).raw_decode
    ws, tail = _WS.match, _LINE_TAIL.match
    suspects = _lone_escapes(buf)
    pos = 0  # where the next value may start; ``line`` is the line of ``pos``
    skipping = False  # inside a bad line that goes on past the buffer
    tail_due = False  # a value ended at the buffer's end: what follows it on its line is unseen
    while True:
        n = len(buf)
        find = buf.find
        if skipping:
            nl = find("\n")
            pos, skipping = (n, not eof) if nl < 0 else (nl + 1, False)
            line += 0 if nl < 0 else 1
        while pos < n:
            if tail_due:
                pos, line, skipping, tail_due = yield from _line_tail(buf, pos, line, eof)
                continue
            if buf[pos] != "{":  # rare: blank lines, indentation, or a row that is not an object
                start = ws(buf, pos).end()
                line += buf.count("\n", pos, start)
                pos = start
                if pos == n:
                    break
            try:
                value, end = decode(buf, pos)
            except (ValueError, RecursionError) as caught:  # JSONDecodeError is a ValueError
                too_big.clear()
                err = _as_decode_error(caught, buf, pos)
                if _needs_more(err, buf, eof):
                    break
                yield line, ScanError(_malformed(err, buf, eof), is_row=True)
                nl = find("\n", pos)
                if nl < 0:
                    pos, skipping = n, not eof
                    break
                pos = nl + 1
                line += 1
                continue
            if end == n and not eof:
                too_big.clear()
                break  # a number cut by the chunk's end parses too: wait for the rest
            if too_big or (suspects and _within(suspects, pos, end)):  # rare: values pyarrow cannot hold
                problem = _unloadable_in_lines(too_big, value)
                too_big.clear()
                if problem is not None:
                    value = ScanError(problem, is_row=True)
            yield line, value
            if find("\n", pos) == end:  # the common case: the value fills its line (memchr, not count)
                line += 1
                pos = end + 1
                continue
            after = tail(buf, end)
            if after is None or (after.end() == n and not eof and not buf.endswith("\n")):
                line += buf.count("\n", pos, end)
                pos, tail_due = end, True  # rare: checked on its own, across a refill if need be
                continue
            line += buf.count("\n", pos, after.end())
            pos = after.end()
        if eof:
            stats.end_line = line
            return
        buf, eof, errors = _refill(buf, pos, line, chunks)
        suspects = _lone_escapes(buf)
        pos = 0
        if errors:
            yield 0, errors


def _line_tail(buf: str, pos: int, line: int, eof: bool) -> Iterator[Any]:
    """After a value: only blanks may follow on its line. Returns (pos, line, skipping, tail_due)."""
    n = len(buf)
    after = _LINE_TAIL.match(buf, pos)
    if after is not None:
        if after.end() == n and not eof and not buf.endswith("\n"):
            return n, line, False, True
        return after.end(), line + buf.count("\n", pos, after.end()), False, False
    found = buf[_WS.match(buf, pos).end()]  # one character: all that every chunking is sure to show
    yield line, ScanError(f"unexpected {found!r} after the row on this line (JSON lines hold one object per line)")
    nl = buf.find("\n", pos)
    if nl < 0:
        return n, line, not eof, False
    return nl + 1, line + 1, False, False


def _parse_array(buf: str, line: int, eof: bool, chunks: Iterator) -> Iterator[Any]:
    """``[ value, value, ... ]``: a malformed value ends the scan, as there is no sure place to resume."""
    too_big: list[str] = []  # integers of the current row beyond 64 bits (pandas stops at them)
    decode = json.JSONDecoder(parse_int=partial(_integer, too_big)).raw_decode
    suspects = _lone_escapes(buf)
    ws, sep = _WS.match, _SEPARATOR.match
    pos = 1  # past "["
    expect = "first"  # "first" (a value or "]"), "value" (after ","), "separator" ("," or "]")
    while True:
        n = len(buf)
        while pos < n:
            start = ws(buf, pos).end()
            if start == n:
                break
            if expect == "separator":
                found = sep(buf, pos)
                if found is None:
                    line += buf.count("\n", pos, start)
                    yield line, ScanError(f"expected ',' or ']' after the row before, found {buf[start]!r}")
                    yield from _drain(buf, start, line, eof, chunks)
                    return
                line += buf.count("\n", pos, found.end())
                pos = found.end()
                if found.group(1) == "]":
                    yield from _after_array(buf, pos, line, eof, chunks)
                    return
                expect = "value"
                continue
            line += buf.count("\n", pos, start)
            pos = start
            if expect == "first" and buf[pos] == "]":
                yield line, ScanError(EMPTY_ARRAY)
                yield from _after_array(buf, pos + 1, line, eof, chunks)
                return
            try:
                value, end = decode(buf, pos)
            except (ValueError, RecursionError) as caught:  # JSONDecodeError is a ValueError
                too_big.clear()
                err = _as_decode_error(caught, buf, pos)
                if _needs_more(err, buf, eof):
                    break
                yield line, ScanError(_malformed(err, buf, eof), is_row=True)
                yield from _drain(buf, pos, line, eof, chunks)
                return
            if end == n and not eof:
                too_big.clear()
                break  # a number cut by the chunk's end parses too: wait for the rest
            if too_big or (suspects and _within(suspects, pos, end)):  # rare: values pandas cannot hold
                problem = _unloadable_in_array(too_big, value)
                too_big.clear()
                if problem is not None:
                    value = ScanError(problem, is_row=True)
            yield line, value
            line += buf.count("\n", pos, end)
            pos = end
            expect = "separator"
        if eof:
            yield line, ScanError(_unterminated_array(expect))
            return
        buf, eof, errors = _refill(buf, pos, line, chunks)
        suspects = _lone_escapes(buf)
        pos = 0
        if errors:
            yield 0, errors


# -- values that parse but that LLaMA-Factory's loader cannot hold (datasets 4.0.0, pyarrow 26.0.1,
# pandas 3.1.1; each case loaded for real in tests/test_dataset_types.py) ---------------------------

# JSON lines (pyarrow) stop at a decimal whose exponent passes 308 plus its digits after the point,
# as far as the first 18 significant digits (1e309, 0e999, 111111111111111111.5e309; not 1.5e309,
# which reads as inf) and at a UTF-16 surrogate escape without its other
# half, and read an integer beyond int64 as a double (dataset_types). A JSON array (pandas) reads
# 1e400 as inf, but stops at an integer beyond int64 (one beyond it stands alone only at the top
# level, positive, with no null in its column), and at a lone surrogate, or drops it from the text
# without a word (a high one before anything but an escape).
# Surrogate escapes, a pair (an emoji: \\ud83d\\ude00) as one match, a lone half as a match of 6.
_SURROGATE_ESCAPES = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}(?:\\u[dD][c-fC-F][0-9a-fA-F]{2})?|\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # what is left in a string after a pair is joined
_INTEGER_RANGE = range(-(2**63), 2**63)
_MAX_EXPONENT = 308  # rapidjson's, which pyarrow parses with: plus the digits after the point it counts
_SIGNIFICANT_DIGITS = 18  # past these, rapidjson skips the digits after the point without counting them
_INFINITE = (float("inf"), float("-inf"))
_DECIMAL_TOO_BIG = (
    "the number {} is beyond what a double holds: LLaMA-Factory's loader stops at this row (pyarrow: "
    "Number too big to be stored in double). Write a smaller number, or write it as a string"
)
_INTEGER_TOO_BIG = (
    "the integer {} does not fit in int64: LLaMA-Factory's loader cannot read this JSON array (pandas "
    "stops at it; datasets then reports pyarrow's 'Column() changed from object to array'). Write it "
    "as a string, or the file as JSON lines"
)
_SURROGATE = "a string here holds {} without the other half of its UTF-16 surrogate pair: LLaMA-Factory's loader {}"
_SURROGATE_LINES = (
    "stops at this row (pyarrow: The surrogate pair in string is invalid). Write the character itself, or "
    "both halves of the pair"
)
_SURROGATE_ARRAY = (
    "stops at it or drops it from the text (pandas reads a JSON array). Write the character itself, or "
    "both halves of the pair"
)


def _lone_escapes(buf: str) -> list[int]:
    """Where a buffer may hold a lone surrogate escape, in order: a half without the other, or a pair
    after a backslash (which may be escaping it). Empty for the common buffer: one memchr where it
    has no backslash, and a pair is no suspect, so emoji cost nothing more."""
    if buf.find("\\") < 0:
        return []
    found = _SURROGATE_ESCAPES.finditer(buf)
    return [m.start() for m in found if m.end() - m.start() == 6 or buf[m.start() - 1] == "\\"]


def _within(positions: list[int], start: int, end: int) -> bool:
    i = bisect_left(positions, start)
    return i < len(positions) and positions[i] < end


def _decimal(too_big: list[str], text: str) -> float:
    """json's hook for every decimal: notes one that pyarrow refuses by its exponent as written. Only
    an infinite one: msgspec (the fast path) reads a zero with a huge exponent (0e999) as 0.0, and the
    two must agree; so that one is not caught (docs/troubleshooting.md)."""
    number = float(text)
    if number in _INFINITE:
        mantissa, _, exponent = text.replace("E", "e").partition("e")
        digits = exponent.lstrip("+").lstrip("0") or "0"
        integer, _, fraction = mantissa.lstrip("-").partition(".")
        limit = _MAX_EXPONENT + _counted_fraction_digits(integer, fraction)
        if not digits.startswith("-") and (len(digits) > len(str(limit)) or int(digits) > limit):
            too_big.append(text)
    return number


def _counted_fraction_digits(integer: str, fraction: str) -> int:
    """The digits after the point that rapidjson counts against the exponent: only while the number
    has fewer than 18 significant digits (a lone 0 before the point counts as one, zeros after it do
    not until a nonzero digit). Fitted to pyarrow: tests/test_dataset_types.py holds it to pyarrow's
    own verdict on thousands of numbers near the limit."""
    started = integer != "0"
    significant = len(integer) if started else 1
    counted = 0
    for digit in fraction:
        if significant >= _SIGNIFICANT_DIGITS:
            break
        counted += 1
        if started or digit != "0":
            started, significant = True, significant + 1
    return counted


def _integer(too_big: list[str], text: str) -> int:
    number = int(text)
    if number not in _INTEGER_RANGE:
        too_big.append(text)
    return number


def _unloadable_in_lines(too_big: list[str], row: Any) -> str | None:
    if too_big:
        return _DECIMAL_TOO_BIG.format(_shown(too_big[0]))
    return _lone_surrogate(row, _SURROGATE_LINES)


def _unloadable_in_array(too_big: list[str], row: Any) -> str | None:
    if too_big:
        return _INTEGER_TOO_BIG.format(_shown(too_big[0]))
    return _lone_surrogate(row, _SURROGATE_ARRAY)


def _lone_surrogate(row: Any, outcome: str) -> str | None:
    for text in _strings(row):
        found = _LONE_SURROGATE.search(text)
        if found is not None:
            return _SURROGATE.format(f"\\u{ord(found.group()):04x}", outcome)
    return None


def _strings(value: Any) -> Iterator[str]:
    """Every key and string in a value (a stack: a row may nest deeper than Python recurses)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is str:
            yield item
        elif type(item) is dict:
            yield from item.keys()
            stack.extend(item.values())
        elif type(item) is list:
            stack.extend(item)


def _shown(literal: str) -> str:
    if len(literal) <= 40:
        return literal
    return f"{literal[:20]}...{literal[-8:]} ({sum(map(str.isdigit, literal)):,} digits)"


def _after_array(buf: str, pos: int, line: int, eof: bool, chunks: Iterator) -> Iterator[Any]:
    """Only whitespace may follow the closing bracket."""
    while True:
        start = _WS.match(buf, pos).end()
        line += buf.count("\n", pos, start)
        if start < len(buf):
            yield line, ScanError("extra data after the closing ']' of the array")
            yield from _drain(buf, start, line, eof, chunks)
            return
        if eof:
            return
        buf, eof, errors = _refill(buf, len(buf), line, chunks)
        pos = 0
        if errors:
            yield 0, errors


def _drain(buf: str, pos: int, line: int, eof: bool, chunks: Iterator) -> Iterator[Any]:
    """After an error that ends the parse: read on for bad bytes only, so that what is reported
    does not depend on where the chunks happened to be cut."""
    while not eof:
        line += buf.count("\n", pos)
        buf, eof, errors = _refill(buf, len(buf), line, chunks)
        pos = 0
        if errors:
            yield 0, errors


def _unterminated_array(expect: str) -> str:
    if expect == "separator":
        return "the JSON array is not closed: the file ends without ']' (truncated?)"
    return "the file ends inside the JSON array, after a ',' (truncated?)"


def _malformed(err: json.JSONDecodeError, buf: str, eof: bool) -> str:
    """One line on a value that does not parse; a cut-off last row is called what it is."""
    # The same test as _needs_more, at the end of the file: so the verdict is the same however it was chunked.
    cut_off = eof and (err.pos >= len(buf) - _SLACK or err.msg.startswith("Unterminated string"))
    if cut_off:
        return f"truncated: the last row is cut off ({err.msg})"
    if err.msg == _TOO_MANY_DIGITS:
        return err.msg
    return f"malformed JSON: {err.msg}"
