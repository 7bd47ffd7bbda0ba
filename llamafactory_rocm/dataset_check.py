"""Dataset definitions: validate dataset_info.json entries and their data files, register new ones,
and the dataset part of the pre-launch check.

LLaMA-Factory finds a bad dataset late: after the model has loaded, as a KeyError, a pyarrow error
or rows dropped with a warning. Here every row is checked the way its converter will read it, in
one streaming pass (bounded memory, line numbers for every defect), before anything is launched.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from array import array
from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .dataset_entry import (
    COLUMN_KEYS,
    DATASET_ATTR_KEYS,
    FORMATTINGS,
    TAG_KEYS,
    closest,
    entry_problems,
    resolve_mapping,
    source_of,
)
from .dataset_parallel import MIN_PARALLEL_BYTES, can_fork, default_jobs, is_json_lines, scan_parallel
from .dataset_rows import RowRules, make_rules, role_content_tags
from .dataset_scan import EMPTY_ARRAY, ScanError, ScanStats, iter_rows
from .dataset_types import LOADER_BATCH_BYTES, MAX_COLUMN_PATHS, ColumnTypes, Where, loader_runs, merge_conflicts
from .errors import UsageError
from .findings import Finding, Level
from .fsutil import atomic_write_text, first_free_name
from .resources import datasets_dir

if TYPE_CHECKING:  # dataset_fast loads numpy and msgspec: only when a file is checked (CLI start-up)
    from .dataset_fast import CleanRange

__all__ = [
    "COLUMN_KEYS",
    "DATASET_ATTR_KEYS",
    "TAG_KEYS",
    "BadRow",
    "DatasetReport",
    "Registration",
    "add_dataset",
    "config_dataset_findings",
    "load_dataset_info",
    "register_dataset",
    "validate_dataset",
    "validate_entry",
]

INFO_FILE = "dataset_info.json"  # llamafactory.extras.constants.DATA_CONFIG
CHECKED_SUFFIXES = (".json", ".jsonl")
LOADABLE_SUFFIXES = (".arrow", ".csv", ".json", ".jsonl", ".parquet", ".txt")  # FILEEXT2TYPE
PROGRESS_MIN_BYTES = 50 << 20
DEFAULT_MAX_ERRORS = 20
_TOKEN_BATCH = 512


@dataclass(frozen=True)
class BadRow:
    line: int
    reason: str
    file: str | None = None  # set when the dataset is a folder of files

    def text(self) -> str:
        where = f"{self.file}:{self.line}" if self.file else f"line {self.line}"
        return f"{where}: {self.reason}"


@dataclass
class DatasetReport:
    """What ``validate_dataset`` found. ``ok`` means LLaMA-Factory will read every row as meant."""

    name: str | None
    source: str
    formatting: str
    files: list[str] = field(default_factory=list)
    layout: str | None = None
    rows: int = 0
    bad_rows: list[BadRow] = field(default_factory=list)  # the first max_errors, in line order
    bad_row_count: int = 0
    errors: list[str] = field(default_factory=list)  # the entry or the file as a whole
    warnings: list[str] = field(default_factory=list)
    missing_columns: dict[str, str] = field(default_factory=dict)  # data column -> columns key
    remote: bool = False  # no local file_name (a hub, a cloud file, a script): not checked
    tokens: dict[str, int] | None = None

    @property
    def ok(self) -> bool:
        return not self.errors and self.bad_row_count == 0

    @property
    def label(self) -> str:
        return self.name or self.source

    def first_problem(self) -> str | None:
        if self.errors:
            return self.errors[0]
        return self.bad_rows[0].text() if self.bad_rows else None

    def summary(self) -> str:
        """One line: rows, bad rows, and the first problem."""
        counts = f"{self.rows} rows" + (f", {self.bad_row_count} bad" if self.bad_row_count else "")
        if self.remote:
            return f"{self.label}: {self.source} is not a local file, not checked"
        first = self.first_problem()
        return f"{self.label}: {counts}" + (f"; first: {first}" if first else "")

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "formatting": self.formatting,
            "files": self.files,
            "layout": self.layout,
            "ok": self.ok,
            "rows": self.rows,
            "bad_row_count": self.bad_row_count,
            "bad_rows": [{"line": b.line, "reason": b.reason, "file": b.file} for b in self.bad_rows],
            "errors": self.errors,
            "warnings": self.warnings,
            "remote": self.remote,
            "tokens": self.tokens,
        }


# -- dataset_info.json ----------------------------------------------------------------------------


def load_dataset_info(dataset_dir: Path) -> dict[str, Any] | None:
    """The parsed dataset_info.json of a folder; None when it has none; UsageError when unreadable."""
    path = Path(dataset_dir) / INFO_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read {path}: {_reason(err)}") from None
    try:
        info = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{path} is not valid JSON: {err.msg} at line {err.lineno}. Fix it first.") from None
    except (ValueError, RecursionError) as err:  # nested past Python's limit, or an integer of 4,300+ digits
        raise UsageError(f"{path} cannot be read as JSON here ({type(err).__name__}: {err}). Fix it first.") from None
    if not isinstance(info, dict):
        raise UsageError(f"{path} must hold a JSON object of dataset names, not a list or value.")
    return info


def _reason(err: BaseException) -> str:
    return getattr(err, "strerror", None) or str(err).splitlines()[0]


# -- validation -----------------------------------------------------------------------------------


def validate_dataset(
    name_or_file: str | Path,
    dataset_dir: str | Path | None = None,
    *,
    formatting: str | None = None,
    tokenizer: str | Path | None = None,
    max_errors: int = DEFAULT_MAX_ERRORS,
    progress: bool | None = None,
    jobs: int = 1,
    fast: bool = True,
    loader_processes: int | None = None,
) -> DatasetReport:
    """Check a dataset named in ``dataset_dir/dataset_info.json`` (default: the bundled folder), or a
    .json/.jsonl file or a folder of them (``./parts``) directly (alpaca columns unless ``formatting``
    says otherwise).

    ``jobs`` > 1 (0: one per core) scans a big JSON-lines file in forked worker processes: for a
    command-line process, not for one that may hold threads, such as a training process.
    ``fast=False`` skips the clean-file fast path (``dataset_fast``): the same report, slower.
    ``loader_processes``: the config's preprocessing_num_workers, for a folder's files that load in
    parallel; None, not known: both one process and one process a file are checked for.
    """
    if formatting is not None and formatting not in FORMATTINGS:
        raise UsageError(f"formatting {formatting!r} is not one of {', '.join(FORMATTINGS)}.")
    options = _ScanOptions(
        max_errors=max_errors,
        tokens=_token_counter(tokenizer),
        progress=progress,
        jobs=min(jobs, os.cpu_count() or 1) if jobs else default_jobs(),  # no more workers than cores
        fast=fast,
        loader_processes=loader_processes,
    )
    if _is_folder_argument(name_or_file):  # a folder of files, as a file_name may name one
        path = Path(name_or_file).resolve()
        entry = {"file_name": str(path), "formatting": formatting or "alpaca"}
        return validate_entry(None, entry, path.parent, options=options)
    if _is_file_argument(name_or_file):
        path = Path(name_or_file)
        if not path.is_file():
            raise UsageError(f"{path} {'is not a regular file' if path.exists() else 'not found'}.")
        entry = {"file_name": str(path.resolve()), "formatting": formatting or "alpaca"}
        return validate_entry(None, entry, path.parent, options=options)
    folder = Path(dataset_dir) if dataset_dir is not None else datasets_dir()
    info = load_dataset_info(folder)
    if info is None:
        raise UsageError(f"{folder} has no {INFO_FILE}.")
    name = str(name_or_file)
    if name not in info:
        raise UsageError(f"no dataset {name!r} in {folder / INFO_FILE}{_closest_names(name, info)}.")
    entry = dict(info[name]) if isinstance(info[name], dict) else info[name]
    if formatting is not None and isinstance(entry, dict):
        entry["formatting"] = formatting
    return validate_entry(name, entry, folder, options=options)


@dataclass(frozen=True)
class _ScanOptions:
    max_errors: int = DEFAULT_MAX_ERRORS
    tokens: _TokenCounter | None = None
    progress: bool | None = None
    jobs: int = 1  # worker processes for a big JSON-lines file (0: one per core, up to 8)
    fast: bool = True  # offer JSON-lines ranges to the fast path first
    loader_processes: int | None = None  # preprocessing_num_workers; None: not known (dataset_types.loader_runs)


def validate_entry(
    name: str | None, entry: Any, dataset_dir: Path, *, options: _ScanOptions | None = None
) -> DatasetReport:
    """Check one dataset_info.json entry and, for a local file_name, every row of its data."""
    options = options or _ScanOptions()
    checked = entry_problems(entry)
    if not isinstance(entry, dict):
        return DatasetReport(name, "?", "?", errors=checked.errors)
    mapping = resolve_mapping(entry)
    source = source_of(entry)
    report = DatasetReport(
        name,
        source="?" if source is None else str(source[1]),
        formatting=mapping.formatting,
        errors=list(checked.errors),
        warnings=list(checked.warnings),
    )
    if source is None or mapping.formatting not in FORMATTINGS:
        return report
    key, value = source
    if key != "file_name":  # a hub, a cloud file or a loading script: nothing to read offline
        report.remote = True
        report.warnings.append(f"{key} datasets are not checked here (only local file_name data is)")
        return report
    if not isinstance(value, str) or not value.strip():
        return report
    _check_local(report, Path(dataset_dir) / value, make_rules(mapping), options)
    return report


def _check_local(report: DatasetReport, path: Path, rules: RowRules, options: _ScanOptions) -> None:
    """A file, or a folder of files as LLaMA-Factory takes them (every entry of os.listdir)."""
    if path.is_dir():  # in LLaMA-Factory's order (os.listdir): the first file's first batch fixes the types
        files = [path / name for name in os.listdir(path)]
        labelled = True
    elif path.is_file():
        files, labelled = [path], False
    elif path.exists():  # a FIFO or a device: reading it could block for ever
        report.errors.append(_not_a_regular_file(path))
        return
    else:
        report.errors.append(f"file not found: {path} (file_name is taken relative to dataset_dir)")
        return
    if not files:
        report.errors.append(f"the folder {path} is empty")
        return
    suffixes = {f.suffix.lower().replace(".jsonl", ".json") for f in files}
    if len(suffixes) > 1:
        report.errors.append(f"{path} mixes file types ({', '.join(sorted(suffixes))}): LLaMA-Factory needs one")
    report.files = [str(f) for f in files]
    # The loader skips a file of 0 bytes in a folder: the first batch is the next file's.
    skipped = {n for n, file in enumerate(files) if _size(file) == 0} if labelled else set()
    if skipped and len(skipped) == len(files):
        report.errors.append(f"every file in {path} is empty: there are no rows")
        return
    batch_file = min(set(range(len(files))) - skipped)
    first_batch = first_batch_lines(files[batch_file])
    rules.types.one_batch = len(files) == 1 and first_batch is None
    labels = [file.name if labelled else None for file in files]
    good = 0
    runs = _LoaderRuns(labels, skipped, batch_file, first_batch, options.loader_processes)
    for number, (file, label) in enumerate(zip(files, labels, strict=True)):
        good += _check_file(report, file, rules, options, label, runs.types_for(number))
        runs.file_done(number, file, report)
    if labelled and not report.rows and not report.errors:
        report.errors.append(f"no file in {path} holds a row")
    late = rules.types.late_rows(first_batch, batch_file=batch_file)
    good -= _add_late_rows(report, rules.types, late, options.max_errors, runs.merge_rows() + runs.late_rows)
    if rules.types.overflow is not None:
        where = rules.types.place(rules.types.overflow)
        report.warnings.append(
            f"more than {MAX_COLUMN_PATHS:,} column paths (keys used as ids?): the types of those first seen from "
            f"{where} on are not checked, and pyarrow makes every key a column of its own"
        )
    if good:  # with no good row at all, a column never seen is a symptom of the bad rows, not news
        for column, key in rules.unseen.items():
            report.missing_columns[column] = key
            report.errors.append(missing_column_error(column, key))
    if options.tokens is not None:
        report.tokens = options.tokens.percentiles()


def _not_a_regular_file(name: str | Path) -> str:
    return f"{name} is not a regular file (a pipe or a device?): give the data as a file"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size if path.is_file() else -1
    except OSError:
        return -1  # reported by the scan


def missing_column_error(column: str, key: str) -> str:
    return (
        f"column '{column}' (columns.{key}) is in no row: LLaMA-Factory reads it on every row and stops "
        f"with KeyError: '{column}'. Add it to the rows, or map the columns explicitly without {key}"
    )


def first_batch_lines(path: Path) -> int | None:
    """The lines of a JSON-lines file that datasets parses first, whose types fix everyone's: its first
    10 MB and the rest of that line (``datasets/packaged_modules/json/json.py``). None: all of them
    (a file of up to 10 MB, or a JSON array, which pandas reads whole)."""
    try:
        if path.stat().st_size <= LOADER_BATCH_BYTES or not is_json_lines(path):
            return None
        newlines, left = 0, LOADER_BATCH_BYTES
        with open(path, "rb") as handle:
            while left > 0:  # a megabyte at a time: validation's memory stays flat
                piece = handle.read(min(left, 1 << 20))
                if not piece:
                    break
                newlines, left = newlines + piece.count(b"\n"), left - len(piece)
        return newlines + 1
    except OSError:
        return None  # reported by the scan


class _LoaderRuns:
    """A folder's files as parallel processes load them: in runs (``loader_runs``), each with the
    types of its own first batch, which fix the rest of the run, and the runs' first batches must
    merge. Each run's types are kept only while it is read (memory)."""

    def __init__(
        self,
        labels: list[str | None],
        skipped: set[int],
        batch_file: int,
        first_batch: int | None,
        processes: int | None,
    ) -> None:
        self.labels, self.skipped, self.processes = labels, skipped, processes
        self.batch_file, self.first_batch = batch_file, first_batch  # the dataset's: its first run's
        self.runs = {run.start: run for run in loader_runs(len(labels), processes)}
        self.kinds: dict[int, dict] = {}  # each run's first-batch kinds, by the number of the file they are from
        self.late_rows: list[tuple[Where, str]] = []  # where later runs stop their own load
        self._run, self._types, self._first, self._batch = range(0), None, None, None

    def types_for(self, number: int) -> ColumnTypes | None:
        """Where to keep the types of file ``number``'s rows also apart (None: one process)."""
        if number in self.runs:
            self._run, self._types, self._first = self.runs[number], ColumnTypes(), None
        return self._types

    def file_done(self, number: int, file: Path, report: DatasetReport) -> None:
        types, run = self._types, self._run
        if types is None:
            return
        if self._first is None and number not in self.skipped:  # the file whose first batch fixes the run's
            self._first = number  # (the dataset's first batch is already counted: up to 10 MB not read again)
            self._batch = self.first_batch if number == self.batch_file else first_batch_lines(file)
            self.kinds[number] = types.first_batch_kinds(self._batch, number - run.start)
        if number < run.stop - 1:
            return
        first = self._first
        # The first run's late rows are the one process's (ColumnTypes.late_rows of the whole dataset).
        if first is not None and first != self.batch_file and (self._batch is not None or number > first):
            self.late_rows += _run_late_rows(types, self._batch, run, first, self.labels[first])
        if first is None:  # the error says it all: no warning that the loader skips them
            names = [self.labels[n] for n in run]
            report.warnings = [w for w in report.warnings if w not in {_skipped_warning(n) for n in names}]
            report.errors.append(_empty_run_error(names, self.processes, len(self.labels)))
        self._types = None

    def merge_rows(self) -> list[tuple[Where, str]]:
        """Where a later run's first batch types a column in a way the first run's cannot merge with."""
        first, found = self.batch_file, []
        for number, later in self.kinds.items():
            if number == first:
                continue
            labels = str(self.labels[first]), str(self.labels[number])
            for (_, line), reason in merge_conflicts(self.kinds[first], later, *labels):
                found.append(((number, line), reason))
        return found


