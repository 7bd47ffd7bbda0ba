"""What LLaMA-Factory's launcher decides before torchrun starts, read from its own source.

``launcher.py`` ``launch()`` forces torchrun for some switches: 0.9.5 ``if is_env_enabled("USE_MCA"):
os.environ["FORCE_TORCHRUN"] = "1"``; main (0.9.6.dev0) ``if is_env_enabled("USE_MCA") or
is_env_enabled("USE_MEGATRON_BRIDGE"):``. The switches are read from the installed file with ``ast``
(found with ``importlib.util.find_spec``, never imported), so the rule follows the line installed;
tests/test_rules_world.py pins the answer on both lines.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

# Where LLaMA-Factory cannot be read (not installed): the 0.9.5 line.
FALLBACK_SWITCHES = ("FORCE_TORCHRUN", "USE_MCA")


def _launcher_file() -> Path | None:
    spec = importlib.util.find_spec("llamafactory")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    return next((p for p in (Path(root) / "launcher.py" for root in roots) if p.is_file()), None)


def _sets_force_torchrun(body: list[ast.stmt]) -> bool:
    for stmt in body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Subscript):
            key = stmt.targets[0].slice
            if isinstance(key, ast.Constant) and key.value == "FORCE_TORCHRUN":
                return True
    return False


def _switch_names(test: ast.expr) -> list[str]:
    return [
        node.args[0].value
        for node in ast.walk(test)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "is_env_enabled"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ]


@cache
def torchrun_switches() -> tuple[str, ...]:
    """The environment switches that make ``llamafactory-cli train`` start torchrun whatever the device
    count: FORCE_TORCHRUN itself and those the launcher turns into it."""
    path = _launcher_file()
    if path is None:
        return FALLBACK_SWITCHES
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return FALLBACK_SWITCHES
    found = ["FORCE_TORCHRUN"]
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _sets_force_torchrun(node.body):
            found += [name for name in _switch_names(node.test) if name not in found]
    return tuple(found)


def _cli_target(body: list[ast.stmt]) -> str | None:
    """What one ``command == "..."`` branch of ``launch()`` runs: ``"llamafactory.api.app:run_api"`` for
    ``from .api.app import run_api``, ``"raise: <message>"`` for a branch that raises (0.9.5 and main:
    ``eval``), None for anything else (``env``, ``version``, ``help`` print)."""
    for stmt in body:
        if isinstance(stmt, ast.ImportFrom) and stmt.level == 1 and stmt.module and stmt.names:
            return f"llamafactory.{stmt.module}:{stmt.names[0].name}"
        if isinstance(stmt, ast.Raise) and isinstance(stmt.exc, ast.Call):
            words = [a.value for a in stmt.exc.args if isinstance(a, ast.Constant)]
            name = getattr(stmt.exc.func, "id", "an error")
            return f"raise: {name}({', '.join(repr(w) for w in words)})"
    return None


@cache
def cli_commands() -> dict[str, str | None]:
    """Each ``llamafactory-cli`` command of the installed ``launch()`` and what its branch runs (see
    ``_cli_target``); empty where LLaMA-Factory cannot be read. The torchrun branch of train (``command ==
    "train" and (...)``) is not a branch of its own here: its plain ``command == "train"`` branch is."""
    path = _launcher_file()
    if path is None:
        return {}
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    found: dict[str, str | None] = {}
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        if (
            isinstance(test, ast.Compare)
            and getattr(test.left, "id", None) == "command"
            and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.comparators[0], ast.Constant)
        ):
            found[test.comparators[0].value] = _cli_target(node.body)
    return found
