"""What a rule says about a config: a stable code, a level, one sentence of cause, one of fix."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict


class Level(str, Enum):
    ERROR = "error"  # launching would fail or waste the GPU-hour: refuse
    WARNING = "warning"  # launch, but the user should know
    CHANGE = "change"  # the config or environment was rewritten
    INFO = "info"  # context, nothing to do


class Finding(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str
    level: Level
    message: str
    fix: str
    key: str | None = None  # the config key or environment variable concerned
    old: Any = None
    new: Any = None

    def line(self) -> str:
        """One line; it ends by naming the command that explains the code at length."""
        return f"[{self.level.value}] {self.code}: {self.message} Fix: {self.fix} {explain_hint(self.code)}"


def explain_hint(code: str) -> str:
    return f"(more: llamafactory-rocm explain {code})"


def has_errors(findings: list[Finding]) -> bool:
    return any(f.level is Level.ERROR for f in findings)