def _skipped_warning(name: str | None) -> str:
    return f"{name} is empty (0 bytes): LLaMA-Factory's loader skips it"


def _empty_run_error(names: list[str | None], processes: int | None, files: int) -> str:
    """A process whose run of files is all 0 bytes has nothing to take types from, and stops the load."""
    if processes is None:  # not known: one process a file is one of the cases checked for
        where = f"{names[0]} is empty (0 bytes): with preprocessing_num_workers {files} or more it loads in a process"
        where += " of its own"
    elif len(names) == 1:
        where = f"{names[0]} is empty (0 bytes) and loads in a process of its own (preprocessing_num_workers)"
    else:
        where = (
            f"{', '.join(map(str, names))} are all empty (0 bytes) and make up the run of files one process "
            "loads (preprocessing_num_workers)"
        )
    return (
        f"{where}, which then stops the load (datasets: SchemaInferenceError: Please pass `features` or at "
        "least one example). Remove the empty files"
    )


def _run_late_rows(
    run_types: ColumnTypes, run_batch: int | None, run: range, first: int, label_of: str | None
) -> list[tuple[Where, str]]:
    """Where a later run of a folder's files stops its own load: in parallel, the first batch of the
    run's first file (``first``, by number) fixes the types of the rest of the run, as the first file's
    does in one process."""
    if len(run) == 1:
        batch_of = f"{label_of}, which loads in a process of its own (preprocessing_num_workers)"
    else:
        which = "first" if first == run.start else "first not empty"
        batch_of = f"{label_of}, the {which} of the {len(run)} files one process loads (preprocessing_num_workers)"
    late = run_types.late_rows(run_batch, batch_of, batch_file=first - run.start)
    return [((run.start + file, line), reason) for (file, line), reason in late]


