"""``validate``: one dataset as LLaMA-Factory will take it, loader first, then its converter.

The entry is read by LLaMA-Factory's own parser (``get_dataset_list``), its files found as
``_load_single_dataset`` finds them, loaded by datasets' own JSON code (``loader``) and every row run
through LLaMA-Factory's converter and drop rule (``rows``). Rows LLaMA-Factory drops with a warning
are a warning here too, unless nothing is left or more than ``max_dropped`` of them go.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..lf.library import data_arguments, dataset_converters, dataset_list, file_types
from .entry import (
    COLUMN_KEYS,
    FORMATTINGS,
    SOURCE_KEYS,
    closest,
    converter_reads,
    did_you_mean,
    entry_warnings,
    json_kind,
    source_of,
)
from .info import INFO_FILE, load_dataset_info
from .loader import LoadError, stream_tables
from .odd_value import odd_value
from .rows import DEFAULT_MAX_ROWS_SHOWN, RowChecker, RowIssue

DEFAULT_MAX_DROPPED = 0.5  # more than half the rows dropped is a mapping mistake, not a few bad rows
MAX_DROPPED_ENV = "LLAMAFACTORY_ROCM_MAX_DROPPED"  # the share for `check` and `train`
CHECKED_TYPES = ("json",)  # FILEEXT2TYPE's types this package loads to check; the others are named only


@dataclass
class DatasetReport:
    """What ``validate_dataset`` found. ``ok``: LLaMA-Factory loads it and trains on what is kept."""

    name: str | None
    source: str
    formatting: str
    files: list[str] = field(default_factory=list)
    rows: int = 0
    kept: int = 0
    dropped: int = 0
    dropped_rows: list[RowIssue] = field(default_factory=list)  # the first max_errors, in load order
    drop_reasons: dict[str, int] = field(default_factory=dict)  # LLaMA-Factory's words -> rows
    failed: int = 0  # rows LLaMA-Factory's converter stops on
    bad_rows: list[RowIssue] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # the warnings that are what LLaMA-Factory ignores in the entry
    remote: bool = False  # no local file_name (a hub, a cloud file, a script): not checked

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def label(self) -> str:
        return self.name or self.source

    def first_problem(self) -> str | None:
        if self.errors:
            return self.errors[0]
        return self.bad_rows[0].text() if self.bad_rows else None

    def summary(self) -> str:
        if self.remote:
            return f"{self.label}: {self.source} is not a local file, not checked"
        first = self.first_problem()
        return f"{self.label}: {rows(self.rows)}, {self.kept} kept" + (f"; first: {first}" if first else "")

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


@dataclass(frozen=True)
class CheckOptions:
    max_errors: int = DEFAULT_MAX_ROWS_SHOWN
    progress: bool | None = None
    num_proc: int | None = None  # preprocessing_num_workers: the processes a folder's files load in
    stage: str = "sft"
    max_dropped: float = DEFAULT_MAX_DROPPED
    max_rows: int | None = None  # max_samples: LLaMA-Factory converts only the first rows
    media_dir: str | None = None


def rows(n: int) -> str:
    """``1 row``, ``3 rows``: counts in messages read as English."""
    return f"{n} row" if n == 1 else f"{n} rows"


def max_dropped_from_env(environ: Any = os.environ) -> float:
    text = environ.get(MAX_DROPPED_ENV)
    if text is None or not text.strip():
        return DEFAULT_MAX_DROPPED
    return parse_share(text, MAX_DROPPED_ENV)


def parse_share(text: str, what: str = "--max-dropped") -> float:
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0.0 <= share <= 1.0:
        raise UsageError(f"{what} must be a share between 0 and 1 (0.1 = a tenth of the rows), not {text!r}.")
    return share


def validate_dataset(
    name_or_file: str | Path,
    dataset_dir: str | Path | None = None,
    *,
    formatting: str | None = None,
    options: CheckOptions | None = None,
) -> DatasetReport:
    """Check a dataset named in ``dataset_dir/dataset_info.json`` (default: the bundled folder), or a
    .json/.jsonl file or a folder of them given as a path (alpaca unless ``formatting`` says otherwise)."""
    from ..resources import datasets_dir

    if formatting is not None and formatting not in FORMATTINGS:
        raise UsageError(f"formatting {formatting!r} is not one of {', '.join(FORMATTINGS)}.")
    text = str(name_or_file)
    as_path = isinstance(name_or_file, Path) or os.sep in text or text.startswith(".") or text.endswith(".jsonl")
    if as_path or text.endswith(".json") or Path(text).is_file():
        path = Path(text)
        if not path.exists():
            raise UsageError(f"{path} not found.")
        entry = {"file_name": str(path.resolve()), "formatting": formatting or "alpaca"}
        return validate_entry(None, entry, path.resolve().parent, options)
    folder = Path(dataset_dir) if dataset_dir is not None else datasets_dir()
    info = load_dataset_info(folder)
    if info is None:
        raise UsageError(f"{folder} has no {INFO_FILE}.")
    if text not in info:
        match = closest(text, info)
        hint = f" (did you mean {match!r}?)" if match else f"; it has {', '.join(sorted(info)) or 'none'}"
        raise UsageError(f"no dataset {text!r} in {folder / INFO_FILE}{hint}.")
    entry = info[text]
    if formatting is not None and isinstance(entry, dict):
        entry = {**entry, "formatting": formatting}
    return validate_entry(text, entry, folder, options)


def validate_entry(
    name: str | None, entry: Any, dataset_dir: Path, options: CheckOptions | None = None
) -> DatasetReport:
    """Check one dataset_info.json entry as LLaMA-Factory reads it and, for a local file_name, every row
    of its data. The entry's errors are LLaMA-Factory's own: where its parser or converter stops."""
    options = options or CheckOptions()
    label = name or "data"
    if not isinstance(entry, dict):
        source, formatting = "?", "?"
    else:
        source, formatting = source_of(entry), str(entry.get("formatting", "alpaca"))
    report = DatasetReport(name, source, formatting)
    try:
        attr = dataset_attr(label, entry, dataset_dir)
    except Exception as err:  # KeyError 'file_name' for an entry with no source, TypeError for a list, ...
        report.errors.append(_parser_stops(entry, err))
        return report
    report.ignored = entry_warnings(entry, attr)
    report.warnings += report.ignored
    converters = dataset_converters()
    if attr.formatting not in converters:  # get_dataset_converter's own test, before any row
        hint = did_you_mean(str(attr.formatting), converters)
        report.errors.append(
            f"formatting {attr.formatting!r}{hint}: LLaMA-Factory stops with 'Dataset converter "
            f"{attr.formatting} not found.' (it has {', '.join(converters)})"
        )
        return report
    if attr.load_from != "file":
        report.remote = True
        report.warnings.append(f"{attr.load_from} datasets are not checked here (only local file_name data is)")
        return report
    # LLaMA-Factory 0.9.5 data/loader.py _get_merged_dataset, mirrored (it loads the data first):
    # options.stage is the data stage the workflow passes (lf/stages.py: dpo -> rm); pinned by
    # tests/test_dataset_converter.py::test_the_ranking_rule_is_llamafactorys.
    stage = options.stage
    if (stage == "rm" and attr.ranking is False) or (stage != "rm" and attr.ranking is True):
        report.errors.append(
            f"ranking is {json.dumps(attr.ranking)} but the stage is {stage}: LLaMA-Factory stops with "
            "'The dataset is not applicable in the current training stage.'"
        )
        return report
    try:  # _load_single_dataset's own join: a file_name that is not a string stops it here
        path = Path(os.path.join(str(dataset_dir), attr.dataset_name))
    except TypeError as err:
        report.errors.append(
            f"file_name is a JSON {json_kind(attr.dataset_name)}: LLaMA-Factory's loader stops with TypeError: {err}"
        )
        return report
    files = _local_files(report, path)
    if files:
        _check_rows(report, files, attr, options, labelled=path.is_dir())
    return report


def _parser_stops(entry: Any, err: Exception) -> str:
    """LLaMA-Factory's get_dataset_list stopping on an entry, in its words and what they mean."""
    words = f"{type(err).__name__}: {err}"
    if isinstance(err, KeyError) and err.args == ("file_name",):
        return f"the entry names no source, so LLaMA-Factory stops with {words} (give one of {', '.join(SOURCE_KEYS)})"
    return f"the entry is a JSON {json_kind(entry)}; LLaMA-Factory's get_dataset_list stops on it with {words}"


