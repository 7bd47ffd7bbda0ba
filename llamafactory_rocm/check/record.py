"""The launch record: what went in, what was changed and why, on which machine, with which versions, the check's
forecast of the run (``"forecast"``, forecast/run.py), and once the run ended what it measured beside that forecast
(``"run"``, added by train/summary.py)."""

from __future__ import annotations

import json
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from ..fsutil import atomic_write_text, first_free_name
from .config_io import dump_yaml
from .report import Report

RECORD_STEM = "rocm_launch"
RESOLVED_STEM = "rocm_resolved"
RECORD_SCHEMA_VERSION = 1


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("llamafactory-rocm", "llamafactory", "torch", "transformers", "peft", "accelerate"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def build_record(report: Report, origin: str, resolved_yaml: str | None) -> dict[str, Any]:
    return {
        "schema_version": RECORD_SCHEMA_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "origin": origin,
        "config_path": report.config_path,
        "ok": report.ok,
        "input_config": report.input_config,
        "resolved_config": report.config,
        "env_changes": report.resolution.env_changes,
        "findings": [f.model_dump(mode="json") for f in report.findings],
        "target": None if report.target is None else report.target.__dict__,
        "snapshot": report.snapshot.model_dump(mode="json"),
        "versions": versions(),
        "resolved_yaml": resolved_yaml,
        # the check's forecast (forecast/run.py Forecast or NoForecast as JSON); None where none was asked for
        "forecast": None if report.forecast is None else report.forecast.as_json(),
    }


def write_launch_files(report: Report, output_dir: Path, origin: str, node: int | None = None) -> tuple[Path, Path]:
    """Write ``rocm_resolved.yaml`` and ``rocm_launch.json`` into output_dir, atomically.

    An earlier run's files are never replaced: a resumed run gets ``rocm_launch.1.json`` and so on. ``node``:
    a node of a multi-node run whose output_dir is not the one the world's rank 0 wrote to
    (``rocm_launch.node1.json``).
    """
    output_dir.mkdir(parents=True, exist_ok=True)
    suffix = "" if node is None else f".node{node}"
    resolved = first_free_name(output_dir, RESOLVED_STEM + suffix, ".yaml")
    header = f"# Resolved by llamafactory-rocm from {report.config_path or 'a dict'}; see {RECORD_STEM}*.json\n"
    atomic_write_text(resolved, header + dump_yaml(report.config), overwrite=False)
    record_path = first_free_name(output_dir, RECORD_STEM + suffix, ".json")
    record = build_record(report, origin, resolved.name)
    atomic_write_text(record_path, json.dumps(record, indent=2, default=str) + "\n", overwrite=False)
    return resolved, record_path


def latest_record(output_dir: str | Path) -> dict[str, Any]:
    """The newest launch record in output_dir (tests and people read it)."""
    records = sorted(Path(output_dir).glob(f"{RECORD_STEM}*.json"), key=lambda p: p.stat().st_mtime_ns)
    if not records:
        raise FileNotFoundError(f"no {RECORD_STEM}.json in {output_dir}")
    return json.loads(records[-1].read_text(encoding="utf-8"))


def _add(record_path: Path, key: str, value: Any) -> None:
    record = json.loads(record_path.read_text(encoding="utf-8"))
    record[key] = value
    atomic_write_text(record_path, json.dumps(record, indent=2, default=str) + "\n", overwrite=True)


def add_nodes(record_path: Path, nodes: list[dict[str, Any]]) -> None:
    """Add every node's facts (from the nodes' agreement) to the world's one record, atomically."""
    _add(record_path, "nodes", nodes)


def add_run(record_path: Path, run: dict[str, Any]) -> None:
    """Add what the finished run measured, beside the check's forecast (train/summary.py ``run_record``)."""
    _add(record_path, "run", run)


def record_of(output_dir: str | Path, config: dict[str, Any]) -> tuple[Path, dict[str, Any]] | None:
    """The newest launch record in output_dir of this resolved config (``llamafactory-rocm train`` wrote it
    before handing over; the hook inside finds its forecast there), or None."""
    wanted = json.loads(json.dumps(config, default=str))  # as build_record wrote it
    records = sorted(Path(output_dir).glob(f"{RECORD_STEM}*.json"), key=lambda p: p.stat().st_mtime_ns)
    for path in reversed(records):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # another run's broken file is not this run's record
            continue
        if isinstance(record, dict) and record.get("resolved_config") == wanted:
            return path, record
    return None