def _add_late_rows(
    report: DatasetReport,
    types: ColumnTypes,
    late_rows: list[tuple[Where, str]],
    max_errors: int,
    more: list[tuple[Where, str]],
) -> int:
    """Put the rows where the loader's first batch stops the load (``late_rows``, and ``more`` of that
    kind) among the bad rows, in load order (they were good rows: nothing else is wrong with them).
    Returns how many."""
    found = dict(late_rows)
    for where, reason in more:
        found.setdefault(where, reason)  # one reason a row
    late = sorted(found.items())
    if not late:
        return 0
    order = {label: number for number, label in enumerate(types.files)}

    def key(row: BadRow) -> tuple[int, int]:
        return order.get(row.file, 0), row.line

    rows = [BadRow(line, reason, types.files[number]) for (number, line), reason in late]
    if report.bad_row_count > len(report.bad_rows) and report.bad_rows:  # only the first max_errors kept:
        last = key(report.bad_rows[-1])  # a late row after the last one kept may follow rows not kept
        rows = [row for row in rows if key(row) < last]
    report.bad_rows = sorted(report.bad_rows + rows, key=key)[:max_errors]
    report.bad_row_count += len(late)
    return len(late)


def _check_file(
    report: DatasetReport,
    path: Path,
    rules: RowRules,
    options: _ScanOptions,
    label: str | None,
    own: ColumnTypes | None = None,
) -> int:
    """Scan one file into the report; returns its number of good rows. ``own``: where to keep the
    types of this file's rows also apart (those of one loading process's run of files)."""
    rules.types.file_number(label)  # files load in this order: the first one's first batch fixes the types
    if own is not None:
        own.file_number(label)
    if path.is_dir():
        report.errors.append(
            f"{path.name} is a folder: LLaMA-Factory hands every entry of the dataset folder to datasets as a file "
            "and stops (File types should be identical). Move it out of the dataset folder"
        )
        return 0
    if path.exists() and not path.is_file():  # a FIFO or a device: reading it could block for ever
        report.errors.append(_not_a_regular_file(path.name))
        return 0
    suffix = path.suffix.lower()
    if suffix not in LOADABLE_SUFFIXES:
        report.errors.append(f"{path.name}: LLaMA-Factory loads only {', '.join(LOADABLE_SUFFIXES)} files")
        return 0
    if suffix not in CHECKED_SUFFIXES:
        report.warnings.append(f"{path.name}: only JSON and JSON-lines rows are checked, not {suffix}")
        return 0
    try:
        rules.types.json_lines = is_json_lines(path)  # pyarrow reads it; pandas reads a JSON array
        if own is not None:
            own.json_lines = rules.types.json_lines
        size = path.stat().st_size
        if size == 0 and label is not None:
            report.warnings.append(_skipped_warning(path.name))
            return 0
        with _ProgressBar(path, size, options.progress) as bar:
            if _parallel(path, size, options):
                good = _scan_rows_parallel(report, path, rules, options, label, bar.update, own)
                if good is not None:
                    return good
                bar.restart()  # ranges whose column types disagree: read again, in one pass
            elif options.fast and options.tokens is None and is_json_lines(path):
                from .dataset_fast import prove_clean

                assert rules.mapping is not None
                clean = prove_clean(path, 0, size, rules.mapping, bar.update)
                if clean is not None and _record_clean(report, rules, clean, label, own):
                    return clean.rows
                bar.restart()  # not proven: every byte is read again, line by line
            return _scan_rows(report, path, rules, options, label, bar.update, own)
    except OSError as err:
        report.errors.append(f"cannot read {path}: {_reason(err)}")
        return 0