def dataset_attr(name: str, entry: Any, dataset_dir: Path) -> Any:
    """The entry as LLaMA-Factory's parser reads it."""
    return dataset_list([name], {name: entry})[0]


def _local_files(report: DatasetReport, path: Path) -> list[Path]:
    """The files ``_load_single_dataset`` gives the loader: a file, or every entry of a folder."""
    suffix_types = file_types()
    if path.is_dir():
        files = [path / name for name in os.listdir(path)]
    elif path.is_file():
        files = [path]
    elif path.exists():
        report.errors.append(f"{path} is not a regular file (a pipe or a device?): give the data as a file")
        return []
    else:
        report.errors.append(f"file not found: {path} (file_name is taken relative to dataset_dir)")
        return []
    report.files = [str(f) for f in files]
    if not files:
        report.errors.append(f"the folder {path} is empty: LLaMA-Factory stops with an IndexError")
        return []
    odd = [f for f in files if not f.is_file()]
    if odd:
        report.errors.append(f"{odd[0]} is not a regular file: a dataset folder may hold data files only")
        return []
    types = {suffix_types.get(f.suffix[1:]) for f in files}
    if None in types:
        report.errors.append(f"{path}: LLaMA-Factory loads only {', '.join(suffix_types)} files")
    elif len(types) > 1:
        report.errors.append(f"{path} mixes file types ({', '.join(sorted(map(str, types)))}): LLaMA-Factory needs one")
    elif types.isdisjoint(CHECKED_TYPES):
        report.warnings.append(f"{', '.join(map(str, types))} files are not checked here (JSON and JSON lines are)")
    else:
        return files
    return []


