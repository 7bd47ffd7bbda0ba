"""One JSON type per column: what LLaMA-Factory's loader needs of a dataset file beyond each row.

``datasets.load_dataset("json")`` parses the file with pyarrow, which gives every column one type
(and every field of an object column, and the elements of a list column, one each). The first
row that disagrees stops the load, after the launch, with
``JSON parse error: Column(/id) changed from number to string in row 1`` (a JSON array file goes
through pandas instead and fails on the same rows with another message). null fits any column,
integers and decimals are both numbers, and objects may differ in which keys they have.

Measured with datasets 4.0.0 and pyarrow 26.0.1, JSON lines and JSON arrays alike;
``tests/test_dataset_types.py`` loads every case with the real loader and checks that this module
agrees with it. Not modelled: what differs only between the loader's 10 MB batches (a column that
first appears after the first batch, integers and then decimals across batches, strings that read
as timestamps in the first batch only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ITEM = 0  # the step into a list's elements: an int, so that it never equals an object's key
Path = tuple[str | int, ...]  # ("messages", ITEM, "from") is pyarrow's /messages/[]/from

NULL = "null"  # a column seen only as null so far: the first other type decides it
_KIND = {str: "string", int: "number", float: "number", bool: "boolean", dict: "object", list: "array"}


@dataclass(frozen=True)
class Seen:
    """A column's type and where a row first had it (``line`` of ``file``; None for the only file)."""

    kind: str
    line: int
    file: str | None = None

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file else f"line {self.line}"


# The Python types (as json.loads gives them) that each kind admits; null admits no other yet.
_ADMITS = {
    "string": (str,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    NULL: (),
}


class _Node:
    """One column path, as a tree for ``_known``: its admitted types, its keys, its elements."""

    __slots__ = ("admits", "item", "keys")

    def __init__(self) -> None:
        self.admits: tuple[type, ...] = ()
        self.keys: dict[str, _Node] = {}
        self.item: _Node | None = None


class ColumnTypes:
    """The type of every column path the rows have had so far, and where each was first seen."""

    def __init__(self, seen: dict[Path, Seen] | None = None) -> None:
        self.seen: dict[Path, Seen] = {}
        self._root = _Node()
        self._nodes: dict[Path, _Node] = {(): self._root}
        for path, first in sorted((seen or {}).items(), key=lambda item: len(item[0])):
            self._set(path, first)

    def __repr__(self) -> str:
        return f"ColumnTypes({self.seen!r})"

    def copy(self) -> ColumnTypes:
        return ColumnTypes(self.seen)

    def _set(self, path: Path, first: Seen) -> None:
        self.seen[path] = first
        node = self._nodes.get(path)
        if node is None:  # its parent is in already: a walk records a path before the paths below it
            node = self._nodes[path] = _Node()
            parent = self._nodes[path[:-1]]
            step = path[-1]
            if step == ITEM and not isinstance(step, str):
                parent.item = node
            else:
                parent.keys[str(step)] = node
        node.admits = _ADMITS[first.kind]

    def conflict(self, row: dict[str, Any], line: int, file: str | None = None) -> str | None:
        """Record a row's types, or (recording nothing) say why the loader will stop at it."""
        if _known(self._root, row):
            return None  # the common case: no key and no type that earlier rows did not have
        new: dict[Path, str] = {}
        reason = self._object(row, (), new, line, file)
        if reason is not None:
            return reason
        for path, kind in new.items():
            self._set(path, Seen(kind, line, file))
        return None

    def _object(
        self, obj: dict[str, Any], prefix: Path, new: dict[Path, str], line: int, file: str | None
    ) -> str | None:
        for key, value in obj.items():
            reason = self._value(value, (*prefix, key), new, line, file)
            if reason is not None:
                return reason
        return None

    def _value(self, value: Any, path: Path, new: dict[Path, str], line: int, file: str | None) -> str | None:
        kind = NULL if value is None else _KIND[type(value)]
        before = self.seen.get(path)
        if before is None or before.kind != kind:  # the rare case: new, null so far, or a conflict
            known = new.get(path, before.kind if before is not None else None)
            if known is None or (known == NULL and kind != NULL):
                new[path] = kind
            elif kind not in (known, NULL):
                first = before if before is not None and before.kind == known else None  # None: this row
                return conflict_reason(path, kind, known, first)
        if kind == "object":
            return self._object(value, path, new, line, file)
        if kind == "array":
            step = (*path, ITEM)
            for item in value:
                reason = self._value(item, step, new, line, file)
                if reason is not None:
                    return reason
        return None

    def disagreement(self, other: ColumnTypes, line_offset: int = 0) -> str | None:
        """Why ``other`` (the types of the rows after these) cannot follow these rows, or None."""
        for path, theirs in other.seen.items():
            ours = self.seen.get(path)
            if ours is not None and NULL not in (ours.kind, theirs.kind) and ours.kind != theirs.kind:
                shifted = Seen(theirs.kind, theirs.line + line_offset, theirs.file)
                return f"{shifted.where()}: {conflict_reason(path, theirs.kind, ours.kind, ours)}"
        return None

    def absorb(self, other: ColumnTypes, line_offset: int = 0, file: str | None = None) -> None:
        """Take in the types of the rows after these (call ``disagreement`` first)."""
        for path, theirs in other.seen.items():
            ours = self.seen.get(path)
            if ours is None or (ours.kind == NULL and theirs.kind != NULL):
                self._set(path, Seen(theirs.kind, theirs.line + line_offset, file or theirs.file))

    def kind(self, path: Path) -> str | None:
        seen = self.seen.get(path)
        return None if seen is None else seen.kind

    def children(self, path: Path) -> list[str | int]:
        """The next steps below ``path`` (object keys, or ITEM), in the order first seen."""
        depth = len(path)
        steps = (p[depth] for p in self.seen if len(p) == depth + 1 and p[:depth] == path)
        return list(dict.fromkeys(steps))


def _known(node: _Node, obj: dict[str, Any]) -> bool:
    """Every key of ``obj``, and below, already seen with the type it has here (or null)."""
    keys = node.keys
    for key, value in obj.items():
        child = keys.get(key)
        if child is None:
            return False
        if value is None:
            continue
        kind = type(value)
        if kind not in child.admits:
            return False
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
    """As ``_known``, for one value."""
    if value is None:
        return True
    kind = type(value)
    if kind not in node.admits:
        return False
    if kind is dict:
        return _known(node, value)
    if kind is list and value:
        return node.item is not None and all(_known_value(node.item, item) for item in value)
    return True


def pyarrow_path(path: Path) -> str:
    """How pyarrow names a column path in its errors: /messages/[]/from."""
    return "/" + "/".join("[]" if step == ITEM else str(step) for step in path)


def conflict_reason(path: Path, kind: str, first_kind: str, first: Seen | None) -> str:
    """``first``: the row that set the type; None for earlier in the same row (a list of mixed types)."""
    column = pyarrow_path(path)
    where = f"on {first.where()}" if first is not None else "earlier in this row"
    return (
        f"column {column} is a {kind} here but a {first_kind} {where}: LLaMA-Factory's loader stops at this "
        f"row (pyarrow: Column({column}) changed from {first_kind} to {kind}). Give it one type in every row"
    )
