"""The data stage each LLaMA-Factory training stage really passes to ``get_dataset``, read from its source.

LLaMA-Factory's workflows do not pass their own stage name to the data pipeline: ``run_dpo`` calls
``get_dataset(..., stage="rm")`` (pairwise data), and so on (docs/llamafactory-launch.md#d3). The answer
is read from the installed ``llamafactory/train/<stage>/workflow.py`` with ``ast``: the package is found
with ``importlib.util.find_spec`` and the file parsed, never imported, so no table here can drift from the library.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path


class UnknownStage(ValueError):
    """LLaMA-Factory has no workflow for this stage, or its workflow calls ``get_dataset`` differently."""


@cache
def data_stage(stage: str) -> str:
    """The ``stage=`` keyword that ``llamafactory.train.<stage>.workflow`` passes to ``get_dataset``."""
    if not stage.isidentifier():
        raise UnknownStage(f"{stage!r} is not a LLaMA-Factory stage")
    # find_spec on "llamafactory.train.<stage>.workflow" would import its parent packages (the trainers):
    # only the top-level package is located, which imports nothing.
    spec = importlib.util.find_spec("llamafactory")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    paths = [Path(root) / "train" / stage / "workflow.py" for root in roots]
    path = next((p for p in paths if p.is_file()), None)
    if path is None:
        raise UnknownStage(f"LLaMA-Factory has no workflow for stage {stage!r} (train/{stage}/workflow.py)")
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = {
        keyword.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _called_name(node.func) == "get_dataset"
        for keyword in node.keywords
        if keyword.arg == "stage" and isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, str)
    }
    if len(found) != 1:
        raise UnknownStage(
            f"{path} calls get_dataset with stage={sorted(found)}; expected one constant (LLaMA-Factory changed)"
        )
    return found.pop()


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None
