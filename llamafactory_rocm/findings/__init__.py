"""What a rule says about a config: a stable code, a level, one sentence of cause, one of fix."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..errors import UsageError


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


# Codes that LLaMA-Factory itself refuses: accepting them cannot make the run start.
UNACCEPTABLE = frozenset({"UNKNOWN_KEY", "VALUE_INVALID", "LLAMAFACTORY_REFUSED", "PRECISION_CONFLICT"})
ACCEPT_ENV = "LLAMAFACTORY_ROCM_ACCEPT"


def parse_accept(value: str | None) -> frozenset[str]:
    """``CODE[,CODE]`` (``--accept`` or LLAMAFACTORY_ROCM_ACCEPT) -> codes; LLaMA-Factory's own refusals cannot be."""
    codes = frozenset(c.strip().upper() for c in (value or "").split(",") if c.strip())
    refused = sorted(codes & UNACCEPTABLE)
    if refused:
        raise UsageError(
            f"{', '.join(refused)} cannot be accepted: LLaMA-Factory itself refuses such a config, so the run "
            "would not start. Fix the config instead (`llamafactory-rocm explain CODE`)."
        )
    return codes