def _scan_rows(
    report: DatasetReport,
    path: Path,
    rules: RowRules,
    options: _ScanOptions,
    label: str | None,
    on_bytes: Callable[[int], None] | None,
    own: ColumnTypes | None = None,
) -> int:
    """The hot loop: one check per row; bad rows past max_errors are only counted. Returns good rows."""
    stats = ScanStats()
    check, text, tokens, types = rules.check, rules.text, options.tokens, rules.types
    good = bad_rows = not_rows = 0
    bad = report.bad_rows
    for line, value in iter_rows(path, stats, on_bytes=on_bytes):
        reason = check(value)
        if reason is None:
            reason = types.conflict(value, line, label)
        if reason is None:
            good += 1
            if tokens is not None:
                tokens.add(text(value))
            if own is not None:
                own.conflict(value, line, label)  # its clashes are the dataset's too, reported just above
            continue
        if label is not None and type(value) is ScanError and value.message == EMPTY_ARRAY:
            report.warnings.append(f"{path.name} is an empty JSON array ([]): there are no rows")  # as a blank file
            continue
        bad_rows += 1
        if type(value) is ScanError and not value.is_row:
            not_rows += 1  # a file-level defect or bad bytes on a line, not a row of its own
        if len(bad) < options.max_errors:
            bad.append(BadRow(line, reason, label))
    report.rows += good + bad_rows - not_rows
    report.bad_row_count += bad_rows
    report.layout = report.layout or stats.layout
    # A folder's file without rows is the loader's to skip (or to take its types from: _check_local).
    said = report.errors if label is None else report.warnings
    if stats.empty:
        said.append(f"{path.name} is empty: there are no rows")
    elif good + bad_rows - not_rows == 0 and not bad_rows:
        said.append(f"{path.name} holds no rows")
    return good


