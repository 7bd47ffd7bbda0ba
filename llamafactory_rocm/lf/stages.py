"""What each LLaMA-Factory training stage really does at launch, read from its source: the data stage
its workflow passes to ``get_dataset``, and the package versions its trainer requires.

LLaMA-Factory's workflows do not pass their own stage name to the data pipeline: ``run_dpo`` calls
``get_dataset(..., stage="rm")`` (pairwise data), and so on (docs/llamafactory-launch.md#d3). The answer
is read from the installed ``llamafactory/train/<stage>/workflow.py`` with ``ast``: the package is found
with ``importlib.util.find_spec`` and the file parsed, never imported, so no table here can drift from the library.
The same holds for ``require_version("trl>=0.8.6,<=0.9.6", ...)`` in ``train/ppo/trainer.py``: a pin the
trainer checks only when it is built, after the model is loaded (docs/llamafactory-launch.md#d8).
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path


class UnknownStage(ValueError):
    """LLaMA-Factory has no workflow for this stage, or its workflow calls ``get_dataset`` differently."""


class NoWorkflow(UnknownStage):
    """LLaMA-Factory has no workflow for this stage: ``run_exp`` raises "Unknown task: <stage>."."""


def _stage_file(stage: object, name: str) -> Path | None:
    """``llamafactory/train/<stage>/<name>`` of the installed LLaMA-Factory, or None. A stage that is not
    a string (``stage: 123`` in a YAML file reaches here unconverted: HfArgumentParser's ``parse_dict``
    converts no types) names no folder."""
    if not isinstance(stage, str) or not stage.isidentifier():
        return None
    # find_spec on "llamafactory.train.<stage>.workflow" would import its parent packages (the trainers):
    # only the top-level package is located, which imports nothing.
    spec = importlib.util.find_spec("llamafactory")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    return next((p for p in (Path(root) / "train" / stage / name for root in roots) if p.is_file()), None)


def data_stage(stage: object) -> str:
    """The ``stage=`` keyword that ``llamafactory.train.<stage>.workflow`` passes to ``get_dataset``."""
    if not isinstance(stage, str):
        raise NoWorkflow(f"LLaMA-Factory has no workflow for stage {stage!r} (a stage is a name)")
    return _data_stage(stage)


@cache
def _data_stage(stage: str) -> str:
    path = _stage_file(stage, "workflow.py")
    if path is None:
        raise NoWorkflow(f"LLaMA-Factory has no workflow for stage {stage!r} (train/<stage>/workflow.py)")
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


def adds_valuehead(stage: object) -> bool:
    """Whether the stage's workflow loads its model with ``load_model(..., add_valuehead=True)`` (rm, ppo)."""
    return isinstance(stage, str) and _adds_valuehead(stage)


@cache
def _adds_valuehead(stage: str) -> bool:
    path = _stage_file(stage, "workflow.py")
    if path is None:
        return False
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return any(
        isinstance(node, ast.Call)
        and _called_name(node.func) == "load_model"
        and any(k.arg == "add_valuehead" and isinstance(k.value, ast.Constant) and k.value.value for k in node.keywords)
        for node in ast.walk(tree)
    )


def trainer_requirements(stage: object) -> tuple[str, ...]:
    """The requirement strings the stage's trainer passes to transformers' ``require_version`` (its first
    argument, a constant): ``("trl>=0.8.6,<=0.9.6",)`` for ppo in LLaMA-Factory 0.9.5, none for the others."""
    return _trainer_requirements(stage) if isinstance(stage, str) else ()


@cache
def _trainer_requirements(stage: str) -> tuple[str, ...]:
    path = _stage_file(stage, "trainer.py")
    if path is None:
        return ()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return tuple(
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and _called_name(node.func) == "require_version"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


@cache
def own_requirements() -> tuple[str, ...]:
    """The versions LLaMA-Factory itself requires at start-up (extras/misc.py ``check_dependencies``, called by
    its CLI before any command), recorded by running it with its ``check_version`` answering nothing."""
    from unittest import mock

    from .text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.extras import misc

    recorded: list[str] = []
    with mock.patch.object(misc, "check_version", lambda requirement, *a, **k: recorded.append(requirement)):
        misc.check_dependencies()
    return tuple(recorded)


def conflicting_requirement(requirement: str) -> str | None:
    """LLaMA-Factory's own requirement of the same package when no version satisfies both (0.9.5's PPO
    trainer: trl<=0.9.6 against its start-up check trl>=0.18.0); None where one does."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        wanted = Requirement(requirement)
    except InvalidRequirement:
        return None
    for own_text in own_requirements():
        own = Requirement(own_text)
        if own.name.lower() != wanted.name.lower():
            continue
        # a version both accept lies at one of their bounds, or just above one (a bound excluded)
        bounds = [s.version for s in (*wanted.specifier, *own.specifier)]
        candidates = [*bounds, *(f"{b}.post1" for b in bounds)]
        if not any(v in wanted.specifier and v in own.specifier for v in candidates):
            return own_text
    return None
