"""PYTORCH_ROCM_ARCH must list valid targets and cover every visible GPU.

It is read when extensions are JIT-built (DeepSpeed FusedAdam/CPUAdam, custom kernels) by
``torch.utils.cpp_extension._get_rocm_arch_flags``. Unset, extensions build for every arch torch
knows (slow, and fails when hipcc lacks one); wrong, they fail at run time with
``HIP error: invalid device function`` (docs/rocm-facts.md#p1; F3).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..findings import Finding, Level
from ..machine.catalogue import TARGET_ID_RE, Catalogue, base_arch
from .base import Context, Step, unchanged
from .kernels import version_tuple

VAR = "PYTORCH_ROCM_ARCH"


@dataclass(frozen=True)
class BadTarget:
    text: str
    reason: str
    suggestion: str | None


def parse_rocm_arch(value: str, catalogue: Catalogue) -> tuple[list[str], list[BadTarget]]:
    """Split a ``;``- or space-separated list; return (valid targets, bad entries)."""
    good: list[str] = []
    bad: list[BadTarget] = []
    if not value.strip():
        return good, [BadTarget(value, "it is empty", None)]
    # Empty items between separators (``gfx942;;``) are malformed: torch would pass an empty
    # --offload-arch to hipcc.
    items = re.split(r";|\s+", value.strip())
    for item in items:
        if item == "":
            bad.append(BadTarget(item, "it has an empty entry (doubled or trailing ';')", None))
            continue
        match = TARGET_ID_RE.match(item.lower())
        if not match:
            bad.append(BadTarget(item, "it is not a gfx target", catalogue.nearest_target(item)))
        elif catalogue.arch(match.group(1)) is None:
            bad.append(BadTarget(item, "it is not a known AMD target", catalogue.nearest_target(item)))
        else:
            good.append(item.lower())
    return good, bad


def target_features(target: str) -> dict[str, str]:
    """``gfx942:sramecc+:xnack-`` -> ``{"sramecc": "+", "xnack": "-"}``; no suffix: ``{}`` (either)."""
    match = TARGET_ID_RE.match(target.strip().lower())
    if not match or not match.group(2):
        return {}
    return {item[:-1]: item[-1] for item in match.group(2).split(":") if item}


def _feature_conflicts(good: list[str], ctx: Context) -> list[tuple[str, str, str]]:
    """(entry, device arch name, contradicted feature) for entries whose suffix the device cannot load.

    Code built with ``xnack+`` (or ``-``) loads only where the device has the same setting; an entry
    without the suffix loads on either (docs/rocm-facts.md#p2).
    """
    conflicts = []
    for entry in good:
        wanted = target_features(entry)
        for device in ctx.snapshot.devices:
            if device.base_arch != base_arch(entry):
                continue
            have = target_features(device.arch_name)
            clash = [f"{k}{v}" for k, v in wanted.items() if k in have and have[k] != v]
            if clash:
                conflicts.append((entry, device.arch_name, ", ".join(clash)))
                break
    return conflicts


def check_pytorch_rocm_arch(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    value = env.get(VAR)
    devices = ctx.snapshot.gpu_base_archs if ctx.rocm else []
    if value is None:
        if not devices:
            return unchanged(config, env)
        new_env = dict(env)
        new_env[VAR] = ";".join(devices)
        return Step(
            dict(config),
            new_env,
            [
                Finding(
                    code="ROCM_ARCH_SET",
                    level=Level.CHANGE,
                    key=VAR,
                    new=new_env[VAR],
                    message=f"{VAR} was unset, so extensions built at launch (DeepSpeed ops) would "
                    "compile for every arch torch knows.",
                    fix=f"Set {VAR}={new_env[VAR]} for this run, the arch of the GPUs present.",
                )
            ],
        )
    good, bad = parse_rocm_arch(value, ctx.catalogue)
    findings = []
    for entry in bad:
        hint = f" Did you mean {entry.suggestion!r}?" if entry.suggestion else ""
        findings.append(
            Finding(
                code="ROCM_ARCH_MALFORMED",
                level=Level.ERROR,
                key=VAR,
                old=value,
                message=f"{VAR}={value!r}: {entry.text!r} is invalid because {entry.reason}.",
                fix=f"Use ';'-separated gfx targets such as gfx942 or gfx90a:xnack-.{hint}",
            )
        )
    findings += _retired(value, good, ctx)
    conflicts = _feature_conflicts(good, ctx) if ctx.rocm else []
    if conflicts:
        fixed = [base_arch(t) if any(t == c[0] for c in conflicts) else t for t in good]
        findings.append(
            Finding(
                code="ROCM_ARCH_FEATURE_MISMATCH",
                level=Level.ERROR,
                key=VAR,
                old=value,
                new=";".join(dict.fromkeys(fixed)),
                message="; ".join(
                    f"{VAR} entry {entry} asks for {clash}, but the GPU here is {device}"
                    for entry, device, clash in conflicts
                )
                + ": code built for it does not load there (hipErrorNoBinaryForGpu / invalid device function).",
                fix=f"export {VAR}={';'.join(dict.fromkeys(fixed))} (no suffix builds code that loads either way).",
            )
        )
    covered = {base_arch(t) for t in good}
    missing = [arch for arch in devices if arch not in covered]
    if missing and not bad:
        findings.append(
            Finding(
                code="ROCM_ARCH_MISSES_DEVICE",
                level=Level.ERROR,
                key=VAR,
                old=value,
                new=";".join(dict.fromkeys([*good, *missing])),
                message=f"{VAR}={value} does not include {', '.join(missing)}, the GPU here: "
                "extensions built for it fail with 'HIP error: invalid device function'.",
                fix=f"export {VAR}={';'.join(devices)}",
            )
        )
    return unchanged(config, env, *findings)


def _retired(value: str, good: list[str], ctx: Context) -> list[Finding]:
    """gfx940/gfx941: pre-production MI300 targets, removed from LLVM and ROCm 7.0 (docs/rocm-facts.md#p3)."""
    retired = [t for t in good if (info := ctx.catalogue.arch(t)) is not None and info.retired]
    if not retired:
        return []
    hip = ctx.snapshot.torch.hip or ""
    # ROCm 7.0's compilers refuse them; older ones build code no shipping GPU runs.
    refused = bool(hip) and version_tuple(hip) >= (7, 0)
    kept = [t for t in good if t not in retired] or ["gfx942"]
    return [
        Finding(
            code="ROCM_ARCH_RETIRED",
            level=Level.ERROR if refused else Level.WARNING,
            key=VAR,
            old=value,
            new=";".join(dict.fromkeys(kept)),
            message=f"{VAR}={value} lists {', '.join(retired)}, pre-production MI300 targets removed from LLVM "
            "and ROCm 7.0"
            + (f": ROCm {hip}'s compiler refuses them." if refused else "; no shipping GPU is one (MI300X is gfx942)."),
            fix=f"export {VAR}={';'.join(dict.fromkeys(kept))}",
        )
    ]
