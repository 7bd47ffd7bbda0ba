"""An adapter used after training on a base model other than the one it was trained on.

PEFT writes the base model it trained on into the adapter's ``adapter_config.json``
(``base_model_name_or_path``); LLaMA-Factory loads the adapter onto ``model_name_or_path`` without
comparing the two (``init_adapter`` in llamafactory/model/adapter.py), so a mismatch loads, merges
or serves a model nobody trained (docs/after-training.md#t6).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..findings import Finding
from ..lf.adapters import ADAPTER_CONFIG, adapter_paths, read_adapter_config
from ..lf.commands import CHAT, EVAL, EXPORT
from .base import Context, Step, rule, unchanged


def _normalised(name: str) -> str:
    """A local folder by its resolved path; a hub id lower-cased without a trailing slash."""
    local = Path(name).expanduser()
    if local.is_dir():
        return str(local.resolve())
    return name.strip().rstrip("/").lower()


def same_model(a: str, b: str) -> bool:
    """Whether two model names point at the same model.

    A local download of a hub model keeps the repository's name as its folder name
    (``/models/Meta-Llama-3-8B-Instruct`` for ``meta-llama/Meta-Llama-3-8B-Instruct``): the last path part
    compared case-insensitively counts as the same model, so only a real difference warns.
    """
    na, nb = _normalised(a), _normalised(b)
    if na == nb:
        return True
    return Path(na).name.lower() == Path(nb).name.lower()


@rule(EXPORT, CHAT, EVAL)
def adapter_base_mismatch(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    model = config.get("model_name_or_path")
    if not model:
        return unchanged(config, env)
    findings = []
    for path in adapter_paths(config):
        adapter = read_adapter_config(path)
        base = adapter.get("base_model_name_or_path") if adapter else None
        if not base or same_model(str(base), str(model)):
            continue
        findings.append(
            Finding(
                code="ADAPTER_BASE_MISMATCH",
                key="adapter_name_or_path",
                old=path,
                message=f"The adapter {path} was trained on {base} (its {ADAPTER_CONFIG}), but model_name_or_path "
                f"is {model}; LLaMA-Factory loads it onto model_name_or_path without comparing them.",
                fix_with={"base": base, "model": model},
            )
        )
    return unchanged(config, env, *findings)


__all__ = ["adapter_base_mismatch", "adapter_paths", "read_adapter_config", "same_model"]
