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
