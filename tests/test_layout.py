"""The package's layout shows its architecture: packages by concern, few modules at the top, no import
cycle, counting the imports inside functions (read from the AST, so a lazy import counts too)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "llamafactory_rocm"
NAME = PACKAGE.name
CONCERNS = {"check", "cli", "dataset", "demo", "findings", "lf", "machine", "rules", "train"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module of the package that ``path`` imports, at the top or inside a function."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith(NAME)}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if not target.startswith(NAME):
                continue
            # `from . import module` imports that module; `from .x import name` imports x
            found |= {f"{target}.{alias.name}" for alias in node.names} | {target}
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    packages = {module_name(p) for p in PACKAGE.rglob("__init__.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = imports(path)
        targets = set()
        for target in found:
            if target not in modules or (
                target in packages and any(f.startswith(target + ".") and f in modules for f in found)
            ):
                continue  # `from x import name` is x (kept); `from . import sub` is sub, not the package
            if target != name:
                targets.add(target)
        edges[name] = targets
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_scan_sees_lazy_imports_and_cycles() -> None:
    assert "llamafactory_rocm.lf.commands" in graph()["llamafactory_rocm._startup"]  # inside a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_counting_imports_inside_functions() -> None:
    assert cycles(graph()) == []


def test_packages_by_concern_and_at_most_ten_modules_at_the_top() -> None:
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(top) <= 10, top
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert packages >= CONCERNS, CONCERNS - packages


def test_the_startup_finder_imports_nothing_of_ours_at_start_up() -> None:
    """_startup runs in every Python process (the .pth): its module-level code imports no package module."""
    tree = ast.parse((PACKAGE / "_startup.py").read_text(encoding="utf-8"))
    top_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all(not (getattr(n, "module", "") or "").startswith(NAME) and not getattr(n, "level", 0) for n in top_level)


_IMPORTING_CALLS = {"import_module", "__import__", "find_spec"}


def llamafactory_importers() -> set[str]:
    """The package's modules that import llamafactory: at the top, inside a function, or by a string given to
    importlib.import_module / __import__ / find_spec (a string in a docstring or a logger's name is no import)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if isinstance(node, ast.Call) and _called(node.func) in _IMPORTING_CALLS and node.args:
                names = [_leading_text(node.args[0])]
            if any(n == "llamafactory" or n.startswith("llamafactory.") for n in names):
                found.add(module_name(path))
    return found


def _called(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _leading_text(arg: ast.expr) -> str:
    """The literal start of a string argument: "llamafactory.x" or f"llamafactory.{name}"."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value)
    return ""


def test_the_import_scan_sees_a_string_import() -> None:
    """A module that reached LLaMA-Factory by importlib with a literal name would pass the door unseen."""
    tree = ast.parse('import importlib\nm = importlib.import_module(f"llamafactory.data.{x}")\n')
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call))
    assert _called(call.func) == "import_module" and _leading_text(call.args[0]).startswith("llamafactory.")


def test_llamafactory_is_imported_behind_lf_only() -> None:
    """Issue 52 item 1: lf/ is the one door to LLaMA-Factory (lf/library.py holds the names the other packages use)."""
    importers = llamafactory_importers()
    assert "llamafactory_rocm.lf.dry_run" in importers  # the scan sees lf/'s own lazy imports
    outside = {m for m in importers if not m.startswith(f"{NAME}.lf.") and m != f"{NAME}.lf"}
    assert not outside, f"outside lf/: {sorted(outside)}; ask lf/library.py instead"
