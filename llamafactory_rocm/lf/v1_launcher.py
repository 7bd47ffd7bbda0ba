"""LLaMA-Factory main's v1 launcher (``USE_V1=1``) is not checked, and says so instead of silently nothing.

``llamafactory/cli.py`` ``main`` imports ``llamafactory.v1.launcher`` when ``is_env_enabled("USE_V1")``;
its ``launch`` trains through ``llamafactory.v1.trainers.*`` (``run_sft``, ``run_dpo``, ``run_rm``) with
v1's own config schema (``v1/config/arg_parser.py`` ``get_args``: model, data, training and sample
arguments), never through ``run_exp``, which is where the hook checks. The rules read v0's keys
(``finetuning_type``, ``fp16``, ``lora_target``, ...), so checking v1 is not a matter of calling its
parser: it would need rules for another schema. Until then, one line at launch.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

NOT_CHECKED = (
    "USE_V1=1: LLaMA-Factory's v1 launcher does not go through run_exp, so this run is not checked "
    "(no rewrite, record, guard or summary). Unset USE_V1 for the checked launcher."
)


def wrap_launch(launch: Callable[..., Any]) -> Callable[..., Any]:
    """v1's ``launch`` unchanged, after the one line (the torchrun ranks it starts run the file as a script)."""

    @wraps(launch)
    def launch_with_notice(*args: Any, **kwargs: Any) -> Any:
        from ..console import say

        say(NOT_CHECKED)
        return launch(*args, **kwargs)

    launch_with_notice.__llamafactory_rocm__ = True  # type: ignore[attr-defined]
    return launch_with_notice
