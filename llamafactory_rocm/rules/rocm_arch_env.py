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

from ..catalogue import TARGET_ID_RE, Catalogue, base_arch
from ..findings import Finding, Level
from .base import Context, Step, unchanged

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
