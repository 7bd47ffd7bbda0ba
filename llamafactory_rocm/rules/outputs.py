"""Never let a launch overwrite or rotate away checkpoints that are already on disk."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..findings import Finding, Level
from .base import Context, Step, truthy, unchanged


def protect_existing_checkpoints(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if not ctx.existing_outputs:
        return unchanged(config, env)
    where = config.get("output_dir", "trainer_output")
    shown = ", ".join(ctx.existing_outputs[:3]) + (" ..." if len(ctx.existing_outputs) > 3 else "")
    findings = []
    if truthy(config.get("overwrite_output_dir", False)):
        findings.append(
            Finding(
                code="CHECKPOINT_OVERWRITE",
                level=Level.ERROR,
                key="overwrite_output_dir",
                message=f"overwrite_output_dir: true would write over {shown} in {where}.",
                fix="Choose a new output_dir, or remove overwrite_output_dir to resume from the last checkpoint.",
            )
        )
    checkpoints = [name for name in ctx.existing_outputs if name.startswith("checkpoint-")]
    if checkpoints and config.get("save_total_limit") not in (None, "", "null"):
        findings.append(
            Finding(
                code="CHECKPOINT_ROTATION",
                level=Level.ERROR,
                key="save_total_limit",
                old=config.get("save_total_limit"),
                message=f"save_total_limit: {config.get('save_total_limit')} would delete the existing "
                f"{', '.join(checkpoints[:3])} in {where} as new ones are saved.",
                fix="Choose a new output_dir, or remove save_total_limit for this resumed run.",
            )
        )
    return unchanged(config, env, *findings)


def plot_the_loss(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    """A training run draws LLaMA-Factory's own loss plot (training_loss.png) unless the config says."""
    trains = truthy(config.get("do_train", False))
    if "plot_loss" in config or not trains or ctx.installed is None or "matplotlib" not in ctx.installed:
        return unchanged(config, env)
    return Step(
        {**config, "plot_loss": True},
        dict(env),
        [
            Finding(
                code="PLOT_LOSS_ADDED",
                level=Level.CHANGE,
                key="plot_loss",
                new=True,
                message="plot_loss was unset: LLaMA-Factory draws no loss curve by default.",
                fix="Added plot_loss: true (training_loss.png in output_dir); set plot_loss: false to skip it.",
            )
        ],
    )