def _check_rows(report: DatasetReport, files: list[Path], attr: Any, options: CheckOptions, labelled: bool) -> None:
    data_args = data_arguments(dataset_dir=str(Path(report.files[0]).parent), media_dir=options.media_dir)
    checker = RowChecker(attr, data_args, options.stage, limit=options.max_errors)
    reads = converter_reads(attr.formatting)
    mapped = [getattr(attr, key) for key in COLUMN_KEYS if key in reads and isinstance(getattr(attr, key), str)]
    columns: set[str] = set()
    try:
        for batch in stream_tables(files, options.num_proc, options.progress):
            columns.update(batch.table.column_names)
            table = batch.table.select([c for c in batch.table.column_names if c in mapped])
            left = None if options.max_rows is None else max(0, options.max_rows - checker.tally.rows)
            if left is not None and left < table.num_rows:
                table = table.slice(0, left)
            label = batch.file.name if labelled else None
            checker.check(table, batch.row_lines, label)
    except LoadError as err:
        odd = odd_value(err.message, err.file) if err.line is None else None
        report.errors.append(
            f"datasets cannot load it, so LLaMA-Factory stops: {err}" + (f"; {odd.said()}" if odd else "")
        )
    tally = checker.tally
    report.rows, report.kept, report.dropped, report.failed = tally.rows, tally.kept, tally.dropped, tally.failed
    report.dropped_rows, report.bad_rows, report.drop_reasons = tally.dropped_rows, tally.failed_rows, tally.reasons
    if report.errors:
        return
    _judge(report, [c for c in mapped if c not in columns], tally.empty_responses, options.max_dropped)


def _judge(report: DatasetReport, absent: list[str], empty: int, max_dropped: float) -> None:
    """Errors where LLaMA-Factory stops or nothing is left; warnings for what it drops or trains on."""
    if report.failed:
        names = f"{'columns' if len(absent) > 1 else 'column'} {', '.join(map(repr, absent))}"
        missing = f" ({names} in no row: add it or map the entry without it)"
        report.errors.append(
            f"LLaMA-Factory's converter stops on {report.failed} of {rows(report.rows)}"
            f"{missing if absent else ''}; first: {report.bad_rows[0].text()}"
        )
    elif not report.rows:
        report.errors.append("there are no rows: LLaMA-Factory stops with 'Cannot find valid samples'")
    elif report.dropped and not report.kept:
        report.errors.append(
            f"LLaMA-Factory drops all {rows(report.rows)} ({_reasons(report)}), and stops with 'Cannot find valid "
            "samples'. Check the formatting, columns and tags of the entry against the data"
        )
    elif report.dropped > max_dropped * report.rows:
        report.errors.append(
            f"LLaMA-Factory drops {report.dropped} of {rows(report.rows)} ({_reasons(report)}): more than the "
            f"{max_dropped:g} allowed (--max-dropped, or {MAX_DROPPED_ENV} for check and train)"
        )
    elif report.dropped:
        report.warnings.append(
            f"LLaMA-Factory drops {report.dropped} of {rows(report.rows)} with a warning ({_reasons(report)}) "
            f"and trains on the other {report.kept}"
        )
    if empty:
        report.warnings.append(f"{empty} rows have an empty response: LLaMA-Factory trains them to answer nothing")


def _reasons(report: DatasetReport) -> str:
    return ", ".join(f"{count} {reason!r}" for reason, count in report.drop_reasons.items())
