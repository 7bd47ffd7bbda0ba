"""Will the run fit in device memory? Above the device it is refused, above 90% a warning; both say what fits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..findings import Finding, Level
from ..memory import UNESTIMABLE, TrainingShape, estimate, largest_fitting_batch, shape_and_count
from .base import Context, Step, truthy, unchanged
from .world import world_size

BUDGET = 0.9


def memory_fit(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if ctx.model_config is None or not ctx.snapshot.devices or ctx.snapshot.torch.kind == "cpu":
        return unchanged(config, env)
    world = world_size(config, env, ctx)  # NNODES x NPROC_PER_NODE: ZeRO/FSDP shard over every rank
    try:
        shape, parameters = shape_and_count(ctx.model_config)
        est = estimate(shape, parameters, TrainingShape.from_config(config, world))
    except UNESTIMABLE:  # a value that is not a number: LLaMA-Factory's parser refuses it, with the key
        return unchanged(config, env)
    device_gib = min(d.total_memory_gib for d in ctx.snapshot.devices)
    budget = BUDGET * device_gib
    breakdown = (
        f"weights {est.weights_gib:.1f} + trainable state {est.trainable_state_gib:.1f} + activations "
        f"{est.activations_gib:.1f} + logits {est.logits_gib:.1f} + workspace {est.workspace_gib:.2f}"
    )
    sharding = _sharding(config, world)
    if sharding:
        breakdown += f"; {sharding}"
    if est.total_gib <= budget:
        return unchanged(
            config,
            env,
            Finding(
                code="MEMORY_ESTIMATE",
                level=Level.INFO,
                new=round(est.total_gib, 1),
                message=f"Estimated peak {est.total_gib:.1f} GiB of {device_gib:.1f} GiB per device ({breakdown}).",
                fix="Nothing to do; docs/memory.md explains the estimate.",
            ),
        )
    batch = largest_fitting_batch(shape, parameters, config, budget, world)
    current = int(config.get("per_device_train_batch_size", 8))
    if batch is not None and batch < current:
        fix = f"Set per_device_train_batch_size: {batch} (raise gradient_accumulation_steps to keep the batch)."
    elif truthy(config.get("disable_gradient_checkpointing", False)):
        fix = "Remove disable_gradient_checkpointing (LLaMA-Factory checkpoints by default)."
    elif not config.get("quantization_bit"):
        fix = "Use QLoRA (quantization_bit: 4, bitsandbytes >= 0.49) or lower cutoff_len."
    else:
        fix = "Lower cutoff_len or use a GPU with more memory."
    over = est.total_gib > device_gib  # not a risk but a certainty: the allocator cannot place it
    if over:
        where, outcome = f"is more than the {device_gib:.1f} GiB device", "the run would stop with out-of-memory."
        fix += " If you know better than the estimate, --accept MEMORY_OVER_DEVICE."
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
            fix=fix,
        ),
    )


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
