"""``datasets register``: validate a file, then add it to dataset_info.json (atomically, with a backup)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..fsutil import atomic_write_text, first_free_name
from .entry import FORMATTINGS
from .info import INFO_FILE, load_dataset_info, reason
from .loader import LoadError, stream_tables
from .validate import CheckOptions, DatasetReport, validate_entry

REGISTERED_SUFFIXES = (".json", ".jsonl")
ROLE_CONTENT_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
ROLE_CONTENT_TAGS |= {"observation_tag": "observation", "function_tag": "function_call", "system_tag": "system"}


@dataclass(frozen=True)
class Registration:
    info_path: Path
    backup: Path | None  # the previous dataset_info.json, kept
    entry: dict[str, Any]
    report: DatasetReport


def add_dataset(
    file: str | Path,
    name: str,
    formatting: str = "alpaca",
    dataset_dir: str | Path = "data",
    *,
    force: bool = False,
    options: CheckOptions | None = None,
) -> Registration:
    """Validate ``file`` and add it to ``dataset_dir/dataset_info.json`` as ``name``, with everything the CLI
    prints: the backup, the entry and the report."""
    if not name or name != name.strip():
        raise UsageError("give the dataset a name without leading or trailing spaces (--name).")
    if "," in name:
        raise UsageError(f"dataset name {name!r} has a comma: LLaMA-Factory splits `dataset:` at commas.")
    if formatting not in FORMATTINGS:
        raise UsageError(f"formatting {formatting!r} is not one of {', '.join(FORMATTINGS)}.")
    path = Path(file)
    if not path.is_file():
        raise UsageError(f"{path} not found.")
    if path.suffix.lower() not in REGISTERED_SUFFIXES:
        raise UsageError(f"{path}: register takes .json or .jsonl files.")
    folder = Path(dataset_dir)
    info = load_dataset_info(folder) if folder.is_dir() else None
    info_path = folder / INFO_FILE
    if info is not None and name in info and not force:
        raise UsageError(
            f"dataset {name!r} is already in {info_path}. Pass --force to replace it "
            "(the old file is kept as a backup)."
        )
    entry = {"file_name": _file_name(path, folder), "formatting": formatting, **_layout(path, formatting)}
    report = validate_entry(name, entry, folder, options or CheckOptions(progress=False))
    if not report.ok:
        raise UsageError(f"not registered: {report.summary()}. Run `llamafactory-rocm datasets validate {path}`.")
    backup = _write_info(folder, info_path, {**(info or {}), name: entry}, had_info=info is not None)
    return Registration(info_path, backup, entry, report)


def _file_name(path: Path, folder: Path) -> str:
    """Relative to dataset_dir when the file lies inside it (the folder can move), else absolute."""
    try:
        return path.resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return str(path.resolve())


def _layout(path: Path, formatting: str) -> dict[str, Any]:
    """columns/tags read off the loader's first table: the columns LLaMA-Factory must find."""
    try:
        table = next(iter(stream_tables([path], progress=False)), None)
    except LoadError as err:
        raise UsageError(f"not registered: datasets cannot load {err}.") from None
    if table is None or table.table.num_rows == 0:
        return {}
    columns, row = table.table.column_names, table.table.slice(0, 1).to_pylist()[0]
    if formatting == "alpaca":  # without an input column LLaMA-Factory's default mapping is a KeyError
        return {} if "input" in columns else {"columns": {"prompt": "instruction", "response": "output"}}
    key = next((k for k in ("conversations", "messages") if isinstance(row.get(k), list)), None)
    layout: dict[str, Any] = {"columns": {"messages": key}} if key and key != "conversations" else {}
    first = row[key][0] if key and row[key] else None
    if isinstance(first, dict) and "role" in first and "content" in first:
        layout["tags"] = dict(ROLE_CONTENT_TAGS)
    return layout


def _write_info(folder: Path, info_path: Path, info: dict[str, Any], *, had_info: bool) -> Path | None:
    """Back the old file up (never over another backup), then replace it by a rename."""
    text = json.dumps(info, indent=2, ensure_ascii=False) + "\n"
    backup: Path | None = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if had_info:
            backup = first_free_name(folder, INFO_FILE, ".bak")
            with info_path.open(encoding="utf-8", newline="") as old:  # keep its line ends as they are
                atomic_write_text(backup, old.read(), overwrite=False)
        try:
            atomic_write_text(info_path, text)
        except BaseException:
            if backup is not None:  # the old file is intact: its copy would only be clutter
                backup.unlink(missing_ok=True)
            raise
    except OSError as err:
        raise UsageError(f"cannot write {info_path}: {reason(err)}; nothing was changed.") from None
    return backup
