"""Which GPUs the run will see: an iGPU beside the Radeon card, and the three visibility variables.

The ROCm runtime applies ``ROCR_VISIBLE_DEVICES`` first; HIP then applies ``HIP_VISIBLE_DEVICES``, or
``CUDA_VISIBLE_DEVICES`` only where that is unset, to the devices left (docs/rocm-facts.md#n11). An iGPU
enumerated beside a discrete card makes LLaMA-Factory start one rank on it (docs/rocm-facts.md#n10).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..findings import Finding, Level
from ..lf.commands import CHAT, EVAL, TRAIN
from .base import EXPORT_ON_GPU, Context, Step, rule, unchanged

ROCR, HIP, CUDA = "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"


def parse_visible(value: str) -> list[str]:
    """``"0, 2"`` -> ``["0", "2"]``; an empty value hides every device."""
    return [item.strip() for item in value.split(",") if item.strip()]


def _indices(items: Sequence[str]) -> list[int] | None:
    """Integer indices, or None where an entry is a UUID (``GPU-...``) this package cannot place."""
    return [int(i) for i in items] if all(i.isdigit() for i in items) else None


def hip_value_for(keep: Sequence[int], env: Mapping[str, str]) -> str:
    """The HIP_VISIBLE_DEVICES that keeps torch devices ``keep``: torch numbers what the current HIP (or
    CUDA) list left, so an existing list is indexed, not replaced blindly."""
    current = env.get(HIP) if HIP in env else env.get(CUDA)
    if current is not None:
        items = parse_visible(current)
        if all(0 <= i < len(items) for i in keep):
            return ",".join(items[i] for i in keep)
    return ",".join(str(i) for i in keep)


@rule(TRAIN, EXPORT_ON_GPU, CHAT, EVAL)
def integrated_gpu_visible(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    hidden = ctx.integrated_devices
    keep = [d.index for d in ctx.snapshot.devices]
    if not hidden or not keep:
        return unchanged(config, env)
    value = hip_value_for(keep, env)
    built = ctx.snapshot.torch.base_arch_list
    no_kernels = [d for d in hidden if d.base_arch not in built]
    igpus = ", ".join(f"{d.index} ({d.name}, {d.base_arch})" for d in hidden)
    cards = ", ".join(f"{d.index} ({d.name}, {d.base_arch})" for d in ctx.snapshot.devices)
    if no_kernels:
        outcome = (
            f"torch has no kernels for {', '.join(sorted({d.base_arch for d in no_kernels}))}, so the rank "
            "LLaMA-Factory starts on it fails (hipErrorNoBinaryForGpu), and some wheels then fail on the card too"
        )
    else:
        outcome = "LLaMA-Factory would start a rank on it, and the run crawls at the iGPU's pace"
    return unchanged(
        config,
        env,
        Finding(
            code="IGPU_VISIBLE",
            level=Level.ERROR if no_kernels else Level.WARNING,
            key=HIP,
            old=env.get(HIP),
            new=value,
            message=f"torch sees the integrated GPU {igpus} beside device {cards}: {outcome}. "
            f"This check plans on device {','.join(map(str, keep))} only.",
            fix_with={"HIP": HIP, "devices": value},
        ),
    )


def _select(pool: list[Any], items: list[str] | None) -> tuple[list[Any], list[str]]:
    """Apply one visibility list to ``pool``: (selected, entries that name nothing)."""
    if items is None:
        return list(pool), []
    chosen, unknown = [], []
    for item in items:
        if item.isdigit() and int(item) < len(pool):
            chosen.append(pool[int(item)])
        else:
            unknown.append(item)
    return chosen, unknown


@rule(TRAIN, EXPORT_ON_GPU, CHAT, EVAL)
def visibility_conflict(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    """Two or three visibility variables set and disagreeing: which one applies, what the run sees."""
    if not (ctx.rocm or ctx.snapshot.kfd_targets):
        return unchanged(config, env)
    lists = {name: parse_visible(env[name]) for name in (ROCR, HIP, CUDA) if name in env}
    if len(lists) < 2:
        return unchanged(config, env)
    if any(_indices(items) is None for items in lists.values()):
        uuid_note = " (a UUID entry: this check cannot tell which GPU it names)"
    else:
        uuid_note = ""
    # The physical GPUs in ROCr's order: KFD's GPU nodes (HIP follows KFD-node order, docs/rocm-facts.md#n10).
    gpus = [f"GPU {i} ({target})" for i, target in enumerate(ctx.snapshot.kfd_targets)]
    assumed = not gpus  # no KFD topology (WSL2, a planned target): as many GPUs as the lists name
    if assumed:
        named = [int(i) for items in lists.values() for i in items if i.isdigit()]
        gpus = [f"GPU {i}" for i in range(max(named, default=-1) + 1)]
    rocr = lists.get(ROCR)
    hip_name = HIP if HIP in lists else CUDA if CUDA in lists else None
    hip = lists.get(hip_name) if hip_name else None
    survivors, _ = _select(gpus, rocr)
    seen, _ = _select(survivors, hip)
    alone = {name: _select(gpus, items)[0] for name, items in lists.items()}
    if not uuid_note and all(sel == seen for sel in alone.values()):
        return unchanged(config, env)  # set together but saying the same thing
    steps = []
    if rocr is not None:
        steps.append(f"{ROCR}={env[ROCR]} is applied first, by the ROCm runtime")
    if hip_name is not None:
        then = "then indexes the devices left" if rocr is not None else "selects"
        steps.append(f"{hip_name}={env[hip_name]} {then}")
    if HIP in lists and CUDA in lists:
        steps.append(f"{CUDA}={env[CUDA]} is ignored while {HIP} is set")
    too_long = rocr is not None and hip is not None and len(hip) > len(rocr)
    result = f"the run sees {len(seen)}: {', '.join(seen)}" if seen else "the run sees no GPU"
    if assumed:
        result += " (no KFD topology here: assuming the GPUs the lists name exist)"
    if too_long:
        result += f"; torch refuses the launch: {hip_name} lists more devices than {ROCR}"
    error = too_long or (not seen and not uuid_note)
    # ROCm recommends ROCR_VISIBLE_DEVICES on Linux: one variable, in physical numbering.
    physical = [gpus.index(g) for g in seen]
    others = " ".join(n for n in (HIP, CUDA) if n in lists)
    return unchanged(
        config,
        env,
        Finding(
            code="VISIBLE_DEVICES_CONFLICT",
            level=Level.ERROR if error else Level.WARNING,
            key=hip_name or ROCR,
            old={name: env[name] for name in lists},
            new=physical or None,
            message=f"{', '.join(lists)} are set together{uuid_note}: " + "; ".join(steps) + f"; {result}.",
            fix_as="devices_seen" if seen else "no_device_seen",
            fix_with={"physical_devices": ",".join(map(str, physical)), "other_variables": others} if seen else {},
        ),
    )
