"""One JSON type per column: what LLaMA-Factory's loader needs of a dataset file beyond each row.

``datasets.load_dataset("json")`` parses JSON lines with pyarrow, 10 MB at a time, and gives every
column one type (every field of an object column, and the elements of a list column, one each):

- The first row that disagrees with its column's type stops the load, after the launch, with
  ``JSON parse error: Column(/id) changed from number to string in row 1``. A JSON array goes
  through pandas instead and fails on the same rows. null fits any column, integers and decimals
  are both numbers, and objects may differ in which keys they have.
- The first batch (the first 10 MB of the first file that is not 0 bytes, to the end of its line)
  fixes the columns and their types for the rest, batch by batch and file by file. A column (or an
  object's key) that first appears after it stops the load (``Couldn't cast``), and so does a value
  in a column that was null all through it, elements in lists that were all empty in it, or a
  decimal such as 2.5 in a column of whole numbers in it (``Float value 2.5 was truncated
  converting to int64``).

One type per column is asked of the whole dataset: that is what a batch needs, and what a folder
needs when its files load in several processes (``preprocessing_num_workers``). Only a change that
falls exactly between batches, or files loaded by one process, is cast to the first type instead.

Measured with datasets 4.0.0 and pyarrow 26.0.1; ``tests/test_dataset_types.py`` loads each case
with the real loader and checks that this module agrees. Not modelled: a key twice in one object.

A column whose strings are all dates in a batch (``2024-01-01``, ``2024-01-01T10:00:00+01:00``) is
read as timestamps: after a first batch of only dates, the first string that is not one stops the
load (``Failed to parse string: 'n/a' as a scalar of type timestamp[s]``). pandas, which reads a
JSON array (``json_lines`` False), keeps dates as strings, which are cast to a first batch's
timestamps if they have no zone; it converts columns named like dates by rules of its own: not
modelled. pandas also reads a top-level column of whole decimals (4.0, 5.0) as int64, where
pyarrow makes it double; inside lists and objects they stay doubles.

Files that load in parallel (a folder, with ``preprocessing_num_workers``) load in runs of
consecutive files, one run a process (``loader_runs``). Each run gets the types of its own first
batch, which fix the rest of the run (``late_rows`` of the run's own types), and datasets cannot
merge int64 with double, or timestamps with strings: ``merge_conflicts`` compares each run's first
batch (``first_batch_kinds``) with the first run's.

An integer beyond int64 reads as a double, like a decimal that is not whole: after a first batch of
whole numbers it stops the load in the same way (``Float value 1e+20 was truncated converting to
int64``). Values that no batch can hold at all (1e400, lone surrogates; for a JSON array, integers
beyond 64 bits) are the scan's to report (``dataset_scan``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import repeat
from typing import Any

ITEM = 0  # the step into a list's elements: an int, so that it never equals an object's key
Path = tuple[str | int, ...]  # ("messages", ITEM, "from") is pyarrow's /messages/[]/from
Where = tuple[int, int]  # (file number, in load order; line)

LOADER_BATCH_BYTES = 10 << 20  # datasets' JsonConfig.chunksize (datasets 4.0.0)
# Column paths kept at most: keys used as ids (a new key every row) would otherwise grow without bound.
MAX_COLUMN_PATHS = 10_000
NULL = "null"  # a column with only nulls so far: the first other type decides it
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # pyarrow reads an integer outside these as a double

# The strings pyarrow's JSON reader takes for timestamp[s] (ISO 8601: a real date, then optionally
# T or a space, hh, :mm, :ss, and a zone Z, +hh, +hhmm or +hh:mm); anything else is a string.
# tests/test_dataset_types.py holds this against pyarrow's own inference, string by string.
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)"
_MONTH_DAY = (
    r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
_HOUR, _MINUTE = r"(?:[01][0-9]|2[0-3])", r"[0-5][0-9]"
_TIME = rf"(?:[T ]{_HOUR}(?::{_MINUTE}(?::{_MINUTE})?)?(?:Z|[+-]{_HOUR}(?::?{_MINUTE})?)?)?"
TIMESTAMP_PATTERN = rf"^(?:[0-9]{{4}}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29){_TIME}\Z"  # searched, as msgspec does
is_timestamp = re.compile(TIMESTAMP_PATTERN).search
_KIND = {str: "string", int: "number", float: "number", bool: "boolean", dict: "object", list: "array"}
_ADMITS = {"string": (str,), "number": (int,), "boolean": (bool,), "object": (dict,), "array": (list,), NULL: ()}


@dataclass
class Column:
    """One column path and the first row that had it at all, with a value (of ``kind``), with a
    decimal, with a number that int64 cannot hold, and with a string that is not a date."""

    appeared: Where
    kind: str = NULL
    typed: Where | None = None
    decimal: Where | None = None
    fraction: Where | None = None
    undated: Where | None = None

    @property
    def dated(self) -> bool:
        """Strings, every one a date so far: pyarrow reads them as timestamps."""
        return self.kind == "string" and self.undated is None

    def admits(self) -> tuple[type, ...]:
        """The Python types (as json.loads gives them) that a row may hold here with nothing new to
        record: a float is news until a number column has had a fraction."""
        if self.kind == "number" and self.fraction is not None:
            return (int, float)
        return _ADMITS[self.kind]


class _Node:
    """One column path, as a tree for ``_known``: its admitted types, its keys, its elements;
    ``dated``: a string is admitted only if it is a date (it admits no type outright)."""

    __slots__ = ("admits", "dated", "item", "keys")

    def __init__(self) -> None:
        self.admits: tuple[type, ...] = ()
        self.dated = False
        self.keys: dict[str, _Node] = {}
        self.item: _Node | None = None


class ColumnTypes:
    """Every column path the rows have had so far: its type, and where each thing was first seen."""

    def __init__(self) -> None:
        self.columns: dict[Path, Column] = {}
        self.files: list[str | None] = []  # file labels in load order (None: the only file)
        self.one_batch = True  # one file that the loader parses at once: say so in reasons (conflict_reason)
        self.json_lines = True  # pyarrow reads JSON lines (dates as timestamps); pandas a JSON array (no dates)
        self.overflow: Where | None = None  # the first row with a path past MAX_COLUMN_PATHS
        self._root = _Node()
        self._nodes: dict[Path, _Node] = {(): self._root}
        self._dated: set[Path] = set()  # the paths of columns of dates so far

    def __repr__(self) -> str:
        return f"ColumnTypes({self.columns!r})"

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (back from a worker) without the tree, which is as deep as the data: pickle recurses."""
        return {
            "columns": self.columns,
            "files": self.files,
            "one_batch": self.one_batch,
            "overflow": self.overflow,
            "json_lines": self.json_lines,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self.files, self.one_batch, self.overflow = list(state["files"]), state["one_batch"], state["overflow"]
        self.json_lines = state["json_lines"]
        for path, column in state["columns"].items():  # parents first: the order they were recorded in
            self._put(path, column)  # shared safely: a Column is replaced on change, never edited

    def file_number(self, file: str | None) -> int:
        """The number of a file in load order; call it as each file starts."""
        if file not in self.files:
            self.files.append(file)
        return self.files.index(file)

    def copy(self) -> ColumnTypes:
        other = ColumnTypes()
        other.__setstate__(self.__getstate__())
        return other

    def _put(self, path: Path, column: Column) -> None:
        self.columns[path] = column
        node = self._nodes.get(path)
        if node is None:  # its parent is in: a path is always recorded before the paths below it
            node = self._nodes[path] = _Node()
            parent = self._nodes[path[:-1]]
            if isinstance(path[-1], str):
                parent.keys[path[-1]] = node
            else:
                parent.item = node
        node.dated = column.dated
        node.admits = () if node.dated else column.admits()
        if node.dated:
            self._dated.add(path)
        else:
            self._dated.discard(path)

    # -- one row at a time (the scan, and chunks the fast path learns from) ----------------------

    def conflict(self, row: dict[str, Any], line: int, file: str | None = None) -> str | None:
        """Record a row's types, or (recording nothing) say why the loader will stop at it."""
        try:
            # A JSON array's strings (pandas) fit a column of dates by a rule of their own: walked.
            if (self.json_lines or not self._dated) and _known(self._root, row):
                return None  # the common case: no key, type or decimal that earlier rows did not have
        except RecursionError:
            pass  # nested deeper than Python recurses: the walk below has no such limit

        where = (self.file_number(file), line)
        changes: dict[Path, dict[str, Any]] = {}
        for path, value in _walk(row):
            reason = self._change(path, value, where, changes)
            if reason is not None:
                return reason
        room = MAX_COLUMN_PATHS - len(self.columns)
        for path, change in changes.items():
            column = self.columns.get(path)
            if column is not None:
                self._put(path, replace(column, **change))
            elif room > 0:
                self._put(path, Column(**change))
                room -= 1
            elif self.overflow is None:  # memory stays bounded: what is below this is not checked
                self.overflow = where
        return None

    def _change(self, path: Path, value: Any, where: Where, changes: dict[Path, dict[str, Any]]) -> str | None:
        column = self.columns.get(path)
        change = changes.get(path)
        if change is None:
            change = changes[path] = {} if column is not None else {"appeared": where}
        kind = NULL if value is None else _KIND[type(value)]
        known = change.get("kind", column.kind if column is not None else NULL)
        if kind == NULL:
            return None
        if known == NULL:
            change.update(kind=kind, typed=where)
        elif kind != known:
            first = column if column is not None and column.kind == known else None  # None: this row
            return conflict_reason(path, kind, known, first, self.files, self.one_batch)
        if type(value) is float or (type(value) is int and not fits_int64(value)):
            whole = fits_int64(value)
            int64 = whole and not self.json_lines and len(path) == 1  # pandas: whole decimals in a column
            if (column is None or column.decimal is None) and "decimal" not in change and not int64:
                change["decimal"] = where
            if (column is None or column.fraction is None) and "fraction" not in change and not whole:
                change["fraction"] = where
        elif (
            kind == "string"
            and (column is None or column.undated is None)
            and "undated" not in change
            and not self._still_dated(column, value)
        ):
            change["undated"] = where  # the column is no longer all dates
        return None

    def _still_dated(self, column: Column | None, value: str) -> bool:
        """A string that keeps its column one of dates: any date in JSON lines; in a JSON array (a
        string to pandas) only a date without a zone, and only in a column that earlier JSON lines
        made dates, which it is cast to. A column that the array types is strings."""
        if self.json_lines:
            return is_timestamp(value) is not None
        return column is not None and column.dated and _casts_to_timestamp(value)

    # -- putting ranges and files together --------------------------------------------------------

    def disagreement(self, other: ColumnTypes, line_offset: int = 0) -> str | None:
        """Why ``other`` (the types of the rows after these) cannot follow these rows, or None."""
        for path, theirs in other.columns.items():
            ours = self.columns.get(path)
            if ours is not None and NULL not in (ours.kind, theirs.kind) and ours.kind != theirs.kind:
                assert theirs.typed is not None
                reason = conflict_reason(path, theirs.kind, ours.kind, ours, self.files)
                return f"line {theirs.typed[1] + line_offset}: {reason}"
        return None

    def absorb(self, other: ColumnTypes, line_offset: int = 0, file: str | None = None) -> None:
        """Take in the types of one file's rows after these, or of a range of it (``other`` numbers
        them from line 1; call ``disagreement`` first)."""
        number = self.file_number(file)

        def shift(where: Where | None) -> Where | None:
            return None if where is None else (number, where[1] + line_offset)

        skipped = [shift(other.overflow)] if other.overflow is not None else []
        for path, theirs in other.columns.items():
            ours = self.columns.get(path)
            if ours is None and (len(self.columns) >= MAX_COLUMN_PATHS or path[:-1] not in self._nodes):
                skipped.append(shift(theirs.appeared))  # as in conflict: bounded, and said so
                continue
            merged = ours or Column(appeared=shift(theirs.appeared))  # type: ignore[arg-type]
            if merged.kind == NULL and theirs.kind != NULL:
                merged = replace(merged, kind=theirs.kind, typed=shift(theirs.typed))
            if merged.decimal is None and theirs.decimal is not None:
                merged = replace(merged, decimal=shift(theirs.decimal))
            if merged.fraction is None and theirs.fraction is not None:
                merged = replace(merged, fraction=shift(theirs.fraction))
            if merged.undated is None and theirs.undated is not None:
                merged = replace(merged, undated=shift(theirs.undated))
            self._put(path, merged)
        if self.overflow is None and skipped:
            self.overflow = min(where for where in skipped if where is not None)

    # -- the loader's first batch -----------------------------------------------------------------

    def late_rows(
        self, first_batch_lines: int | None, batch_of: str | None = None, batch_file: int = 0
    ) -> list[tuple[Where, str]]:
        """``(where, reason)`` for each row where the loader stops because its first batch (the first
        ``first_batch_lines`` lines of the first file, ``batch_file``, the first that is not 0 bytes;
        None: all of it) fixed another type: the first row of each such column, one reason a row, in
        load order. ``batch_of``: what to call that file in reasons (default: its label)."""

        def in_first_batch(where: Where | None) -> bool:
            return (
                where is not None
                and where[0] == batch_file
                and (first_batch_lines is None or where[1] <= first_batch_lines)
            )

        batch = f"the first {first_batch_lines} lines" if first_batch_lines is not None else "all lines"
        if batch_of is None and batch_file < len(self.files) and self.files[batch_file]:
            batch_of = self.files[batch_file]
        if batch_of:
            batch += f" of {batch_of}"
        found: dict[Where, str] = {}
        stopped: set[Path] = set()  # columns already reported: nothing below them is news
        for path in sorted(self.columns, key=lambda p: (len(p), pyarrow_path(p))):
            if any(path[:depth] in stopped for depth in range(1, len(path))):
                stopped.add(path)
                continue
            column = self.columns[path]
            late = _late(path, column, in_first_batch, batch)
            if late is not None:
                stopped.add(path)
                found.setdefault(late[0], late[1])
        return sorted(found.items())

    def first_batch_kinds(self, first_batch_lines: int | None, batch_file: int = 0) -> dict[Path, tuple[str, Where]]:
        """The types of the first file's rows (``batch_file``): for each column, what pyarrow makes of it in
        the file's first batch where that is a choice (int64 or double, timestamp[s] or string), and
        the row that made it (the first number, the first decimal, the first date, the first other)."""

        def in_batch(where: Where | None) -> bool:
            return (
                where is not None
                and where[0] == batch_file
                and (first_batch_lines is None or where[1] <= first_batch_lines)
            )

        kinds: dict[Path, tuple[str, Where]] = {}
        for path, column in self.columns.items():
            if not in_batch(column.typed):
                continue
            assert column.typed is not None
            if column.kind == "number":
                decimal = column.decimal
                kinds[path] = (
                    ("double", decimal) if decimal is not None and in_batch(decimal) else ("int64", column.typed)
                )
            elif column.kind == "string":
                undated = column.undated
                kinds[path] = (
                    ("string", undated) if undated is not None and in_batch(undated) else (_TIMESTAMP, column.typed)
                )
        return kinds

    def place(self, where: Where) -> str:
        """``line 4``, or ``b.jsonl:4`` in a folder."""
        return _place(self.files, where)

    def seen_columns(self) -> set[str]:
        """The top-level columns that some row has had."""
        return {path[0] for path in self.columns if len(path) == 1 and isinstance(path[0], str)}

    def kind(self, path: Path) -> str | None:
        column = self.columns.get(path)
        return None if column is None else column.kind

    def children(self, path: Path) -> list[str]:
        """The keys seen below an object column, in the order first seen."""
        node = self._nodes.get(path)
        return [] if node is None else list(node.keys)


def _late(path: Path, column: Column, in_first_batch: Any, batch: str) -> tuple[Where, str] | None:
    name = pyarrow_path(path)
    cast = "LLaMA-Factory's loader stops here (datasets: Couldn't cast)"
    if not isinstance(path[-1], str):  # the elements of a list: list<null> when the batch had none
        if column.typed is not None and not in_first_batch(column.typed):
            return column.typed, (
                f"the lists in {pyarrow_path(path[:-1])} hold a {column.kind} here but are empty or null in "
                f"every row of the loader's first batch ({batch}), which fixed their type: {cast}. Put a row "
                "with such a list in the first batch"
            )
    elif not in_first_batch(column.appeared):
        return column.appeared, (
            f"column {name} first appears here, after the loader's first batch ({batch}), which fixed the "
            f"columns: {cast}. Put a row that has it in the first batch, or give every row the key (null will do)"
        )
    elif column.typed is not None and not in_first_batch(column.typed):
        return column.typed, (
            f"column {name} is null in every row of the loader's first batch ({batch}) and a {column.kind} "
            f"here: {cast}. Put a row with a value in the first batch"
        )
    if column.kind == "number" and column.fraction is not None and not in_first_batch(column.decimal):
        return column.fraction, (
            f"column {name} holds whole numbers only in the loader's first batch ({batch}) and a decimal or "
            "an integer past int64 here: LLaMA-Factory's loader stops (pyarrow: Float value was truncated "
            "converting to int64). Write one number in the first batch as a decimal (1.0), or write such numbers "
            "as strings"
        )
    if column.undated is not None and in_first_batch(column.typed) and not in_first_batch(column.undated):
        return column.undated, (
            f"column {name} holds only dates in the loader's first batch ({batch}), which pyarrow reads "
            "as timestamps, and a string that is not one here (or a JSON array's date with a zone, which pandas "
            "keeps as a string): LLaMA-Factory's loader stops (pyarrow: Failed to parse string as a scalar of "
            "type timestamp[s]). Put a row whose value is not a date in the "
            "first batch, or remove the column (LLaMA-Factory trains only on the mapped columns)"
        )
    return None


_TIMESTAMP = "timestamp[s]"
# (the first file's type, a later file's): files loaded in parallel fail to merge. Timestamps then
# strings mostly stop one process too (late_rows), but not where the strings are a JSON array's
# dates without a zone, which pandas leaves as strings and one process casts.
_UNMERGEABLE = {("int64", "double"), ("double", "int64"), ("string", _TIMESTAMP), (_TIMESTAMP, "string")}
_MERGE_WHAT = {
    "double": "has a decimal (or an integer past int64) here, in the first batch of {later}, where that of {first} "
    "has whole numbers only",
    "int64": "holds whole numbers only in the first batch of {later} (from here), where that of {first} has a decimal",
    _TIMESTAMP: "holds only dates in the first batch of {later} (from here), which pyarrow reads as timestamps, "
    "where that of {first} has other strings",
    "string": "holds strings in the first batch of {later} (from here: a string that is not a date, or any string "
    "of a JSON array, which pandas reads without dates), where that of {first} holds only dates, which pyarrow "
    "reads as timestamps",
}


def merge_conflicts(
    first: dict[Path, tuple[str, Where]], later: dict[Path, tuple[str, Where]], first_file: str, later_file: str
) -> list[tuple[Where, str]]:
    """``(where, reason)`` for a later file of a folder whose first batch (``first_batch_kinds``)
    gives a column a type that the first file's cannot merge with, one reason a row. ``where``
    numbers the later file 0."""
    found: dict[Where, str] = {}
    for path, (kind, where) in later.items():
        theirs = first.get(path)
        if theirs is None or (theirs[0], kind) not in _UNMERGEABLE:
            continue
        what = _MERGE_WHAT[kind].format(first=first_file, later=later_file)
        found.setdefault(
            where,
            f"column {pyarrow_path(path)} {what}: datasets cannot merge files that load in parallel "
            f"(preprocessing_num_workers, as every preset sets; pyarrow: Unable to merge: incompatible types: "
            f"{theirs[0]} vs {kind}). Write the column alike in every file, or remove it (LLaMA-Factory trains "
            "only on the mapped columns)",
        )
    return sorted(found.items())


def loader_runs(files: int, processes: int | None) -> list[range]:
    """The runs of consecutive files that datasets gives each loading process, by file number; each
    run's first file's first batch fixes the types of the rest of the run. ``processes``: LLaMA-Factory's
    preprocessing_num_workers; None when not known: then every file as if loaded by a process of its
    own (as many processes as files, as the presets mostly give), besides the one process that
    ``late_rows`` models. [] for one process. (datasets 4.0.0: builder.py lowers num_proc to the number
    of files and loads one file in one process; utils/sharding.py ``_distribute_shards`` cuts the runs.)"""
    if files <= 1 or (processes is not None and processes <= 1):
        return []
    jobs = files if processes is None else min(processes, files)
    runs: list[range] = []
    for job in range(jobs):
        start = runs[-1].stop if runs else 0
        runs.append(range(start, start + files // jobs + (job < files % jobs)))
    return runs


def _walk(row: dict[str, Any]) -> Iterator[tuple[Path, Any]]:
    """``(path, value)`` for every key of a row and everything below it, parents first. A stack, not
    recursion: a row may nest deeper than Python recurses."""
    stack: list[tuple[Path, Iterator[tuple[str | int, Any]]]] = [((), iter(row.items()))]
    while stack:
        prefix, steps = stack[-1]
        for step, value in steps:
            path = (*prefix, step)
            yield path, value
            if type(value) is dict:
                stack.append((path, iter(value.items())))
                break
            if type(value) is list:
                stack.append((path, zip(repeat(ITEM), value)))
                break
        else:
            stack.pop()


def _known(node: _Node, obj: dict[str, Any]) -> bool:
    """Every key of ``obj``, and below, already seen, with the type it has here (or null); a row of
    JSON lines (a date fits a column of dates as pyarrow reads it)."""
    keys = node.keys
    for key, value in obj.items():
        child = keys.get(key)
        if child is None:
            return False
        if value is None:
            continue
        kind = type(value)
        if kind not in child.admits:
            if kind is str and child.dated and is_timestamp(value):
                continue
            return False
        if kind is int and not INT64_MIN <= value <= INT64_MAX and float not in child.admits:
            return False  # news: a double, as a fraction is
        if kind is dict:
            if not _known(child, value):
                return False
        elif kind is list and value:
            item = child.item
            if item is None:
                return False
            for element in value:
                if not _known_value(item, element):
                    return False
    return True


def _known_value(node: _Node, value: Any) -> bool:
    """As ``_known``, for one element of a list."""
    if value is None:
        return True
    kind = type(value)
    if kind not in node.admits:
        return kind is str and node.dated and is_timestamp(value) is not None
    if kind is int and not INT64_MIN <= value <= INT64_MAX and float not in node.admits:
        return False
    if kind is dict:
        return _known(node, value)
    if kind is list and value:
        return node.item is not None and all(_known_value(node.item, item) for item in value)
    return True


def _casts_to_timestamp(value: str) -> bool:
    """A JSON array's string (pandas keeps it one) that casts to a column of timestamps: a date
    without a zone; the cast stops at ``2024-01-01T10:00:00Z`` (expected no zone offset)."""
    if is_timestamp(value) is None:
        return False
    return not (value.endswith("Z") or "+" in value[10:] or "-" in value[10:])


def fits_int64(number: float) -> bool:
    """pyarrow holds a number as int64 only when it is whole and in range: 2 and 2.0, not 2.5, 1e20 or 2**64."""
    if type(number) is float and not number.is_integer():
        return False
    return INT64_MIN <= number <= INT64_MAX


def pyarrow_path(path: Path) -> str:
    """How pyarrow names a column path in its errors: /messages/[]/from."""
    name = "/" + "/".join(step if isinstance(step, str) else "[]" for step in path)
    return name.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate ("\ud800") prints


def conflict_reason(
    path: Path, kind: str, first_kind: str, first: Column | None, files: list[str | None], one_batch: bool = True
) -> str:
    """``first``: the column as the rows before had it; None for earlier in the same row (a list of
    mixed types). ``one_batch``: the dataset is one file the loader parses at once (up to 10 MB, or a
    JSON array); else it stops only within a batch (or across files loaded by several processes), and
    across batches casts to the first batch's type, which works for some changes (to a string)."""
    name = pyarrow_path(path)
    if first is None or first.typed is None:
        where, one_batch = "earlier in this row", True
    else:
        where = f"on {_place(files, first.typed)}"
    pyarrow = f"(pyarrow: Column({name}) changed from {first_kind} to {kind})"
    if one_batch:
        stops = f"LLaMA-Factory's loader stops at this row {pyarrow}"
    else:
        parallel = " or the files load in parallel (preprocessing_num_workers)" if len(files) > 1 else ""
        stops = (
            f"LLaMA-Factory's loader stops at this row if both share a 10 MB batch {pyarrow}{parallel}, "
            f"and otherwise keeps it only if it casts to a {first_kind}"
        )
    return f"column {name} is a {kind} here but a {first_kind} {where}: {stops}. Give it one type in every row"


def _place(files: list[str | None], where: Where) -> str:
    file = files[where[0]] if where[0] < len(files) else None
    return f"{file}:{where[1]}" if file else f"line {where[1]}"
