"""The finding-code registry: what each code means, why, the fix, an example and its source.

The text is data (``codes.json``), kept apart from the rules that emit the codes, as ruff keeps
its rule registry: ``llamafactory-rocm explain CODE`` prints an entry, and the code table in
docs/troubleshooting.md is generated from the same entries (``tests/test_codes.py`` holds them
equal and fails when a code the package can emit has no entry). Adding a code is one entry.
"""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field

DOCS_TABLE_HEADER = "| code | level | meaning |\n|---|---|---|"


class CodeEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    level: str = Field(description="error, warning, change or info; a note where it varies")
    summary: str = Field(description="one line, for `explain --list` and the docs table")
    what: str
    why: str
    fix: str
    example: str
    source: list[str] = Field(default_factory=list, description="citations into docs/rocm-facts.md")


class CodeRegistry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int
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
            f"Fix:     {entry.fix}",
            f"Example: {entry.example}",
        ]
        if entry.source:
            lines.append(f"Source:  {', '.join(entry.source)}")
        return "\n".join(lines)

    def markdown_table(self) -> str:
        """The code table of docs/troubleshooting.md, one row per entry."""
        rows = [f"| `{code}` | {e.level} | {e.summary} |" for code, e in self.codes.items()]
        return "\n".join([DOCS_TABLE_HEADER, *rows])


@lru_cache(maxsize=1)
def load_codes() -> CodeRegistry:
    text = resources.files(__package__).joinpath("codes.json").read_text(encoding="utf-8")
    return CodeRegistry.model_validate(json.loads(text))
