"""What a rule says about a config: a stable code, a level, one sentence of cause, one of fix.

The fix is written once, in the code's registry entry (``findings/codes/<module>.json``), as a template
that both the finding and ``llamafactory-rocm explain`` read: a rule passes the values it fills in
(``fix_with``) and, where a code has more than one fix, which one (``fix_as``); it never writes fix text
itself (``tests/test_codes.py`` holds every emitting module to that).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from ..errors import UsageError
from .registry import declared_level, fix_text


class Level(str, Enum):
    ERROR = "error"  # launching would fail or waste the GPU-hour: refuse
    WARNING = "warning"  # launch, but the user should know
    CHANGE = "change"  # the config or environment was rewritten
    INFO = "info"  # context, nothing to do


class Finding(BaseModel):
    """One finding. ``level`` defaults to the one its code's entry declares (findings/codes/*.json): a call
    passes it only where the code's level varies, or where this call has a reason to differ."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str
    level: Level
    message: str
    fix: str
    key: str | None = None  # the config key or environment variable concerned
    old: Any = None
    new: Any = None
    # The key changes that pass the point refused (key -> value, None removes the key, "<...>" is the user's
    # own value), where the fix is a key change; None where it is not (a package, a command, the data).
    remedy: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_the_registry(cls, data: Any) -> Any:
        """``level`` from the code's registry entry where the call passes none; ``fix`` from its template,
        filled with ``fix_with`` (and ``fix_as``'s variant)."""
        if not isinstance(data, dict) or ("fix" in data and "level" in data):
            return data
        data = dict(data)
        code = str(data.get("code", ""))
        if "level" not in data:
            data["level"] = declared_level(code)
        if "fix" not in data:
            values, variant = data.pop("fix_with", None) or {}, data.pop("fix_as", None)
            data["fix"] = fix_text(code, values, variant)
        return data

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
