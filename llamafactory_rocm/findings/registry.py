"""The finding-code registry: what each code means, why, the fix, an example, its source and its rule.

The text is data, kept apart from the rules that emit the codes, as ruff keeps its rule registry:
each module that builds findings declares its codes in ``findings/codes/<module>.json`` (e.g.
``rules.precision.json`` for ``llamafactory_rocm/rules/precision.py``). ``llamafactory-rocm explain CODE``
prints an entry and names the module that emits it; the code table in docs/troubleshooting.md is
generated from the same entries. ``tests/test_codes.py`` reads every module's source (its AST) and
fails when a module emits a code it does not declare, or declares one it does not emit.
"""

from __future__ import annotations

import difflib
import json
import string
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

DOCS_TABLE_HEADER = "| code | level | meaning |\n|---|---|---|"


class CodeEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    level: str = Field(description="error, warning, change or info; a note where it varies")
    summary: str = Field(description="one line, for `explain --list` and the docs table")
    what: str
    why: str
    fix: str | dict[str, str] = Field(
        description="a template ({name} filled by the rule's fix_with); a mapping where the code has one fix "
        "a case (the rule names the case with fix_as)"
    )
    example: str
    source: list[str] = Field(default_factory=list, description="citations into docs/*.md")
    module: str = Field(default="", description="the module that emits it, from the file name")

    def fix_lines(self) -> list[str]:
        """The fix as explain shows it: a template's ``{name}`` as ``<name>``, one line a case."""
        if isinstance(self.fix, str):
            return [f"Fix:     {_shown(self.fix)}"]
        return [f"Fix ({case}): {_shown(text)}" for case, text in self.fix.items()]

    @property
    def path(self) -> str:
        """The emitting module's file (a package's: its ``__init__.py``, as ``rules`` for FINDING_ACCEPTED)."""
        package = Path(__file__).resolve().parents[1].joinpath(*self.module.split(".")).is_dir()
        return "llamafactory_rocm/" + self.module.replace(".", "/") + ("/__init__.py" if package else ".py")


class CodeRegistry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    codes: dict[str, CodeEntry]

    def get(self, code: str) -> CodeEntry | None:
        return self.codes.get(code.strip().upper())

    def nearest(self, text: str, n: int = 3) -> list[str]:
        """The known codes closest to a mistyped one (``MEMORY_OVER`` -> ``MEMORY_OVER_BUDGET``, ...)."""
        wanted = text.strip().upper().replace("-", "_")
        names = sorted(self.codes)
        close = difflib.get_close_matches(wanted, names, n=n, cutoff=0.5)
        starts = [c for c in names if wanted and (c.startswith(wanted) or wanted in c) and c not in close]
        return (close + starts)[:n]

    def explain(self, code: str) -> str:
        """The full text ``llamafactory-rocm explain CODE`` prints."""
        entry = self.codes[code]
        lines = [
            f"{code} ({entry.level})",
            "",
            f"What:    {entry.what}",
            f"Why:     {entry.why}",
            *entry.fix_lines(),
            f"Example: {entry.example}",
        ]
        if entry.source:
            lines.append(f"Source:  {', '.join(entry.source)}")
        lines.append(f"Rule:    {entry.path}")
        return "\n".join(lines)

    def markdown_table(self) -> str:
        """The code table of docs/troubleshooting.md, one row per entry."""
        rows = [f"| `{code}` | {e.level} | {e.summary} |" for code, e in self.codes.items()]
        return "\n".join([DOCS_TABLE_HEADER, *rows])


def _shown(template: str) -> str:
    parts = []
    for literal, name, _spec, _conversion in string.Formatter().parse(template):
        parts.append(literal + (f"<{name}>" if name is not None else ""))
    return "".join(parts)


def fix_text(code: str, values: Mapping[str, Any], variant: str | None = None) -> str:
    """A finding's fix: its code's template filled with the rule's values (KeyError: a code or a value the
    template names is missing, which tests/test_codes.py rules out for every emitting module)."""
    fix = load_codes().codes[code].fix
    template = fix[variant] if isinstance(fix, dict) and variant is not None else fix
    if not isinstance(template, str):
        raise KeyError(f"{code} has a fix a case ({', '.join(fix)}): the rule must name one (fix_as)")
    return template.format_map(dict(values))


LEVELS = ("error", "warning", "change", "info")


def declared_level(code: str) -> str:
    """The level a code's entry declares, for a finding that passes none. KeyError for a code whose entry
    says its level varies (``"error (info when planned)"``): its finding must pass ``level=``
    (tests/test_codes.py reads every call)."""
    level = load_codes().codes[code].level
    if level not in LEVELS:
        raise KeyError(f"{code}'s level varies ({level}): the finding must pass level=")
    return level


CODES_FOLDER = "codes"


def declared_codes() -> dict[str, dict[str, CodeEntry]]:
    """module -> the entries that module declares (one JSON file per emitting module)."""
    folder = resources.files(__package__).joinpath(CODES_FOLDER)
    found: dict[str, dict[str, CodeEntry]] = {}
    for item in sorted(folder.iterdir(), key=lambda f: f.name):
        if item.name.endswith(".json"):
            module = item.name.removesuffix(".json")
            raw = json.loads(item.read_text(encoding="utf-8"))["codes"]
            found[module] = {code: CodeEntry(**entry, module=module) for code, entry in raw.items()}
    return found


@lru_cache(maxsize=1)
def load_codes() -> CodeRegistry:
    merged: dict[str, CodeEntry] = {}
    for module, entries in declared_codes().items():
        for code, entry in entries.items():
            if code in merged:
                raise ValueError(f"{code} is declared by {merged[code].module} and {module}: one rule owns a code")
            merged[code] = entry
    return CodeRegistry(codes=dict(sorted(merged.items())))