def _record_clean(
    report: DatasetReport, rules: RowRules, clean: CleanRange, label: str | None, own: ColumnTypes | None = None
) -> bool:
    """A file the fast path proved clean: what ``_scan_rows`` would have recorded, without a row read
    in Python. (Every line one whole row, so the line-by-line scan reads the same rows, line for line.)
    False, recording nothing, where its column types disagree with an earlier file's: scan it then."""
    if rules.types.disagreement(clean.types) is not None:
        return False
    rules.types.absorb(clean.types, file=label)
    if own is not None:
        own.absorb(clean.types, file=label)
    report.rows += clean.rows
    report.layout = report.layout or "json-lines"
    for column in clean.types.seen_columns():
        rules.unseen.pop(column, None)
    return True


def _parallel(path: Path, size: int, options: _ScanOptions) -> bool:
    return (
        options.jobs > 1
        and options.tokens is None  # a tokenizer holds threads: no fork under it
        and size >= MIN_PARALLEL_BYTES
        and can_fork()
        and is_json_lines(path)
    )


def _scan_rows_parallel(
    report: DatasetReport,
    path: Path,
    rules: RowRules,
    options: _ScanOptions,
    label: str | None,
    on_bytes: Callable[[int], None] | None,
    own: ColumnTypes | None = None,
) -> int | None:
    """As ``_scan_rows``, over byte ranges in worker processes; the same report, line for line
    (but for the one case in ``dataset_parallel``'s docstring). None, recording nothing, where a
    range's column types clash with those before it or within it: each range checked its rows
    against its own first rows, so only one pass over the file can say which rows stray, and where
    their columns got their types; the caller makes it."""
    assert rules.mapping is not None
    good = 0
    unseen = set(rules.unseen)
    ranges = list(scan_parallel(path, rules.mapping, options.max_errors, options.jobs, on_bytes, fast=options.fast))
    if any(part.type_conflicts or part.types.overflow is not None for _, part in ranges):
        # A row strays (its reason names where its column got its type), or a range kept no more
        # paths (a column the file knows may be new to it): only one pass knows.
        return None
    types = rules.types.copy()
    for offset, part in ranges:
        if types.disagreement(part.types, offset) is not None:
            return None
        types.absorb(part.types, offset, label)
    rules.types = types
    if own is not None:
        for offset, part in ranges:
            own.absorb(part.types, offset, label)
    for offset, part in ranges:
        good += part.good
        report.rows += part.good + part.bad_count - part.not_rows
        report.bad_row_count += part.bad_count
        room = options.max_errors - len(report.bad_rows)
        report.bad_rows += [BadRow(offset + line, reason, label) for line, reason in part.bad_rows[: max(room, 0)]]
        unseen &= part.unseen
        report.layout = report.layout or part.layout
    for column in [c for c in rules.unseen if c not in unseen]:
        del rules.unseen[column]
    return good


