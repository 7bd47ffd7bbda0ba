"""The dataset part of the pre-launch check: the datasets a training config names, as findings."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..findings import Finding, Level
from ..lf.causes import cause_of
from ..lf.schema import field_default
from ..resources import datasets_dir
from .entry import closest
from .info import INFO_FILE, load_dataset_info
from .validate import CheckOptions, DatasetReport, max_dropped_from_env, rows, validate_entry


def config_dataset_findings(
    config: Mapping[str, Any], cwd: Path, *, read_rows: bool = True
) -> tuple[dict[str, Any], list[Finding]]:
    """Point dataset_dir at the bundled folder when only it has the datasets, then (``read_rows``) check
    each local dataset as LLaMA-Factory will load and convert it. Returns the (possibly updated) config
    and findings. Without ``read_rows`` only the folder is resolved: cheap, and the same on every rank."""
    config = dict(config)
    names = list(dict.fromkeys(dataset_names(config.get("dataset")) + dataset_names(config.get("eval_dataset"))))
    if not names:
        return config, []
    raw_dir = str(config.get("dataset_dir") or field_default("dataset_dir"))
    if raw_dir == "ONLINE" or raw_dir.startswith("REMOTE:"):
        return config, [
            _info_finding("DATASET_ONLINE", f"dataset_dir is {raw_dir}: {', '.join(names)} load from the hub")
        ]
    folder = Path(raw_dir).expanduser()
    folder = folder if folder.is_absolute() else Path(cwd) / folder
    try:
        info = load_dataset_info(folder)
    except UsageError as err:  # malformed: say so, never "unknown dataset"
        return config, [_invalid(str(err), fix_as="info_file", fix_with={"info_file": folder / INFO_FILE})]
    findings: list[Finding] = []
    if info is None or any(n not in info for n in names):
        bundled = datasets_dir()
        bundled_info = _quiet_info(bundled) or {}
        if all(n in bundled_info for n in names):
            config["dataset_dir"] = str(bundled)
            findings.append(_bundled_finding(raw_dir, folder, bundled, names))
            folder, info = bundled, bundled_info
    if not read_rows:
        return config, findings
    options = CheckOptions(
        max_errors=1,
        progress=False,
        num_proc=_workers(config.get("preprocessing_num_workers")),
        stage=_data_stage(config.get("stage")),
        max_dropped=max_dropped_from_env(),
        max_rows=_workers(config.get("max_samples")),
        media_dir=config.get("media_dir"),
    )
    for name in names:
        if info is None or name not in info:
            findings.append(_unknown_finding(name, info, folder))
        else:
            report = validate_entry(name, info[name], folder, options)
            findings += _no_row_read(name, options.max_rows) or _dataset_findings(name, report, folder)
    return config, findings


def _no_row_read(name: str, max_samples: int | None) -> list[Finding]:
    """``max_samples`` 0 (or less) reads no row of any dataset: LLaMA-Factory's loader selects
    ``range(min(max_samples, len(dataset)))`` (data/loader.py _load_single_dataset) and is left with no
    row to train on whatever the file holds (the stock run: a bare StopIteration), so the key is max_samples."""
    if max_samples is None or max_samples > 0:
        return []
    return [
        Finding(
            code="DATASET_INVALID",
            key="max_samples",
            old=max_samples,
            message=f"dataset {name}: max_samples: {max_samples} keeps no row of it (LLaMA-Factory selects the first "
            "max_samples rows of each dataset), so the run has no row to train on (the stock run stops with a bare "
            "StopIteration).",
            fix_as="max_samples keeps no row",
            fix_with={"max_samples": max_samples},
            remedy={"max_samples": None},
        )
    ]


def dataset_names(value: Any) -> list[str]:
    """The names as LLaMA-Factory's ``DataArguments.__post_init__`` splits them (its ``split_arg``: a string
    split at commas and stripped, an empty name kept, so ``dataset: a,`` asks for a dataset called "")."""
    if value is None:
        return []
    try:
        from ..lf.library import data_arguments

        split = data_arguments(dataset=value).dataset
    except ImportError:  # LLaMA-Factory not importable: the same split
        split = [item.strip() for item in value.split(",")] if isinstance(value, str) else value
    if not isinstance(split, (list, tuple)):  # `dataset: 123`: split_arg hands a non-string back as it is
        return [str(split)]
    return [str(item) for item in split]


def _workers(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(.inf)
        return None  # the value rules say so (rules/values.py)


def _quiet_info(folder: Path) -> dict[str, Any] | None:
    try:
        return load_dataset_info(folder)
    except UsageError:
        return None


def _info_finding(code: str, message: str) -> Finding:
    return Finding(
        code=code,
        level=Level.INFO,
        key="dataset",
        message=f"{message}, which cannot be checked offline.",
    )


def _invalid(message: str, **fix: Any) -> Finding:
    return Finding(code="DATASET_INVALID", key="dataset", message=message, **fix)


def _dataset_findings(name: str, report: DatasetReport, folder: Path) -> list[Finding]:
    ignored = [
        Finding(
            code="DATASET_ENTRY_IGNORED",
            key="dataset",
            message=f"dataset {name}: {what}.",
            fix_with={"info_file": folder / INFO_FILE},
        )
        for what in report.ignored
    ]
    return ignored + _verdict_findings(name, report, folder)


def _verdict_findings(name: str, report: DatasetReport, folder: Path) -> list[Finding]:
    if report.remote:
        return [_info_finding("DATASET_REMOTE", f"dataset {name} comes from {report.source}")]
    command = f"llamafactory-rocm datasets validate {shlex.quote(name)} --dataset-dir {shlex.quote(str(folder))}"
    where = report.files[0] if len(report.files) == 1 else report.source
    if not report.ok:
        message = f"dataset {name} ({where}): {rows(report.rows)}, {report.kept} kept; {report.first_problem()}."
        known = {"command": command, "name": name}
        cause = cause_of("DATASET_INVALID", report.first_problem(), {}, given=known)
        case = "rows" if cause.case in ("other", "named keys") else cause.case
        return [_invalid(message, fix_as=case, fix_with={**known, **cause.values}, remedy=cause.remedy)]
    return [
        Finding(
            code="DATASET_ROWS_DROPPED",
            key="dataset",
            message=f"dataset {name} ({where}): {warning}.",
            fix_with={"command": command},
        )
        for warning in report.warnings
        if warning not in report.ignored
    ]


def _bundled_finding(raw_dir: str, folder: Path, bundled: Path, names: list[str]) -> Finding:
    where = f"{folder / INFO_FILE} does not exist" if not (folder / INFO_FILE).is_file() else f"{folder} lacks them"
    return Finding(
        code="DATASET_DIR_BUNDLED",
        key="dataset_dir",
        old=raw_dir,
        new=str(bundled),
        message=f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} bundled with llamafactory-rocm, and {where}.",
        fix_with={"bundled": bundled},
    )


def _unknown_finding(name: str, info: dict[str, Any] | None, folder: Path) -> Finding:
    match = closest(name, set(info or {}) | set(_quiet_info(datasets_dir()) or {}))
    hint = f" Did you mean {match!r}?" if match else ""
    missing = "does not exist" if info is None else f"has no {name!r}"
    return Finding(
        code="DATASET_UNKNOWN",
        key="dataset",
        message=f"dataset {name}: {folder / INFO_FILE} {missing}, so LLaMA-Factory stops with 'Undefined dataset'."
        + hint,
        fix_with={"dataset": shlex.quote(name), "folder": shlex.quote(str(folder))},
    )


def _data_stage(stage: Any) -> str:
    """The stage LLaMA-Factory's workflow passes to its data pipeline (``run_dpo``: "rm")."""
    from ..lf.stages import UnknownStage, data_stage

    try:
        return data_stage(str(stage or "sft"))
    except UnknownStage:  # no workflow: the dry run refuses it (STAGE_UNKNOWN); check the rows as sft
        return "sft"
