"""What LLaMA-Factory does not say about a dataset_info.json entry: keys it ignores silently.

LLaMA-Factory's parser (``DatasetAttr.join``) skips keys it does not know, so a typo such as
``"colums"`` silently falls back to the defaults, and a ``columns`` block gives every column it leaves
out no default. ``entry_problems`` names those; what the entry then means is LLaMA-Factory's own
``get_dataset_list`` (``source.py``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Source keys in the order get_dataset_list tries them (the three hubs may be combined).
HUB_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url")
SOURCE_KEYS = (*HUB_KEYS, "script_url", "cloud_file_name", "file_name")
OPTION_KEYS = ("formatting", "ranking", "subset", "split", "folder", "num_samples", "columns", "tags")
DATASET_ATTR_KEYS = frozenset(SOURCE_KEYS + OPTION_KEYS)
IGNORED_KEYS = frozenset({"file_sha1"})  # older LLaMA-Factory data files carry it; 0.9.5 ignores it

FORMATTINGS = ("alpaca", "sharegpt", "openai")

# DatasetAttr's column names; its tag names and their defaults (with no ``tags`` block at all).
COLUMN_KEYS = ("prompt", "query", "response", "history", "messages", "system", "tools", "images", "videos")
COLUMN_KEYS += ("audios", "chosen", "rejected", "kto_tag")
TAG_DEFAULTS: dict[str, str | None] = {
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
}
TAG_KEYS = tuple(TAG_DEFAULTS)

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
    errors += _unknown_keys(entry)
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
        f"unknown key {key!r}{did_you_mean(key, DATASET_ATTR_KEYS)}: LLaMA-Factory ignores it silently"
        for key in entry
        if key not in DATASET_ATTR_KEYS and key not in IGNORED_KEYS
    ]


def _source_problems(entry: dict[str, Any]) -> list[str]:
    present = [key for key in SOURCE_KEYS if key in entry]
    if not present:
        return ["no source: give file_name (a file or folder in dataset_dir) or hf_hub_url"]
    errors = [f"{key} must be a non-empty string" for key in present if not _non_empty_str(entry[key])]
    # get_dataset_list takes the hubs first, then script_url, cloud_file_name, file_name: the rest is unused.
    groups = [key for key in present if key not in HUB_KEYS]
    if any(key in HUB_KEYS for key in present):
        groups.insert(0, "+".join(key for key in present if key in HUB_KEYS))
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
    errors = _block_problems(entry, "columns", COLUMN_KEYS) + _block_problems(entry, "tags", TAG_KEYS)
    warnings: list[str] = []
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
                f"tags no default (the defaults are {', '.join(f'{t}={TAG_DEFAULTS[t]!r}' for t in unset)})"
            )
    return errors, warnings


def _block_problems(entry: dict[str, Any], block: str, known: tuple[str, ...]) -> list[str]:
    if block not in entry:
        return []
    value = entry[block]
    if not isinstance(value, dict):
        return [f"{block} must be an object mapping names to column names"]
    errors = [
        f"unknown {block} key {key!r}{did_you_mean(key, known)}: LLaMA-Factory ignores it silently"
        for key in value
        if key not in known
    ]
    errors += [
        f"{block}.{key} must be a string (the name in the data), not {json_kind(val)}"
        for key, val in value.items()
        if key in known and val is not None and not isinstance(val, str)
    ]
    return errors


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
    if chat:
        needed.append(("messages", "conversations"))
    elif not ranking:
        needed.append(("response", "output"))
        if not columns.get("prompt") and not columns.get("query"):
            needed.append(("prompt", "instruction"))
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