def _is_folder_argument(name_or_file: str | Path) -> bool:
    """A folder written as a path (``./parts``, ``data/parts``), not a bare name that could be a dataset's."""
    text = str(name_or_file)
    return Path(text).is_dir() and (isinstance(name_or_file, Path) or os.sep in text or text.startswith("."))


def _is_file_argument(name_or_file: str | Path) -> bool:
    """A Path, an existing file or a .json/.jsonl name is a file; anything else is a dataset name."""
    text = str(name_or_file)
    return isinstance(name_or_file, Path) or text.endswith(CHECKED_SUFFIXES) or Path(text).is_file()


def _closest_names(name: str, info: Mapping[str, Any]) -> str:
    match = closest(name, info)
    return f" (did you mean {match!r}?)" if match else f"; it has {', '.join(sorted(info)) or 'none'}"


# -- progress and token lengths -------------------------------------------------------------------


class _ProgressBar:
    """A byte-counting tqdm bar on stderr for a big file when stderr is a terminal; else nothing."""

    def __init__(self, path: Path, size: int, wanted: bool | None) -> None:
        show = wanted if wanted is not None else (size >= PROGRESS_MIN_BYTES and sys.stderr.isatty())
        self._bar = None
        if show:
            from tqdm import tqdm

            self._bar = tqdm(total=size, unit="B", unit_scale=True, desc=path.name, file=sys.stderr, leave=False)
        self.update: Callable[[int], None] | None = self._bar.update if self._bar is not None else None

    def restart(self) -> None:
        if self._bar is not None:
            self._bar.reset()

    def __enter__(self) -> _ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()


