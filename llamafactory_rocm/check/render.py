"""Human-readable output: snapshot summary, findings, the resolved config as a diff, and the forecast (its
lines said by forecast/render.py)."""

from __future__ import annotations

import json
from typing import Any

from ..findings import Level
from ..forecast.render import block_lines
from ..machine.snapshot import Snapshot
from .run import Report

_ORDER = {Level.ERROR: 0, Level.WARNING: 1, Level.CHANGE: 2, Level.INFO: 3}


def snapshot_summary(snap: Snapshot) -> list[str]:
    t = snap.torch
    build = {"rocm": f"ROCm (HIP {t.hip})", "cuda": f"CUDA {t.cuda}", "cpu": "CPU only", "missing": "missing"}
    lines = [f"machine: {snap.source}; torch {t.version or '-'} {build[t.kind]}"]
    if snap.devices:
        for d in snap.devices:
            lines.append(f"  gpu {d.index}: {d.name}, {d.arch_name} (base {d.base_arch}), {d.total_memory_gib:.1f} GiB")
    else:
        lines.append("  no GPU visible to torch")
    if t.kind == "rocm":
        lines.append(f"  torch built for: {', '.join(t.base_arch_list) or '-'}")
    if snap.kfd_targets:
        lines.append(f"  KFD targets: {', '.join(snap.kfd_targets)}")
    for key in ("PYTORCH_ROCM_ARCH", "HSA_OVERRIDE_GFX_VERSION", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        if key in snap.env:
            lines.append(f"  {key}={snap.env[key]}")
    return lines


def _scalar(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def config_diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    lines = []
    for key in list(dict.fromkeys([*before, *after])):
        if key in before and key not in after:
            lines.append(f"- {key}: {_scalar(before[key])}")
        elif key not in before:
            lines.append(f"+ {key}: {_scalar(after[key])}")
        elif before[key] != after[key]:
            lines.append(f"- {key}: {_scalar(before[key])}")
            lines.append(f"+ {key}: {_scalar(after[key])}")
    return lines


def report_text(report: Report) -> str:
    lines = snapshot_summary(report.snapshot)
    findings = sorted(report.findings, key=lambda f: _ORDER[f.level])
    lines.append("")
    lines.append(f"findings ({len(findings)}):" if findings else "findings: none")
    lines.extend(f"  {f.line()}" for f in findings)
    diff = config_diff(report.input_config, report.config)
    env_diff = [f"+ env {k}={v}" for k, v in report.resolution.env_changes.items()]
    lines.append("")
    if diff or env_diff:
        lines.append("resolved config (diff against the input):")
        lines.extend(f"  {line}" for line in diff + env_diff)
    else:
        lines.append("resolved config: unchanged")
    if report.forecast is not None:  # check --forecast
        lines.append("")
        lines.extend(block_lines(report.forecast.as_json()))
    verdict = "ok: ready to launch" if report.ok else "refused: fix the errors above"
    lines.append("")
    lines.append(verdict)
    return "\n".join(lines)
