"""What each ``llamafactory-cli`` command of the installed ``launcher.py`` ``launch()`` runs, read from its
source with ``ast`` (the file found with ``importlib.util.find_spec``, never imported): the registry's
oracle in tests/test_command_registry.py, read here so the package carries no code only its tests call."""

from __future__ import annotations

import ast

from llamafactory_rocm.lf.launcher_source import _launcher_file


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


def cli_commands() -> dict[str, str | None]:
    """Each ``llamafactory-cli`` command of the installed ``launch()`` and what its branch runs (see
    ``_cli_target``). The torchrun branch of train (``command == "train" and (...)``) is not a branch of its
    own here: its plain ``command == "train"`` branch is."""
    path = _launcher_file()
    assert path is not None, "LLaMA-Factory's launcher.py is not installed"
    found: dict[str, str | None] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        test = node.test if isinstance(node, ast.If) else None
        if (
            isinstance(test, ast.Compare)
            and getattr(test.left, "id", None) == "command"
            and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.comparators[0], ast.Constant)
        ):
            found[test.comparators[0].value] = _cli_target(node.body)
    return found
