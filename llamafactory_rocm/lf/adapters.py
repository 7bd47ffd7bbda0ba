"""A LoRA adapter folder as LLaMA-Factory and PEFT read it: the paths ``adapter_name_or_path`` names and the
``adapter_config.json`` PEFT wrote there. Read by the dry load (lf/dry_load.py) and the adapter rules
(rules/adapter.py, rules/serving.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ADAPTER_CONFIG = "adapter_config.json"  # peft.utils.constants.CONFIG_NAME


def adapter_paths(config: Mapping[str, Any]) -> list[str]:
    """``adapter_name_or_path`` as LLaMA-Factory splits it (comma-separated, ModelArguments.__post_init__)."""
    value = config.get("adapter_name_or_path")
    if value in (None, "", "null"):
        return []
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if str(v).strip()]
    return [part.strip() for part in str(value).split(",") if part.strip()]


def read_adapter_config(path: str) -> dict[str, Any] | None:
    """A local adapter folder's ``adapter_config.json``; None for a hub id or an unreadable file."""
    file = Path(path) / ADAPTER_CONFIG
    if not file.is_file():
        return None
    try:
        found = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return found if isinstance(found, dict) else None
