"""Check a big JSON-lines file in several processes: byte ranges cut just after a newline, each
checked by a forked worker, the results put back together in file order.

Each range is first offered to the fast path (``dataset_fast``: proven clean at C speed, or not); a
range it cannot prove is scanned line by line. Parsing is what costs, so on N cores this is close
to N times faster. Only JSON lines split safely at newlines; a JSON array is scanned in one process.
A range scanned line by line starts reading at its first byte, as if a row began there: a JSON
value written across the newlines where ranges meet (legal in one process, which reads a value
across lines) reads differently here. One process (``jobs=1``) has no such seams.
Column types (``dataset_types``) are checked per range against the range's own first rows; where a
range's types clash with those of the ranges before it, or a row strays within a range (its reason
names a line of the range, not of the file), the caller checks the file again in one pass.
Workers are forked (no re-import), and only where fork exists; a process that may hold threads
(a training process, a loaded tokenizer) keeps to one process, which the callers decide.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from .dataset_entry import RowMapping
from .dataset_rows import make_rules
from .dataset_scan import ScanError, ScanStats, iter_rows
from .dataset_types import ColumnTypes

MIN_PARALLEL_BYTES = 64 << 20  # below this, forking costs more than it saves
# A few ranges per worker, as many for each: a range has a fixed cost (its first chunk is learnt
# as plain JSON), the last one to end sets the time, and one that holds a defect is scanned line by
# line. On 2 cores, 342 MB in 6 ranges took 0.31 s against 0.34 s in 11 of 32 MB (bench_validate).
RANGES_PER_JOB = 3
RANGE_BYTES = 128 << 20  # at most: progress as each one ends, and a defect's scan stays short


@dataclass
class RangeResult:
    """One byte range's counts; lines are relative to the range's first line."""

    good: int = 0
    bad_count: int = 0
    not_rows: int = 0
    bad_rows: list[tuple[int, str]] = field(default_factory=list)
    unseen: set[str] = field(default_factory=set)
    types: ColumnTypes = field(default_factory=ColumnTypes)  # its rows' column types, lines as above
    type_conflicts: int = 0  # rows that stray from a column's type (their reasons name range lines)
    newlines: int = 0
    empty: bool = False
    layout: str | None = None


def default_jobs() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, 8))


def can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def is_json_lines(path: Path) -> bool:
    """The first character that is not a blank (or a byte-order mark) is not ``[``."""
    with open(path, "rb") as handle:
        head = handle.read(4096).lstrip(b"\xef\xbb\xbf").lstrip(b" \t\r\n")
    return head[:1] not in (b"[", b"")


def range_count(size: int, jobs: int) -> int:
    """``RANGES_PER_JOB`` per worker, more where a range would pass ``RANGE_BYTES``; a multiple of
    ``jobs``, so that ranges of about one size share out evenly as the workers free up (``plan_ranges``
    may merge a few in a file of very long lines)."""
    parts = max(RANGES_PER_JOB * jobs, -(-size // RANGE_BYTES))
    return -(-parts // jobs) * jobs


def plan_ranges(path: Path, size: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` byte ranges covering the file, each starting just after a newline."""
    cuts = [0]
    with open(path, "rb") as handle:
        for k in range(1, parts):
            handle.seek(max(size * k // parts, cuts[-1]))
            handle.readline()  # to the end of the line the guess fell into
            offset = handle.tell()
            if cuts[-1] < offset < size:
                cuts.append(offset)
    cuts.append(size)
    return list(pairwise(cuts))


def scan_range(task: tuple[str, int, int, RowMapping, int, bool]) -> RangeResult:
    """One byte range: proven clean by the fast path (when ``fast``), else the same rules and loop
    as a one-process scan."""
    from .dataset_fast import prove_clean  # loaded by scan_parallel before the fork

    path, start, end, mapping, max_errors, fast = task
    rules = make_rules(mapping)
    clean = prove_clean(Path(path), start, end, mapping) if fast else None
    if clean is not None:
        seen = clean.types.seen_columns()
        unseen = {column for column in rules.unseen if column not in seen}
        return RangeResult(clean.rows, unseen=unseen, types=clean.types, newlines=clean.newlines, layout="json-lines")
    check, types = rules.check, rules.types
    stats = ScanStats()
    result = RangeResult()
    for line, value in iter_rows(Path(path), stats, start=start, end=end):
        reason = check(value)
        if reason is None:
            reason = types.conflict(value, line)
            result.type_conflicts += reason is not None
        if reason is None:
            result.good += 1
            continue
        result.bad_count += 1
        if type(value) is ScanError and not value.is_row:
            result.not_rows += 1
        if len(result.bad_rows) < max_errors:
            result.bad_rows.append((line, reason))
    result.unseen = set(rules.unseen)
    result.types = types
    result.newlines = stats.end_line - 1
    result.empty, result.layout = stats.empty, stats.layout
    return result


def scan_parallel(
    path: Path,
    mapping: RowMapping,
    max_errors: int,
    jobs: int,
    on_bytes: Callable[[int], None] | None = None,
    *,
    fast: bool = True,
) -> Iterator[tuple[int, RangeResult]]:
    """``(line offset, result)`` per range, in file order: add the offset to the range's lines."""
    size = path.stat().st_size
    ranges = plan_ranges(path, size, range_count(size, jobs))
    tasks = [(str(path), start, end, mapping, max_errors, fast) for start, end in ranges]
    from . import dataset_fast  # noqa: F401 (numpy and msgspec load here once, not in every forked worker)

    offset = 0
    with multiprocessing.get_context("fork").Pool(min(jobs, len(tasks))) as pool:
        for (start, end), result in zip(ranges, pool.imap(scan_range, tasks), strict=True):
            if on_bytes is not None:
                on_bytes(end - start)
            yield offset, result
            offset += result.newlines
