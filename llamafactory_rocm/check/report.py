"""What a check returns: the input, the resolution (config, environment, findings), the machine and target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..findings import Finding
from ..machine.snapshot import Snapshot
from ..rules import Resolution, Target


@dataclass(frozen=True)
class Report:
    input_config: dict[str, Any]
    resolution: Resolution
    snapshot: Snapshot
    target: Target | None
    config_path: str | None = None
    origin: str = "check_config"
    depth: str = "full"
    # the dry run's count of the rows LLaMA-Factory trains on (lf/dry_data.py)
    train_rows: int | None = None
    accepted: frozenset[str] = frozenset()
    # the memory estimate as numbers (GiB): weights, trainable, activations, logits, peak, device
    estimate: dict[str, float] | None = None  # the request's --accept / LLAMAFACTORY_ROCM_ACCEPT, read once
    # check --forecast: the run's steps, tokens, FLOPs, time and cost (forecast/run.py Forecast)
    forecast: Any = None
    # the command's registry entry (lf/commands.py Command) and how it was chosen (check's first line)
    entry: Any = None
    command_from: str = ""

    @property
    def ok(self) -> bool:
        return self.resolution.ok

    @property
    def config(self) -> dict[str, Any]:
        return self.resolution.config

    @property
    def findings(self) -> list[Finding]:
        return self.resolution.findings

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "findings": [
                {"code": f.code, "level": f.level.value, "message": f.message, "fix": f.fix}
                | ({"key": f.key} if f.key is not None else {})
                | ({"remedy": f.remedy} if f.remedy is not None else {})
                for f in self.findings
            ],
            "config": self.config,
            "env_changes": self.resolution.env_changes,
            "target": None if self.target is None else self.target.__dict__,
            "snapshot_source": self.snapshot.source,
            "estimate": self.estimate,
            **({"forecast": self.forecast.as_json()} if self.forecast is not None else {}),
        }
