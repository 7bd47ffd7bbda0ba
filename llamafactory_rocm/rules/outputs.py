"""Never let a launch overwrite or rotate away checkpoints that are already on disk."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..findings import Finding, Level
from ..lf.schema import output_dir_of
from .base import Context, Step, lf_value, truthy, unchanged


def protect_existing_checkpoints(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if not ctx.existing_outputs:
        return unchanged(config, env)
    where = output_dir_of(config)
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


def resume_only_from_whole_checkpoints(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    """LLaMA-Factory resumes from the newest checkpoint-* in output_dir; one without weights (a save
    that was interrupted) stops the trainer: "Can't find a valid checkpoint"."""
    # get_train_args (0.9.5 hparams/parser.py) never resumes rm/ppo with full or freeze tuning
    # ("can_resume_from_checkpoint = False"); tests/test_rules_target_outputs_multigpu.py pins the line.
    no_resume_stage = str(lf_value(config, "stage", "sft")) in ("rm", "ppo") and str(
        lf_value(config, "finetuning_type", "lora")
    ) in ("full", "freeze")
    resumes = (
        truthy(config.get("do_train", False))
        and not truthy(config.get("overwrite_output_dir", False))
        and config.get("resume_from_checkpoint") in (None, "")
        and not no_resume_stage
    )
    if not resumes or ctx.resume_checkpoint is None or ctx.resume_checkpoint[1]:
        return unchanged(config, env)
    name = ctx.resume_checkpoint[0]
    where = output_dir_of(config)
    return unchanged(
        config,
        env,
        Finding(
            code="CHECKPOINT_UNUSABLE",
            level=Level.ERROR,
            key="output_dir",
            old=name,
            message=f"LLaMA-Factory would resume from {name} in {where}, the newest checkpoint, but it holds no "
            'weights (an interrupted save?): the trainer stops with "Can\'t find a valid checkpoint".',
            fix=f"Move {name} out of {where} (the run then resumes from the one before), set "
            "resume_from_checkpoint to a whole checkpoint, or use a new output_dir.",
        ),
    )