class _TokenCounter:
    """Token lengths of the rows' text (before the chat template), batched through a fast tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._pending: list[str] = []
        self._lengths = array("I")

    def add(self, text: str) -> None:
        self._pending.append(text)
        if len(self._pending) >= _TOKEN_BATCH:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            ids = self._tokenizer(self._pending, add_special_tokens=False)["input_ids"]
            self._lengths.extend(len(x) for x in ids)
            self._pending.clear()

    def percentiles(self) -> dict[str, int] | None:
        self._flush()
        if not self._lengths:
            return None
        ordered = sorted(self._lengths)
        return {
            "p50": _nearest_rank(ordered, 50),
            "p90": _nearest_rank(ordered, 90),
            "p99": _nearest_rank(ordered, 99),
            "max": ordered[-1],
        }


def _nearest_rank(ordered: list[int], percent: int) -> int:
    index = max(0, -(-len(ordered) * percent // 100) - 1)
    return ordered[index]


def _token_counter(tokenizer: str | Path | None) -> _TokenCounter | None:
    if tokenizer is None:
        return None
    path = Path(tokenizer)
    if not path.is_dir():
        raise UsageError(f"tokenizer folder {path} not found (give a local folder with tokenizer files).")
    try:
        from transformers import AutoTokenizer

        loaded = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as err:  # transformers raises many kinds; any of them means "not a tokenizer"
        raise UsageError(f"cannot load a tokenizer from {path}: {str(err).splitlines()[0]}") from None
    return _TokenCounter(loaded)


# -- registration ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Registration:
    info_path: Path
    backup: Path | None  # the previous dataset_info.json, kept
    entry: dict[str, Any]
    report: DatasetReport


def register_dataset(
    file: str | Path,
    name: str,
    formatting: str = "alpaca",
    dataset_dir: str | Path = "data",
    force: bool = False,
) -> Path:
    """Validate ``file`` and add it to ``dataset_dir/dataset_info.json`` as ``name``; returns that path."""
    return add_dataset(file, name, formatting, dataset_dir, force=force).info_path


def add_dataset(
    file: str | Path,
    name: str,
    formatting: str = "alpaca",
    dataset_dir: str | Path = "data",
    *,
    force: bool = False,
    max_errors: int = DEFAULT_MAX_ERRORS,
) -> Registration:
    """``register_dataset`` with everything the CLI prints: the backup, the entry and the report."""
    _check_name(name)
    if formatting not in FORMATTINGS:
        raise UsageError(f"formatting {formatting!r} is not one of {', '.join(FORMATTINGS)}.")
    path = Path(file)
    if not path.is_file():
        raise UsageError(f"{path} not found.")
    if path.suffix.lower() not in CHECKED_SUFFIXES:
        raise UsageError(f"{path}: register takes .json or .jsonl files.")
    folder = Path(dataset_dir)
    info = load_dataset_info(folder) if folder.is_dir() else None
    info_path = folder / INFO_FILE
    if info is not None and name in info and not force:
        raise UsageError(
            f"dataset {name!r} is already in {info_path}. Pass --force to replace it "
            "(the old file is kept as a backup)."
        )
    entry = _entry_for(path, formatting, folder)
    report = validate_entry(name, entry, folder, options=_ScanOptions(max_errors))
    entry = _drop_unseen_optional(entry, report)
    if not report.ok:
        raise UsageError(f"not registered: {report.summary()}. Run `llamafactory-rocm datasets validate {path}`.")
    new_info = {**(info or {}), name: entry}
    backup = _write_info(folder, info_path, new_info, had_info=info is not None)
    return Registration(info_path, backup, entry, report)


def _check_name(name: str) -> None:
    if not name or name != name.strip():
        raise UsageError("give the dataset a name without leading or trailing spaces (--name).")
    if "," in name:
        raise UsageError(f"dataset name {name!r} has a comma: LLaMA-Factory splits `dataset:` at commas.")


def _entry_for(path: Path, formatting: str, folder: Path) -> dict[str, Any]:
    entry: dict[str, Any] = {"file_name": _file_name(path, folder), "formatting": formatting}
    if formatting != "alpaca":
        entry.update(_chat_layout(_first_row(path)))
    return entry


def _file_name(path: Path, folder: Path) -> str:
    """Relative to dataset_dir when the file lies inside it (the folder can move), else absolute."""
    resolved, base = path.resolve(), folder.resolve()
    try:
        return resolved.relative_to(base).as_posix()
    except ValueError:
        return str(resolved)


def _first_row(path: Path) -> dict[str, Any] | None:
    with closing(iter_rows(path)) as rows:
        for _, value in rows:
            return value if isinstance(value, dict) else None
    return None


def _chat_layout(row: dict[str, Any] | None) -> dict[str, Any]:
    """columns/tags for a chat file, read off its first row: the messages key, and role/content tags."""
    if row is None:
        return {}
    layout: dict[str, Any] = {}
    key = next((k for k in ("conversations", "messages") if isinstance(row.get(k), list)), None)
    if key and key != "conversations":
        layout["columns"] = {"messages": key}
    messages = row.get(key) if key else None
    if messages and isinstance(messages[0], dict) and "role" in messages[0] and "content" in messages[0]:
        layout["tags"] = role_content_tags()
    return layout


def _drop_unseen_optional(entry: dict[str, Any], report: DatasetReport) -> dict[str, Any]:
    """An alpaca file without any "input" is fine once the entry stops mapping it (else KeyError)."""
    if report.missing_columns.keys() != {"input"} or "columns" in entry or entry["formatting"] != "alpaca":
        return entry
    report.errors.remove(missing_column_error("input", "query"))
    report.missing_columns.clear()
    return {**entry, "columns": {"prompt": "instruction", "response": "output"}}


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
        raise UsageError(f"cannot write {info_path}: {_reason(err)}; nothing was changed.") from None
    return backup


# -- pre-launch check -----------------------------------------------------------------------------


def config_dataset_findings(config: Mapping[str, Any], cwd: Path) -> tuple[dict[str, Any], list[Finding]]:
    """The datasets a training config names: point dataset_dir at the bundled folder when only it has
    them, then check each local dataset. Returns the (possibly updated) config and the findings."""
    config = dict(config)
    names = _dataset_names(config.get("dataset")) + _dataset_names(config.get("eval_dataset"))
    names = list(dict.fromkeys(names))  # both lists may name a dataset; check it once
    if not names:
        return config, []
    raw_dir = str(config.get("dataset_dir") or "data")
    if raw_dir == "ONLINE" or raw_dir.startswith("REMOTE:"):
        return config, [_online_finding(raw_dir, names)]
    folder = _resolve_dir(raw_dir, cwd)
    info = _safe_info(folder)
    findings: list[Finding] = []
    if info is None or any(n not in info for n in names):
        bundled = datasets_dir()
        bundled_info = _safe_info(bundled) or {}
        if all(n in bundled_info for n in names):
            config["dataset_dir"] = str(bundled)
            findings.append(_bundled_finding(raw_dir, folder, bundled, names))
            folder, info = bundled, bundled_info
    processes = _loader_processes(config.get("preprocessing_num_workers"))
    for name in names:
        findings.append(_dataset_finding(name, info, folder, processes))
    return config, [f for f in findings if f is not None]


def _loader_processes(workers: Any) -> int | None:
    """The processes LLaMA-Factory loads a folder's files in: preprocessing_num_workers (unset: one);
    None where it is not a number (LLaMA-Factory's own parser says so)."""
    if workers is None:
        return 1
    try:
        return int(workers)
    except (TypeError, ValueError):
        return None


def _dataset_names(value: Any) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return [str(item).strip() for item in items if str(item).strip()]


def _resolve_dir(raw: str, cwd: Path) -> Path:
    path = Path(raw).expanduser()
    return path if path.is_absolute() else Path(cwd) / path


def _safe_info(folder: Path) -> dict[str, Any] | None:
    try:
        return load_dataset_info(folder)
    except UsageError:
        return None


def _online_finding(raw_dir: str, names: list[str]) -> Finding:
    return Finding(
        code="DATASET_ONLINE",
        level=Level.INFO,
        key="dataset_dir",
        message=f"dataset_dir is {raw_dir}: {', '.join(names)} load from the hub, which cannot be checked offline.",
        fix="Nothing to do here; the hub must be reachable when training starts.",
    )


def _bundled_finding(raw_dir: str, folder: Path, bundled: Path, names: list[str]) -> Finding:
    where = f"{folder / INFO_FILE} does not exist" if not (folder / INFO_FILE).is_file() else f"{folder} lacks them"
    return Finding(
        code="DATASET_DIR_BUNDLED",
        level=Level.CHANGE,
        key="dataset_dir",
        old=raw_dir,
        new=str(bundled),
        message=f"{', '.join(names)} are bundled with llamafactory-rocm, and {where}.",
        fix=f"Set dataset_dir to the bundled folder {bundled}.",
    )


def _dataset_finding(name: str, info: dict[str, Any] | None, folder: Path, processes: int | None) -> Finding | None:
    if info is None or name not in info:
        return _unknown_finding(name, info, folder)
    options = _ScanOptions(max_errors=1, progress=False, loader_processes=processes)
    report = validate_entry(name, info[name], folder, options=options)
    if report.remote:
        return Finding(
            code="DATASET_REMOTE",
            level=Level.INFO,
            key="dataset",
            message=f"dataset {name} comes from {report.source}, which cannot be checked offline.",
            fix="Nothing to do here; the hub must be reachable when training starts.",
        )
    if report.ok:
        return None
    return Finding(
        code="DATASET_INVALID",
        level=Level.ERROR,
        key="dataset",
        message=_invalid_message(name, report),
        fix=f"Run `llamafactory-rocm datasets validate {shlex.quote(name)} --dataset-dir {shlex.quote(str(folder))}"
        f"{_workers_flag(processes, report)}`"
        " to list every bad row, then fix the data or its dataset_info.json entry.",
    )


def _workers_flag(processes: int | None, report: DatasetReport) -> str:
    """The config's loading processes, where they matter (a folder): validate then checks the same."""
    return f" --preprocessing-num-workers {processes}" if processes is not None and len(report.files) > 1 else ""


def _invalid_message(name: str, report: DatasetReport) -> str:
    where = report.files[0] if len(report.files) == 1 else report.source
    counts = f"{report.rows} rows, {report.bad_row_count} bad"
    first = report.first_problem() or "see the validate output"
    return f"dataset {name} ({where}): {counts}; first: {first}."


def _unknown_finding(name: str, info: dict[str, Any] | None, folder: Path) -> Finding:
    known = set(info or {}) | set(_safe_info(datasets_dir()) or {})
    match = closest(name, known)
    hint = f" Did you mean {match!r}?" if match else ""
    where = folder / INFO_FILE
    missing = "does not exist" if info is None else f"has no {name!r}"
    return Finding(
        code="DATASET_UNKNOWN",
        level=Level.ERROR,
        key="dataset",
        message=f"dataset {name}: {where} {missing}, so LLaMA-Factory stops with 'Undefined dataset'.{hint}",
        fix=(
            f"Fix the name, or add the data with `llamafactory-rocm datasets register FILE --name {shlex.quote(name)}"
            f" --dataset-dir {shlex.quote(str(folder))}`."
        ),
    )
