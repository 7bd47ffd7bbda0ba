"""Keys that need a package LLaMA-Factory imports only when the run reaches them.

LLaMA-Factory checks some of them in ``get_train_args`` (``check_version(..., mandatory=True)``) and
others only at model load or at the first step, after minutes of preprocessing. On this machine a
missing one is an error; when planning for another machine it is a stated requirement.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..findings import Finding, Level
from .base import Context, Step, truthy, unchanged

# key -> (distribution, why it is needed, how to install)
_NEEDS: dict[str, tuple[str, str]] = {
    "deepspeed": ("deepspeed", "deepspeed: runs DeepSpeed (ROCm: build it against your ROCm torch)"),
    "plot_loss": ("matplotlib", "plot_loss draws the loss curve with matplotlib"),
    "use_unsloth": ("unsloth", "use_unsloth loads the model through unsloth"),
    "enable_liger_kernel": ("liger-kernel", "enable_liger_kernel patches the model with liger-kernel"),
    "use_galore": ("galore-torch", "use_galore uses the GaLore optimizer"),
    "use_apollo": ("apollo-torch", "use_apollo uses the APOLLO optimizer"),
    "use_badam": ("badam", "use_badam uses the BAdam optimizer"),
    "use_adam_mini": ("adam-mini", "use_adam_mini uses the Adam-mini optimizer"),
    "use_swanlab": ("swanlab", "use_swanlab logs to SwanLab"),
}
_BNB = ("bitsandbytes", "quantization_bit loads the model in 4/8 bit with bitsandbytes (ROCm wheels from 0.49)")


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-")


def required_packages(config: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """key -> (distribution, why) for every package the config's keys need."""
    # deepspeed holds a path (or a dict); the others are switches
    needed = {
        key: need
        for key, need in _NEEDS.items()
        if (config.get(key) not in (None, "", False) if key == "deepspeed" else truthy(config.get(key, False)))
    }
    if config.get("quantization_bit") not in (None, "", False) and config.get("quantization_method", "bnb") == "bnb":
        needed["quantization_bit"] = _BNB
    return needed


def _checked_elsewhere(key: str, ctx: Context) -> bool:
    # On ROCm, kernels.bitsandbytes_for_qlora checks the version each arch needs.
    return key == "quantization_bit" and ctx.rocm


def missing_packages(config: Mapping[str, Any], installed: frozenset[str]) -> dict[str, tuple[str, str]]:
    return {k: v for k, v in required_packages(config).items() if _normalise(v[0]) not in installed}


def require_packages(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if ctx.installed is None:
        return unchanged(config, env)
    findings = []
    for key, (dist, why) in missing_packages(config, ctx.installed).items():
        if _checked_elsewhere(key, ctx):
            continue
        if ctx.planned:
            findings.append(
                Finding(
                    code="PACKAGE_REQUIRED",
                    level=Level.INFO,
                    key=key,
                    message=f"{why}; it is not installed here, so install it on the target machine.",
                    fix=f"On the target: pip install {dist} (the build for its torch).",
                )
            )
        else:
            findings.append(
                Finding(
                    code="PACKAGE_MISSING",
                    level=Level.ERROR,
                    key=key,
                    message=f"{why}, but {dist} is not installed.",
                    fix=f"pip install {dist} (the build for this torch), or remove {key}.",
                )
            )
    return unchanged(config, env, *findings)
