"""What LLaMA-Factory does not say about a dataset_info.json entry: keys it ignores silently.

LLaMA-Factory's parser (``DatasetAttr.join``) skips keys it does not know, so a typo such as
``"colums"`` silently falls back to the defaults, and a ``columns`` block gives every column it leaves
out no default. ``entry_problems`` names those; what the entry then means is LLaMA-Factory's own
``get_dataset_list`` (``source.py``). A key it ignores (a ``comment``) is a warning naming the nearest
key it reads, never a refusal: LLaMA-Factory trains such an entry.

The keys it reads are not a copied list: they are recorded by running LLaMA-Factory's own
``get_dataset_list`` and ``DatasetAttr.join`` (data/parser.py) on an entry that notes every key asked.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
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
def _parser_reads() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...], dict[str, Any]]:
    """(source keys in get_dataset_list's order, option keys, column keys, tag keys, DatasetAttr field
    defaults), read by running LLaMA-Factory's own ``get_dataset_list`` and ``DatasetAttr.join``
    (data/parser.py) on entries that record what they are asked."""
    from ..lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.data.parser import DatasetAttr, get_dataset_list

    probe = _Reads()
    get_dataset_list(["probe"], {"probe": probe})  # no source key present: it asks each, then file_name
    joined = [key for key in probe.asked if key not in ("columns", "tags")]
    sources = tuple(dict.fromkeys(joined[: joined.index("file_name") + 1]))
    options = tuple(dict.fromkeys(joined[joined.index("file_name") + 1 :]))
    blocks = _Reads(has=frozenset({"columns", "tags"}))
    DatasetAttr("file", "probe").join(blocks)
    columns = tuple(dict.fromkeys(blocks.blocks["columns"].asked))
    tags = tuple(dict.fromkeys(blocks.blocks["tags"].asked))
    defaults = {f.name: f.default for f in dataclasses.fields(DatasetAttr)}
    return sources, (*options, "columns", "tags"), columns, tags, defaults


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


def hub_keys() -> tuple[str, ...]:
    return tuple(key for key in SOURCE_KEYS if key.endswith("_hub_url"))


def dataset_attr_keys() -> frozenset[str]:
    return frozenset((*SOURCE_KEYS, *OPTION_KEYS))


def tag_defaults() -> dict[str, Any]:
    """Each tag's default when an entry has no ``tags`` block: DatasetAttr's field defaults."""
    defaults = _parser_reads()[4]
    return {tag: defaults[tag] for tag in TAG_KEYS}


ALPACA_ONLY_COLUMNS = frozenset({"prompt", "query", "response", "history"})
CHAT_ONLY_COLUMNS = frozenset({"messages"})
REQUIRED_TAGS = ("role_tag", "content_tag", "user_tag", "assistant_tag")


@dataclass(frozen=True)
class EntryCheck:
    errors: list[str]
    warnings: list[str]


def source_of(entry: Mapping[str, Any]) -> str:
    """The source LLaMA-Factory uses (a hub first, as get_dataset_list does), or "?"."""
    return next((str(entry[key]) for key in SOURCE_KEYS if key in entry), "?")


def closest(word: str, candidates: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(word, sorted(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    match = closest(word, candidates)
    return f" (did you mean {match!r}?)" if match else ""


def entry_problems(entry: Any) -> EntryCheck:
    """Everything wrong with one dataset_info.json entry, as one sentence each."""
    if not isinstance(entry, dict):
        return EntryCheck([f"the entry is a JSON {json_kind(entry)}, expected an object"], [])
    errors: list[str] = []
    warnings: list[str] = []
    warnings += _unknown_keys(entry)
    errors += _source_problems(entry)
    errors += _option_problems(entry)
    formatting = entry.get("formatting", "alpaca")
    if formatting in FORMATTINGS:
        column_errors, column_warnings = _column_problems(entry, formatting)
        errors += column_errors
        warnings += column_warnings
    return EntryCheck(errors, warnings)


def _unknown_keys(entry: dict[str, Any]) -> list[str]:
    return [
        f"unknown key {key!r}{did_you_mean(key, dataset_attr_keys())}: LLaMA-Factory ignores it"
        for key in entry
        if key not in dataset_attr_keys() and key not in IGNORED_KEYS
    ]


def _source_problems(entry: dict[str, Any]) -> list[str]:
    present = [key for key in SOURCE_KEYS if key in entry]
    if not present:
        return ["no source: give file_name (a file or folder in dataset_dir) or hf_hub_url"]
    errors = [f"{key} must be a non-empty string" for key in present if not _non_empty_str(entry[key])]
    # get_dataset_list takes the hubs first, then script_url, cloud_file_name, file_name: the rest is unused.
    hubs = hub_keys()
    groups = [key for key in present if key not in hubs]
    if any(key in hubs for key in present):
        groups.insert(0, "+".join(key for key in present if key in hubs))
    if len(groups) > 1:
        used, unused = groups[0], ", ".join(groups[1:])
        errors.append(f"more than one source ({', '.join(groups)}): LLaMA-Factory uses {used} and ignores {unused}")
    return errors


def _option_problems(entry: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    formatting = entry.get("formatting", "alpaca")
    if formatting not in FORMATTINGS:
        hint = did_you_mean(str(formatting), FORMATTINGS)
        errors.append(f"formatting {formatting!r} is not one of {', '.join(FORMATTINGS)}{hint}")
    if "ranking" in entry and not isinstance(entry["ranking"], bool):
        errors.append("ranking must be true or false")
    num = entry.get("num_samples")
    if num is not None and (isinstance(num, bool) or not isinstance(num, int) or num <= 0):
        errors.append("num_samples must be a positive integer")
    for key in ("subset", "split", "folder"):
        if entry.get(key) is not None and not isinstance(entry[key], str):
            errors.append(f"{key} must be a string")
    return errors


def _column_problems(entry: dict[str, Any], formatting: str) -> tuple[list[str], list[str]]:
    errors: list[str] = []
    warnings: list[str] = []
    for block, known in (("columns", tuple(COLUMN_KEYS)), ("tags", tuple(TAG_KEYS))):
        block_errors, block_warnings = _block_problems(entry, block, known)
        errors += block_errors
        warnings += block_warnings
    columns = entry.get("columns") if isinstance(entry.get("columns"), dict) else None
    tags = entry.get("tags") if isinstance(entry.get("tags"), dict) else None
    chat = formatting != "alpaca"
    if columns is not None:
        errors += _misplaced_columns(columns, formatting)
        errors += _unset_required_columns(columns, chat, entry.get("ranking") is True)
    elif entry.get("ranking") is True:
        errors.append("ranking is true but there is no columns block naming the chosen and rejected columns")
    if tags is not None and not chat:
        warnings.append("tags are read only for sharegpt/openai formatting; this alpaca entry ignores them")
    if tags is not None and chat:
        unset = [tag for tag in REQUIRED_TAGS if not tags.get(tag)]
        if unset:
            errors.append(
                f"the tags block leaves {', '.join(unset)} unset: with a tags block LLaMA-Factory gives unset "
                f"tags no default (the defaults are {', '.join(f'{t}={tag_defaults()[t]!r}' for t in unset)})"
            )
    return errors, warnings


def _block_problems(entry: dict[str, Any], block: str, known: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(errors, warnings) of a columns/tags block: a key LLaMA-Factory does not read is a warning."""
    if block not in entry:
        return [], []
    value = entry[block]
    if not isinstance(value, dict):
        return [f"{block} must be an object mapping names to column names"], []
    warnings = [
        f"unknown {block} key {key!r}{did_you_mean(key, known)}: LLaMA-Factory ignores it"
        for key in value
        if key not in known
    ]
    errors = [
        f"{block}.{key} must be a string (the name in the data), not {json_kind(val)}"
        for key, val in value.items()
        if key in known and val is not None and not isinstance(val, str)
    ]
    return errors, warnings


