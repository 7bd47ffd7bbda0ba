"""Prediction with generation needs packages the README's install leaves out.

``predict_with_generate`` makes LLaMA-Factory score generations with BLEU and ROUGE on segmented text:
``get_train_args`` requires jieba, nltk and rouge_chinese (``_check_extra_dependencies`` in
llamafactory/hparams/parser.py) and ``ComputeSimilarity`` imports them (llamafactory/train/sft/metric.py).
LLaMA-Factory is installed with ``--no-deps`` (README), so none of them is there (docs/after-training.md#t7).
The package names are read from LLaMA-Factory itself (``lf.commands.predict_requirements``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..findings import Finding, Level
from ..lf.commands import TRAIN
from .base import Context, Step, rule, truthy, unchanged

EXTRA = "eval"  # pyproject.toml's optional dependency group that lists them


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-")


@rule(TRAIN)
def predict_packages(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if not truthy(config.get("predict_with_generate", False)) or ctx.installed is None:
        return unchanged(config, env)
    from ..lf.commands import predict_requirements

    missing = [_normalise(name) for name in predict_requirements() if _normalise(name) not in ctx.installed]
    if not missing:
        return unchanged(config, env)
    names = ", ".join(missing)
    install = f'pip install -e ".[{EXTRA}]" (or: pip install {" ".join(missing)})'
    if ctx.planned:
        finding = Finding(
            code="EVAL_PACKAGES_MISSING",
            level=Level.INFO,
            key="predict_with_generate",
            message=f"predict_with_generate scores generations with BLEU/ROUGE and LLaMA-Factory requires {names} "
            "for it; they are not installed here, so install them on the target machine.",
            fix_as="planned",
            fix_with={"install": install},
        )
    else:
        finding = Finding(
            code="EVAL_PACKAGES_MISSING",
            level=Level.ERROR,
            key="predict_with_generate",
            message=f"predict_with_generate scores generations with BLEU/ROUGE and LLaMA-Factory refuses to start "
            f"without {names}, which the README's install leaves out.",
            new=missing,  # the packages to install (check/rank.py folds the parser's refusal of the first)
            fix_as="here",
            fix_with={"install": install},
        )
    return unchanged(config, env, finding)


__all__ = ["EXTRA", "predict_packages"]
