"""Values as LLaMA-Factory receives them: rewritten where they have one meaning, refused where none.

A YAML config reaches LLaMA-Factory through ``HfArgumentParser.parse_dict`` (llamafactory 0.9.5
``hparams/parser.py`` ``_parse_args``), which converts nothing: ``learning_rate: "5e-5"`` reaches the
optimizer as a string (``TypeError``), ``max_steps: 2.0`` reaches ``range()`` as a float, and
``bf16: "false"`` is a true string. A value of another type than its field's (the parser's own action
type, ``lf/schema.py``) that has one lossless meaning in it is rewritten to it (``VALUE_COERCED``, a
change, so the run trains as written); a value that has none is refused, naming the key
(``VALUE_INVALID``). A value the trainer takes as it is (``1`` for a float, ``"true"`` for a bool) is
left alone. A value outside a field's choices is said (``VALUE_NOT_A_CHOICE``, a warning) and never
refused here: ``parse_dict`` checks no choices, and LLaMA-Factory trains with many such values
(``pref_loss: hinge2``); where it does not, its own parser or the dry run refuses them in its words.
A float field given ``.inf``, ``-.inf`` or ``.nan`` is said (``VALUE_NOT_FINITE``, a warning naming a value
that works): LLaMA-Factory's parser takes it and it trains or stops as the stock run would, decided by
LLaMA-Factory's parser and the launch run dry (tests/test_values_nonfinite.py holds every number key to
the stock parser); a whole-number field refuses it (``VALUE_INVALID``), as ``int("inf")`` does on the
command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..findings import Finding
from ..lf.causes import meant_template
from ..lf.commands import CHAT, EVAL, EXPORT, TRAIN
from .base import Context, Step, rule, unchanged


@rule(TRAIN, EXPORT, CHAT, EVAL)
def refuse_unconvertible_values(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if ctx.schema is None:
        return unchanged(config, env)
    new = dict(config)
    findings = []
    for coercion in ctx.schema.value_coercions(config):
        new[coercion.key] = coercion.new
        findings.append(
            Finding(
                code="VALUE_COERCED",
                key=coercion.key,
                old=coercion.value,
                new=coercion.new,
                message=f"{coercion.key}: {coercion.value!r} is a {type(coercion.value).__name__} and LLaMA-Factory "
                "hands YAML values to the trainer unconverted: "
                + (
                    "a non-empty string is true, so the run would have it switched on."
                    if coercion.new is False
                    else f"the run would compute with the {type(coercion.value).__name__} and fail."
                ),
                fix_with={"new": coercion.new, "expected": coercion.expected},
            )
        )
    findings += [
        Finding(
            code="VALUE_INVALID",
            key=problem.key,
            old=problem.value,
            message=f"{problem.key}: {problem.value!r} is not {problem.expected}.",
            **_invalid_fix(problem.key, problem.expected, problem.works, problem.value, config),
        )
        for problem in ctx.schema.value_problems(config)
    ]
    findings += [
        Finding(
            code="VALUE_NOT_FINITE",
            key=found.key,
            old=found.value,
            message=f"{found.key}: {found.value!r} is not a finite number. LLaMA-Factory's parser takes it as it "
            "is and the trainer computes with it, or refuses it where it uses it (said below when the launch "
            "run dry reaches that step).",
            fix_with={"key": found.key, "works": found.works},
        )
        for found in ctx.schema.nonfinite_values(new)  # after coercion: `"nan"` is rewritten to nan
    ]
    findings += [
        Finding(
            code="VALUE_NOT_A_CHOICE",
            key=other.key,
            old=other.value,
            message=f"{other.key}: {other.value!r} is not {other.expected}. LLaMA-Factory checks no choices in "
            "a config file and hands it on as written (the same flag on the command line is refused).",
            fix_with={"key": other.key, "expected": other.expected},
        )
        for other in ctx.schema.values_not_choices(config)
    ]
    return Step(new, dict(env), findings)


def _invalid_fix(key: str, expected: str, works: str, value: Any, config: Mapping[str, Any]) -> dict[str, Any]:
    """The fix of a refused value: the key left out (it takes LLaMA-Factory's default), save for a template,
    whose default is none: the run would then train with the tokenizer's chat template or the empty one, not
    the one meant, so its fix is the template meant (lf/causes.py meant_template)."""
    fix_with = {"key": key, "expected": expected, "works": works}
    if key != "template" or not isinstance(value, str):
        return {"fix_with": fix_with, "remedy": {key: None}}
    meant, why = meant_template(value, config)
    if meant is None:  # nothing close and the model not one LLaMA-Factory lists: the user names it
        return {"fix_with": fix_with, "remedy": None}
    return {"fix_with": {**fix_with, "works": f", such as {meant} ({why})"}, "remedy": {key: meant}}
