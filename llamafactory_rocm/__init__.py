"""ROCm-aware presets, datasets and a pre-launch check for LoRA fine-tuning with LLaMA-Factory.

The names below load on first use: ``import llamafactory_rocm`` stays cheap, which matters because
the start-up hook (``_startup``) is imported by every Python process of the environment.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "check_config": ("llamafactory_rocm.check.run", "check_config"),
    "Report": ("llamafactory_rocm.check.run", "Report"),
    "Finding": ("llamafactory_rocm.findings", "Finding"),
    "Level": ("llamafactory_rocm.findings", "Level"),
    "Snapshot": ("llamafactory_rocm.machine.snapshot", "Snapshot"),
    "take_snapshot": ("llamafactory_rocm.machine.probe", "take_snapshot"),
    "load_catalogue": ("llamafactory_rocm.machine.catalogue", "load_catalogue"),
}
__all__ = ["__version__", "presets", *sorted(_LAZY)]


def __getattr__(name: str) -> object:
    if name == "presets":
        return importlib.import_module("llamafactory_rocm.presets")
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'llamafactory_rocm' has no attribute {name!r}")
