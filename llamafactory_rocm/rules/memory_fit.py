"""Will the run fit in device memory? Above the device it is refused, above 90% a warning; both say what fits.

On an APU (Strix Halo) the GPU's memory is system RAM: the budget is the smaller of torch's
``total_memory`` and the carve-out + GTT the kernel lets the GPU map, and what the run takes is missing on
the CPU side (docs/rocm-facts.md#n9).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..findings import Finding, Level
from ..lf.commands import PLAN
from ..lf.memory import (
    UNESTIMABLE,
    Estimate,
    ModelMemory,
    ModelShape,
    TrainingShape,
    checkpoint_weight_bytes,
    estimate,
    largest_fitting_batch,
    shape_and_count,
)
from ..machine.snapshot import Device
from .base import Context, Step, lf_value, rule, truthy, unchanged
from .world import world_size

BUDGET = 0.9
NODE_GPUS = 8  # GPUs of one MI300X/MI325X/MI355X platform node (OAM baseboard), the node a change may rent
# RAM an APU run should leave to the OS, the Python process and the dataloader: this package's margin,
# not a published figure (docs/rdna4-strixhalo.md says so).
HOST_RESERVE_GIB = 8.0


def device_budget(device: Device) -> tuple[float, str]:
    """(GiB, what the number is) for one device: torch's total, or on an APU the smaller of torch's total
    and carve-out + GTT (docs/rocm-facts.md#n9)."""
    torch_gib = device.total_memory_gib
    unified = device.unified_budget_bytes
    if not device.is_integrated or unified is None:
        if device.is_integrated:
            return torch_gib, f"torch's total_memory {torch_gib:.1f} GiB (carve-out and GTT not read)"
        return torch_gib, ""
    unified_gib = unified / 2**30
    parts = f"carve-out {device.vram_sysfs_bytes / 2**30:.1f} + GTT {device.gtt_sysfs_bytes / 2**30:.1f} GiB"
    if unified_gib < torch_gib:
        return unified_gib, f"{parts} = {unified_gib:.1f} GiB, less than torch's total_memory {torch_gib:.1f} GiB"
    return torch_gib, f"torch's total_memory {torch_gib:.1f} GiB; {parts} = {unified_gib:.1f} GiB is the kernel's cap"


@dataclass(frozen=True)
class _Plan:
    """Everything one estimate was made from, so that each change can be estimated the same way."""

    shape: ModelShape
    parameters: int
    weight_bytes: int
    built: ModelMemory | None
    train: TrainingShape
    est: Estimate
    device_gib: float
    used: str

    def total(self, train: TrainingShape) -> float:
        return estimate(self.shape, self.parameters, train, self.built).total_gib


def _plan(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> _Plan | None:
    if ctx.model_config is None or not ctx.snapshot.devices or ctx.snapshot.torch.kind == "cpu":
        return None
    world = world_size(config, env, ctx)  # NNODES x NPROC_PER_NODE: ZeRO/FSDP shard over every rank
    built = ctx.built_model  # the dry run's count of the model LLaMA-Factory built; else the dense formula
    try:
        shape, parameters = shape_and_count(ctx.model_config)
        weight_bytes = checkpoint_weight_bytes(ctx.model_config)  # LLaMA-Factory loads the checkpoint's dtype
        train = TrainingShape.from_config(config, world, weight_bytes)
        est = estimate(shape, parameters, train, built)
    except UNESTIMABLE:  # a value that is not a number: LLaMA-Factory's parser refuses it, with the key
        return None
    smallest = min(ctx.snapshot.devices, key=lambda d: device_budget(d)[0])
    device_gib, used = device_budget(smallest)
    return _Plan(shape, parameters, weight_bytes, built, train, est, device_gib, used)


def plan_estimate(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Estimate | None:
    """The estimate the rule judges (unrounded), or None where there is none."""
    plan = _plan(config, env, ctx)
    return None if plan is None else plan.est


def estimate_numbers(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> dict[str, float | str] | None:
    """The estimate as numbers, for ``--json``: GiB per device; None where there is none."""
    plan = _plan(config, env, ctx)
    if plan is None:
        return None
    est = plan.est
    return {
        "weights_gib": round(est.weights_gib, 2),
        "trainable_gib": round(est.trainable_state_gib, 2),
        "activations_gib": round(est.activations_gib, 2),
        "logits_gib": round(est.logits_gib, 2),
        "gradients_gib": round(est.gradients_gib, 2),
        "weight_copies_gib": round(est.weight_copies_gib, 2),
        "peak_at": est.peak_moment,
        "peak_gib": round(est.total_gib, 2),
        "device_gib": round(plan.device_gib, 2),
        "activations_from": "traced forward" if est.activations_traced else "formula",
    }


@rule(PLAN)
def memory_fit(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    plan = _plan(config, env, ctx)
    if plan is None:
        return unchanged(config, env)
    est, device_gib, used, world = plan.est, plan.device_gib, plan.used, plan.train.world_size
    budget = BUDGET * device_gib
    starved = host_starved(ctx, est.total_gib)
    breakdown = est.breakdown()
    sharding = _sharding(config, world)
    if sharding:
        breakdown += f"; {sharding}"
    if used:
        breakdown += f"; unified memory, budget from {used}"
    if est.total_gib <= budget:
        return unchanged(
            config,
            env,
            Finding(
                code="MEMORY_ESTIMATE",
                new=round(est.total_gib, 1),
                message=f"Estimated peak {est.total_gib:.1f} GiB of {device_gib:.1f} GiB per device ({breakdown}).",
            ),
            *starved,
        )
    batch = largest_fitting_batch(plan.shape, plan.parameters, config, budget, world, plan.weight_bytes, plan.built)
    current = int(lf_value(config, "per_device_train_batch_size", 8))
    changes = fitting_changes(config, ctx, plan, budget, batch)
    fix_with: dict[str, Any] = {}  # the case's values; the text is the registry's (one case a branch)
    if changes:
        case, fix_with = "changes_that_fit", {"changes": "; ".join(f"{what} ({gib:.1f} GiB)" for what, gib in changes)}
    elif batch is not None and batch < current:
        case, fix_with = "smaller_batch", {"batch": batch}
    elif truthy(config.get("disable_gradient_checkpointing", False)):
        case = "gradient_checkpointing_off"
    elif not config.get("quantization_bit"):
        case = "not_quantized"
    else:
        case = "quantized"
    over = est.total_gib > device_gib  # not a risk but a certainty: the allocator cannot place it
    if over:
        where, outcome = f"is more than the {device_gib:.1f} GiB device", "the run would stop with out-of-memory."
    else:
        where, outcome = f"exceeds 90% of the {device_gib:.1f} GiB device", "expect out-of-memory."
    return unchanged(
        config,
        env,
        Finding(
            code="MEMORY_OVER_DEVICE" if over else "MEMORY_OVER_BUDGET",
            level=Level.ERROR if over else Level.WARNING,
            old=round(est.total_gib, 1),
            new=batch,
            message=f"Estimated peak {est.total_gib:.1f} GiB {where} ({breakdown}): {outcome}",
            fix_as=case,
            fix_with=fix_with,
        ),
        *starved,
    )


def host_starved(ctx: Context, gpu_gib: float) -> list[Finding]:
    """On an APU the GPU's memory is the CPU's: warn where the run leaves the CPU side less than
    HOST_RESERVE_GIB of RAM (MemAvailable where the probe read it, else MemTotal)."""
    integrated = [d for d in ctx.snapshot.devices if d.is_integrated]
    host = ctx.snapshot.host
    ram = host.memory_available_bytes or host.memory_total_bytes
    if not integrated or ram is None:
        return []
    ram_gib = ram / 2**30
    what = "MemAvailable" if host.memory_available_bytes else "MemTotal"
    gpu_total = gpu_gib * len(integrated)
    left = ram_gib - gpu_total
    if left >= HOST_RESERVE_GIB:
        return []
    return [
        Finding(
            code="APU_HOST_MEMORY_LOW",
            old=round(left, 1),
            message=f"Unified memory: the GPU's estimated {gpu_total:.1f} GiB comes out of the {ram_gib:.1f} GiB "
            f"of RAM ({what}), leaving {left:.1f} GiB for the OS, the Python process and the dataloader "
            f"(this package keeps {HOST_RESERVE_GIB:.0f} GiB): expect swapping or the OOM killer.",
        )
    ]


def _sharding(config: Mapping[str, Any], world: int) -> str:
    """What the world size changed in the estimate, said beside the breakdown."""
    shape = TrainingShape.from_config(config, world)
    if world < 2:
        return ""
    if shape.zero_stage >= 3:
        return f"ZeRO-3/FSDP shards the weights and trainable state over world {world}"
    if shape.zero_stage == 2 or (shape.zero_stage == 1 and shape.method != "lora"):
        return f"ZeRO-{shape.zero_stage} shards the trainable state over world {world}"
    return f"world {world}, nothing sharded"


def fitting_changes(
    config: Mapping[str, Any], ctx: Context, plan: _Plan, budget_gib: float, batch: int | None
) -> list[tuple[str, float]]:
    """Changes to the run that bring the estimate under ``budget_gib``, each with its new estimate, in
    the order of what they cost the run: the same tokens per step in smaller batches, shorter sequences,
    a smaller adapter, 4-bit base weights, sharding over the node's GPUs, then another GPU. ``batch``: the
    largest batch that fits (``largest_fitting_batch``; the configured one does not, so it is smaller), searched
    once by the caller."""
    train = plan.train
    found: list[tuple[str, float]] = []

    def consider(what: str, changed: TrainingShape, keys: Mapping[str, Any] | None = None) -> bool:
        """``keys``: the config change that makes ``changed``, where it may need what the target lacks."""
        total = plan.total(changed)
        if total <= budget_gib and not (keys and refused_change(config, keys, ctx)):
            found.append((what, total))
            return True
        return False

    accumulation = int(lf_value(config, "gradient_accumulation_steps", 1))
    # the largest smaller batch that fits (trainer: tokens per step = batch x accumulation)
    if batch is not None:
        steps = math.ceil(train.batch * accumulation / batch)
        what = f"per_device_train_batch_size: {batch} with gradient_accumulation_steps: {steps}"
        consider(what, replace(train, batch=batch))
    if not train.gradient_checkpointing:
        consider("remove disable_gradient_checkpointing", replace(train, gradient_checkpointing=True))
    cutoff = train.cutoff_len // 2
    while cutoff >= 256:
        if consider(f"cutoff_len: {cutoff}", replace(train, cutoff_len=cutoff)):
            break
        cutoff //= 2
    if train.method == "lora" and train.lora_rank > 4:
        rank = train.lora_rank // 2
        smaller = plan
        if plan.built is not None:  # LoRA's A and B are rank x (in + out): linear in the rank
            ratio = rank / train.lora_rank
            built = replace(
                plan.built,
                trainable_parameters=round(plan.built.trainable_parameters * ratio),
                trainable_bytes=round(plan.built.trainable_bytes * ratio),
            )
            smaller = replace(plan, built=built)
        total = smaller.total(replace(train, lora_rank=rank))
        if total <= budget_gib:
            found.append((f"lora_rank: {rank}", total))
    if train.method == "lora" and not train.quantization_bit:
        consider(
            "quantization_bit: 4 (QLoRA, where bitsandbytes runs on the arch)",
            replace(train, quantization_bit=4),
            {"quantization_bit": 4},
        )
    gpus = len(ctx.snapshot.devices)
    if gpus > 1 and train.zero_stage < 3:
        world = max(train.world_size, gpus)
        zero3 = {"deepspeed": "ds_z3_config.json"}  # needs the deepspeed package (LLaMA-Factory's own check)
        consider(
            f"DeepSpeed ZeRO-3 over the node's {world} GPUs", replace(train, zero_stage=3, world_size=world), zero3
        )
    peak = plan.est.total_gib
    fitting = [
        product
        for info in ctx.catalogue.archs.values()
        for product in info.products
        if not product.integrated and product.vram_gib * BUDGET >= peak
    ]
    if fitting:
        product = min(fitting, key=lambda p: p.vram_gib)
        found.append((f"one {product.name} ({product.vram_gib:.0f} GiB, --gpu {product.alias})", peak))
        return found
    largest = max(
        (p for info in ctx.catalogue.archs.values() for p in info.products if not p.integrated),
        key=lambda p: p.vram_gib,
    )
    node = replace(train, zero_stage=3, world_size=max(train.world_size, NODE_GPUS))
    total = plan.total(node)
    if total <= largest.vram_gib * BUDGET:
        found.append((f"{NODE_GPUS} x {largest.name} with DeepSpeed ZeRO-3 (--gpu {largest.alias})", total))
    return found


def refused_change(config: Mapping[str, Any], keys: Mapping[str, Any], ctx: Context) -> list[str]:
    """The error codes that the package rules (rules/packages.py ``require_packages``: LLaMA-Factory's own
    requirements; rules/kernels.py ``bitsandbytes_for_qlora``: the arch's bitsandbytes wheel) give the
    config changed by ``keys`` and not the config as it is: a change that would be refused is no change that
    fits. Planning for another machine, a package missing here is the target's to install, not a refusal."""
    from .kernels import bitsandbytes_for_qlora
    from .packages import require_packages

    def errors(candidate: Mapping[str, Any]) -> set[str]:
        codes: set[str] = set()
        for each in (require_packages, bitsandbytes_for_qlora):
            codes |= {f.code for f in each(candidate, {}, ctx).findings if f.level is Level.ERROR}
        return codes

    return sorted(errors({**config, **keys}) - errors(config))