def _misplaced_columns(columns: dict[str, Any], formatting: str) -> list[str]:
    if formatting == "alpaca":
        return [
            f"columns.{key} is read only for sharegpt/openai formatting; this entry is alpaca "
            '(the default): add "formatting": "sharegpt"'
            for key in columns
            if key in CHAT_ONLY_COLUMNS
        ]
    return [
        f"columns.{key} is read only for alpaca formatting; {formatting} rows keep the conversation in columns.messages"
        for key in columns
        if key in ALPACA_ONLY_COLUMNS
    ]


def _unset_required_columns(columns: dict[str, Any], chat: bool, ranking: bool) -> list[str]:
    """With a columns block nothing has a default, so the essential columns must be named."""
    needed: list[tuple[str, str]] = []
    # Not response or prompt for alpaca rows: pre-training reads the prompt column alone, and an sft row
    # without a response is dropped by LLaMA-Factory's own drop rule, which the data pass runs on every row.
    if chat:
        needed.append(("messages", "conversations"))
    if ranking:
        needed += [("chosen", "chosen"), ("rejected", "rejected")]
    return [
        f"the columns block does not set {key}: with a columns block LLaMA-Factory gives unset columns no "
        f'default (add "{key}": "{example}")'
        for key, example in needed
        if not columns.get(key)
    ]


def json_kind(value: Any) -> str:
    """The JSON name of a Python value's type, for messages."""
    kinds = (("null", type(None)), ("boolean", bool), ("number", (int, float)), ("string", str), ("array", list))
    return next((name for name, types in (*kinds, ("object", dict)) if isinstance(value, types)), type(value).__name__)


def _non_empty_str(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())
