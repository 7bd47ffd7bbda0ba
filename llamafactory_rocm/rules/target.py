"""The GPU a config names (``--gpu``, ``--arch``, its target line or a preset's file name) must be the one present."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..findings import Finding, Level
from ..lf.commands import CHAT, EVAL, TRAIN
from .base import EXPORT_ON_GPU, Context, Step, rule, unchanged


@rule(TRAIN, EXPORT_ON_GPU, CHAT, EVAL)
def check_target(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    target = ctx.target
    if target is None:
        return unchanged(config, env)
    label = target.alias or target.arch
    if ctx.snapshot.source.startswith("planned"):
        return unchanged(
            config,
            env,
            Finding(
                code="PLANNED_TARGET",
                message=f"No GPU here: checked as planned for {label} ({target.arch}, named by {target.named_by}).",
            ),
        )
    if not ctx.snapshot.devices:
        # A target named on purpose (--gpu/--arch, the config's target line) pins the run to that GPU;
        # a file name only suggests one.
        guessed = target.named_by.startswith("file name")
        return unchanged(
            config,
            env,
            Finding(
                code="TARGET_ABSENT",
                level=Level.WARNING if guessed else Level.ERROR,
                message=f"The config is meant for {label} ({target.arch}, named by {target.named_by}) but this "
                "machine has no GPU, so it would run on the CPU.",
                fix_as="guessed_from_file_name" if guessed else "named_on_purpose",
            ),
        )
    present = ctx.snapshot.gpu_base_archs
    wrong = [arch for arch in present if arch != target.arch]
    if not wrong:
        return unchanged(config, env)
    return unchanged(
        config,
        env,
        Finding(
            code="TARGET_MISMATCH",
            old=target.arch,
            new=present,
            message=f"The config is meant for {label} ({target.arch}, named by {target.named_by}) but this "
            f"machine has {', '.join(present)}.",
        ),
    )
