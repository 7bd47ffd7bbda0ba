"""What LLaMA-Factory does not say about a dataset_info.json entry: what it ignores silently.

The entry is judged by LLaMA-Factory alone: its ``get_dataset_list`` (data/parser.py) reads it and its
converter (data/converter.py) runs on the rows (``validate.py``, ``rows.py``); where they stop, that is
the error, in their words. Nothing here refuses an entry. What they skip without a word is a warning
naming the nearest key they read (``entry_warnings``): a key the parser does not know (a ``comment``, a
typo such as ``"colums"``), a column or tag the entry's converter does not read (``prompt`` in a sharegpt
entry), a source the parser passes over because it takes another one first.

The keys it reads are not a copied list: they are recorded by running LLaMA-Factory's own
``get_dataset_list`` and ``DatasetAttr.join`` (data/parser.py) on an entry that notes every key asked.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from functools import cache, lru_cache
from typing import Any

IGNORED_KEYS = frozenset({"file_sha1"})  # older LLaMA-Factory data files carry it; 0.9.5 ignores it


class _Reads(dict):
    """A dataset_info.json entry that records every key LLaMA-Factory's parser asks of it."""

    def __init__(self, has: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.asked: list[str] = []
        self.blocks: dict[str, _Reads] = {}
        self._has = has

    def __contains__(self, key: object) -> bool:
        self.asked.append(str(key))
        return key in self._has

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.append(key)
        return default

    def __getitem__(self, key: str) -> Any:
        self.asked.append(key)
        if key in self._has:
            return self.blocks.setdefault(key, _Reads())
        return "x"  # the source name get_dataset_list takes


@lru_cache(maxsize=1)
def _parser_reads() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(source keys in get_dataset_list's order, option keys, column keys, tag keys), read by running
    LLaMA-Factory's own ``get_dataset_list`` and ``DatasetAttr.join`` (data/parser.py) on recording entries."""
    from ..lf.library import dataset_attr_class, dataset_list

    probe = _Reads()
    dataset_list(["probe"], {"probe": probe})  # no source key present: it asks each, then file_name
    joined = [key for key in probe.asked if key not in ("columns", "tags")]
    sources = tuple(dict.fromkeys(joined[: joined.index("file_name") + 1]))
    options = tuple(dict.fromkeys(joined[joined.index("file_name") + 1 :]))
    blocks = _Reads(has=frozenset({"columns", "tags"}))
    dataset_attr_class()("file", "probe").join(blocks)
    columns = tuple(dict.fromkeys(blocks.blocks["columns"].asked))
    tags = tuple(dict.fromkeys(blocks.blocks["tags"].asked))
    return sources, (*options, "columns", "tags"), columns, tags


class _FromParser(Sequence[str]):
    """A key list read from LLaMA-Factory's parser when first used, so importing this module (the CLI
    does, to build its options) does not import LLaMA-Factory."""

    def __init__(self, part: int) -> None:
        self._part = part

    def _keys(self) -> tuple[str, ...]:
        return _parser_reads()[self._part]

    def __getitem__(self, index: Any) -> Any:
        return self._keys()[index]

    def __len__(self) -> int:
        return len(self._keys())

    def __contains__(self, key: object) -> bool:
        return key in self._keys()

    def __repr__(self) -> str:
        return repr(self._keys())


SOURCE_KEYS: Sequence[str] = _FromParser(0)  # in the order get_dataset_list tries them
OPTION_KEYS: Sequence[str] = _FromParser(1)
COLUMN_KEYS: Sequence[str] = _FromParser(2)
TAG_KEYS: Sequence[str] = _FromParser(3)
# DatasetAttr.formatting's Literal (llamafactory 0.9.5 data/parser.py); a constant because the CLI's
# --formatting choices are built at start-up. Pinned by tests/test_dataset_converter.py
# ::test_the_entry_keys_are_llamafactorys_own.
FORMATTINGS = ("alpaca", "sharegpt", "openai")


def dataset_attr_keys() -> frozenset[str]:
    return frozenset((*SOURCE_KEYS, *OPTION_KEYS))


def converter_reads(formatting: str) -> frozenset[str]:
    """The DatasetAttr fields the converter LLaMA-Factory picks for ``formatting`` reads
    (``self.dataset_attr.<field>`` in its class and base classes, read from their source with ``ast``);
    empty for a formatting it has no converter for."""
    return _converter_reads(formatting) if isinstance(formatting, str) else frozenset()


@cache
def _converter_reads(formatting: str) -> frozenset[str]:
    from ..lf.library import dataset_converters

    converter = dataset_converters().get(formatting)
    if converter is None:
        return frozenset()
    read: set[str] = set()
    for cls in converter.__mro__:
        if cls.__module__ != converter.__module__:
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        read.update(
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "dataset_attr"
        )
    return frozenset(read)


def source_of(entry: Mapping[str, Any]) -> str:
    """The source LLaMA-Factory uses (a hub first, as get_dataset_list does), or "?"."""
    return next((str(entry[key]) for key in SOURCE_KEYS if key in entry), "?")


def closest(word: str, candidates: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(word, sorted(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    match = closest(word, candidates)
    return f" (did you mean {match!r}?)" if match else ""


def entry_warnings(entry: Mapping[str, Any], attr: Any) -> list[str]:
    """What LLaMA-Factory ignores in an entry it has read (``attr``: its ``get_dataset_list``'s answer),
    one sentence each, with the nearest key it does read."""
    warnings = [
        f"unknown key {key!r}{did_you_mean(str(key), dataset_attr_keys())}: LLaMA-Factory ignores it"
        for key in entry
        if key not in dataset_attr_keys() and key not in IGNORED_KEYS
    ]
    passed_over = [key for key in SOURCE_KEYS if key in entry and entry[key] != attr.dataset_name]
    if passed_over:
        warnings.append(
            f"LLaMA-Factory loads this entry from {attr.dataset_name!r} ({attr.load_from}) and ignores "
            f"{', '.join(passed_over)}"
        )
    reads = converter_reads(attr.formatting)
    for block, known in (("columns", tuple(COLUMN_KEYS)), ("tags", tuple(TAG_KEYS))):
        value = entry.get(block)
        if not isinstance(value, Mapping):
            continue
        used = [key for key in known if key in reads]
        for key in value:
            if key not in known:
                warnings.append(f"unknown {block} key {key!r}{did_you_mean(str(key), known)}: LLaMA-Factory ignores it")
            elif key not in reads and reads:
                warnings.append(
                    f"{block}.{key} is not read by LLaMA-Factory's {attr.formatting} converter, which ignores "
                    f"it{did_you_mean(str(key), used)}; it reads {', '.join(used) or 'no ' + block}"
                )
    return warnings


def json_kind(value: Any) -> str:
    """The JSON name of a Python value's type, for messages."""
    kinds = (("null", type(None)), ("boolean", bool), ("number", (int, float)), ("string", str), ("array", list))
    return next((name for name, types in (*kinds, ("object", dict)) if isinstance(value, types)), type(value).__name__)
