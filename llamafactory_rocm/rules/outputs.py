"""What already lies in output_dir: said before a launch writes over it or rotates it away.

What the user set is done, not refused: ``overwrite_output_dir: true`` is a warning naming what goes;
``save_total_limit`` on a run that resumes rotates that run's own checkpoints (said as info), and is
refused only where it would delete the checkpoints of another experiment (another base model or adapter
shape) lying in the same folder. Which checkpoint a run resumes from is LLaMA-Factory's choice, read by
the dry run (lf/dry_resume.py, ``CHECKPOINT_NOT_LOADABLE``, ``CHECKPOINT_MISMATCH``), not restated here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..findings import Finding, Level
from ..lf.commands import TRAIN
from ..lf.schema import output_dir_of
from .base import Context, Step, lf_value, rule, truthy, unchanged


@rule(TRAIN)
def protect_existing_checkpoints(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if not ctx.existing_outputs:
        return unchanged(config, env)
    where = output_dir_of(config)
    if truthy(config.get("overwrite_output_dir", False)):
        shown = ", ".join(ctx.existing_outputs[:3]) + (" ..." if len(ctx.existing_outputs) > 3 else "")
        return unchanged(
            config,
            env,
            Finding(
                code="CHECKPOINT_OVERWRITE",
                key="overwrite_output_dir",
                message=f"overwrite_output_dir: true: the run starts over instead of resuming, and {shown} in "
                f"{where} go as it saves over them"
                + (" and rotates them away (save_total_limit)." if _rotation_limit(config) else "."),
            ),
        )
    checkpoints = [name for name in ctx.existing_outputs if name.startswith("checkpoint-")]
    limit = _rotation_limit(config)
    if not checkpoints or limit is None or not truthy(config.get("do_train", False)):
        return unchanged(config, env)
    from ..lf.outputs import other_experiments

    resumed = _resumed_from(config, ctx, where)
    if resumed is None:  # a fresh run (rm/ppo with full or freeze tuning never resume) among old checkpoints
        foreign, verdict = checkpoints, "which this run does not resume from"
    else:
        foreign, verdict = other_experiments(where, resumed), f"of another experiment than {resumed.name}"
    if not foreign:
        return unchanged(
            config,
            env,
            Finding(
                code="CHECKPOINT_ROTATION",
                level=Level.INFO,
                key="save_total_limit",
                message=f"save_total_limit: {limit}: the run resumes from {resumed.name if resumed else '?'} and "
                f"rotates its own checkpoints in {where} ({', '.join(checkpoints[:3])}), keeping the newest {limit}.",
                fix_as="own",
            ),
        )
    return unchanged(
        config,
        env,
        Finding(
            code="CHECKPOINT_ROTATION",
            level=Level.ERROR,
            key="save_total_limit",
            old=config.get("save_total_limit"),
            message=f"save_total_limit: {limit} would delete {', '.join(foreign[:3])} in {where} as new checkpoints "
            f"are saved: checkpoints {verdict} (another base model or adapter shape).",
            fix_as="foreign",
        ),
    )


def _rotation_limit(config: Mapping[str, Any]) -> int | None:
    """save_total_limit when the trainer rotates: transformers' ``rotate_checkpoints`` (trainer_utils.py)
    returns at once for ``None`` or ``<= 0``; a value that is no integer is the parser's to refuse."""
    try:
        limit = int(config.get("save_total_limit"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return limit if limit > 0 else None


def _resumed_from(config: Mapping[str, Any], ctx: Context, output_dir: str) -> Path | None:
    """The checkpoint the run resumes from: resume_from_checkpoint, else output_dir's newest checkpoint
    (transformers' ``get_last_checkpoint``, ctx.resume_checkpoint) where LLaMA-Factory's get_train_args
    resumes on its own; None for a run that starts fresh."""
    explicit = config.get("resume_from_checkpoint")
    if explicit not in (None, ""):
        return Path(str(explicit))
    # get_train_args (0.9.5 hparams/parser.py) never resumes rm/ppo with full or freeze tuning
    # ("can_resume_from_checkpoint = False"); tests/test_rules_target_outputs_multigpu.py pins the line.
    never = str(lf_value(config, "stage", "sft")) in ("rm", "ppo") and str(
        lf_value(config, "finetuning_type", "lora")
    ) in ("full", "freeze")
    if never or ctx.resume_checkpoint is None:
        return None
    return Path(output_dir) / ctx.resume_checkpoint


@rule(TRAIN)
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
                key="plot_loss",
                new=True,
                message="plot_loss was unset: LLaMA-Factory draws no loss curve by default.",
            )
        ],
    )
