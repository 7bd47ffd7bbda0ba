"""Is the installed torch a ROCm build with kernels for every visible GPU?

Sources: docs/rocm-facts.md#f1, docs/rocm-facts.md#f2; an override on a natively supported card:
docs/rocm-facts.md#n12.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..findings import Finding
from ..lf.commands import CHAT, EVAL, TRAIN
from .base import EXPORT_ON_GPU, Context, Step, rule, unchanged


@rule(TRAIN, EXPORT_ON_GPU, CHAT, EVAL)
def require_rocm_torch(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    snap = ctx.snapshot
    if snap.torch.kind == "missing":
        return unchanged(
            config,
            env,
            Finding(
                code="TORCH_MISSING",
                message="torch is not installed.",
            ),
        )
    amd_present = bool(snap.kfd_targets)
    if amd_present and snap.torch.kind != "rocm":
        return unchanged(
            config,
            env,
            Finding(
                code="TORCH_NOT_ROCM",
                old=snap.torch.version,
                message=f"This machine has AMD GPUs ({', '.join(snap.kfd_targets)}) but torch "
                f"{snap.torch.version} is a {snap.torch.kind.upper()} build, so it sees no GPU "
                "(pip re-resolved torch from a CUDA index).",
            ),
        )
    if snap.torch.kind == "rocm" and not snap.devices:
        return unchanged(
            config,
            env,
            Finding(
                code="ROCM_NO_DEVICE",
                message="torch is a ROCm build but sees no GPU (hipErrorNoDevice).",
            ),
        )
    return unchanged(config, env)


@rule(TRAIN, EXPORT_ON_GPU, CHAT, EVAL)
def require_kernels_for_devices(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if not ctx.rocm:
        return unchanged(config, env)
    built = ctx.snapshot.torch.base_arch_list
    findings = []
    for arch, info in ctx.arch_infos():
        if arch in built:
            continue
        fix_with = {"arch": arch}
        if info is not None and info.hsa_override and info.hsa_override_target in built:
            case = "override"
            fix_with.update(override=info.hsa_override, override_target=info.hsa_override_target, family=info.family)
        elif info is not None and not info.in_official_torch_wheels:
            case = "build_not_in_official_wheels"
        else:
            case = "build"
        findings.append(
            Finding(
                code="ARCH_NOT_IN_TORCH",
                key="torch.cuda.get_arch_list()",
                old=arch,
                message=f"torch {ctx.snapshot.torch.version} has no kernels for {arch} (built for "
                f"{', '.join(built) or 'nothing'}): expect hipErrorNoBinaryForGpu.",
                fix_as=case,
                fix_with=fix_with,
            )
        )
    return unchanged(config, env, *findings)


_HSA_RE = re.compile(r"^(\d+)\.(\d+)\.([0-9a-fA-F]+)$")


def override_target(value: str) -> str | None:
    """``HSA_OVERRIDE_GFX_VERSION=11.0.0`` -> ``gfx1100``; ``9.0.10`` -> ``gfx90a``."""
    match = _HSA_RE.match(value.strip())
    if not match:
        return None
    major, minor, stepping = match.groups()
    return f"gfx{int(major)}{int(minor)}{int(stepping):x}"


def family_of(target: str, ctx: Context) -> str:
    info = ctx.catalogue.arch(target)
    # Targets outside the catalogue (gfx1031, gfx1032) share their family with the siblings whose
    # name differs only in the last digit.
    return info.family if info else f"{target[:-1]}x"


def _override_examples(ctx: Context) -> str:
    """``gfx1101/gfx1102 -> 11.0.0, ...``: the catalogue's overrides used in the wild (docs/rocm-facts.md#f2)."""
    return ", ".join(f"{'/'.join(o.targets)} -> {o.value}" for o in ctx.catalogue.hsa_overrides_in_the_wild)


@rule(TRAIN, EXPORT_ON_GPU, CHAT, EVAL)
def check_hsa_override(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    value = env.get("HSA_OVERRIDE_GFX_VERSION")
    if not value or not (ctx.rocm or ctx.snapshot.kfd_targets):
        return unchanged(config, env)
    spoofed = override_target(value)
    if spoofed is None:
        return unchanged(
            config,
            env,
            Finding(
                code="HSA_OVERRIDE_MALFORMED",
                key="HSA_OVERRIDE_GFX_VERSION",
                old=value,
                message=f"HSA_OVERRIDE_GFX_VERSION={value!r} is not MAJOR.MINOR.STEPPING.",
            ),
        )
    real = ctx.snapshot.kfd_targets or ctx.snapshot.gpu_base_archs
    findings = []
    for target in dict.fromkeys(real):
        if family_of(target, ctx) != family_of(spoofed, ctx):
            findings.append(
                Finding(
                    code="HSA_OVERRIDE_CROSS_FAMILY",
                    key="HSA_OVERRIDE_GFX_VERSION",
                    old=value,
                    message=f"HSA_OVERRIDE_GFX_VERSION={value} makes {target} run {spoofed} kernels, "
                    "another family: expect HSA_STATUS_ERROR_INVALID_ISA.",
                    fix_with={"examples": _override_examples(ctx)},
                )
            )
        elif target != spoofed and target in ctx.snapshot.torch.base_arch_list:
            findings.append(override_not_needed(value, target, spoofed))
        elif target != spoofed:
            findings.append(
                Finding(
                    code="HSA_OVERRIDE_ACTIVE",
                    key="HSA_OVERRIDE_GFX_VERSION",
                    old=value,
                    message=f"{target} runs {spoofed} kernels through HSA_OVERRIDE_GFX_VERSION={value}.",
                    fix_with={"spoofed": spoofed},
                )
            )
    return unchanged(config, env, *findings)


def override_not_needed(value: str, target: str, spoofed: str) -> Finding:
    """The override on a card torch has kernels for: unneeded, and reported to fault (docs/rocm-facts.md#n12)."""
    return Finding(
        code="HSA_OVERRIDE_NOT_NEEDED",
        key="HSA_OVERRIDE_GFX_VERSION",
        old=value,
        message=f"HSA_OVERRIDE_GFX_VERSION={value} makes {target} run {spoofed} kernels although torch has "
        f"{target} kernels of its own: the override is a debugging aid, reported to cause memory access faults "
        "and hangs on natively supported cards (ROCm/legacy-rocm-build#5238, #5824).",
        fix_with={"target": target},
    )
