"""Values LLaMA-Factory's parser cannot convert: one finding per key, naming what it expects.

A YAML config reaches LLaMA-Factory through ``parse_dict``, which converts nothing: ``max_steps: abc``
or ``bf16: maybe`` pass the parser and fail later, deep in training, with a traceback. Each value is
checked as the parser converts it from the command line (``--max_steps abc``), by its own actions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..findings import Finding, Level
from .base import Context, Step, unchanged


def refuse_unconvertible_values(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if ctx.schema is None:
        return unchanged(config, env)
    findings = [
        Finding(
            code="VALUE_INVALID",
            level=Level.ERROR,
            key=problem.key,
            old=problem.value,
            message=f"{problem.key}: {problem.value!r} is not {problem.expected}.",
            fix=f"Give {problem.key} {problem.expected}.",
        )
        for problem in ctx.schema.value_problems(config)
    ]
    return unchanged(config, env, *findings)
