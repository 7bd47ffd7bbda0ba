"""The rule chain: every rule, in the order they run, and ``resolve`` to run them.

Order matters only where one rule's output is another's input: blog-style keys are translated
before unknown keys are refused and before the precision rules read ``fp16``/``bf16``.

``rules_for(command)`` is the chain each LLaMA-Factory command's entry names (``lf/commands.py``
``REGISTRY``, its ``rules``: a chain's name below): ``train`` runs
``RULES`` and the prediction rules (``predict_with_generate`` is a training key); ``export``, ``chat``,
``api``, ``webchat`` and ``eval`` run the machine rules that concern loading a model on the device, then
their own (rules/export.py, rules/serving.py, rules/adapter.py; docs/after-training.md). An export on
the CPU (``export_device: cpu``, LLaMA-Factory's default) uses no GPU: the device rules step aside there.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..findings import Finding, has_errors
from ..lf.commands import checked_entry
from . import (
    adapter,
    blog_keys,
    environment,
    kernels,
    memory_fit,
    multi_gpu,
    outputs,
    packages,
    precision,
    predict,
    rocm_arch_env,
    serving,
    target,
    torch_build,
    values,
    visibility,
    world,
)
from . import export as export_rules
from .base import Config, Context, Env, Rule, Step, Target, lf_value, unchanged

# The machine as training and every other command meet it: the planned target, the torch build and its
# kernels, the visible devices, the ROCm install (in RULES and in _DEVICE_RULES below).
_MACHINE_RULES: tuple[Rule, ...] = (
    target.check_target,
    torch_build.require_rocm_torch,
    torch_build.require_kernels_for_devices,
    torch_build.check_hsa_override,
    visibility.integrated_gpu_visible,
    visibility.visibility_conflict,
    environment.rocm_version_mismatch,
)

RULES: tuple[Rule, ...] = (
    blog_keys.rewrite_compute_dtype,
    blog_keys.drop_backend,
    blog_keys.refuse_unknown_keys,
    values.refuse_unconvertible_values,
    *_MACHINE_RULES,
    environment.jit_toolchain,
    environment.wsl2,
    environment.page_fault_workaround,
    rocm_arch_env.check_pytorch_rocm_arch,
    precision.prefer_bf16,
    precision.bf16_on_cpu_needs_use_cpu,
    precision.warn_bf16_without_matrix_units,
    precision.pure_bf16_only_where_real,
    precision.one_half_precision,
    kernels.drop_tf32,
    kernels.flash_attn_where_supported,
    kernels.sdpa_kernel_notice,
    kernels.bitsandbytes_for_qlora,
    packages.require_packages,
    outputs.protect_existing_checkpoints,
    outputs.plot_the_loss,
    multi_gpu.multi_gpu_notices,
    world.world_rules,
    memory_fit.memory_fit,
)

# The plan: what the run spans and whether it fits. check/run.py runs these once, after LLaMA-Factory's launch
# ran dry, with what it found (the rows it trains on); they read the config and rewrite nothing.
PLAN_RULES: tuple[Rule, ...] = (world.world_rules, memory_fit.memory_fit)

# Loading a model onto this machine's device, whatever the command: the torch build, its kernels, the
# visible devices, the ROCm install, the attention kernels, bitsandbytes for a quantized load. Not
# PYTORCH_ROCM_ARCH (rules/rocm_arch_env.py): it is for extensions built at a training launch.
_DEVICE_RULES: tuple[Rule, ...] = (
    *_MACHINE_RULES,
    environment.wsl2,
    kernels.flash_attn_where_supported,
    kernels.bitsandbytes_for_qlora,
)


def _on_export_device(rule: Rule) -> Rule:
    """``rule`` only where the export loads onto the GPUs (``export_device: auto``; docs/after-training.md#t2)."""

    @functools.wraps(rule)
    def gated(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
        if str(lf_value(config, "export_device", "cpu")).strip().lower() != "auto":
            return unchanged(config, env)
        return rule(config, env, ctx)

    return gated


TRAIN_RULES: tuple[Rule, ...] = (*RULES, *predict.PREDICT_RULES)
EXPORT_CHAIN: tuple[Rule, ...] = (
    values.refuse_unconvertible_values,
    *export_rules.EXPORT_RULES,
    *(_on_export_device(rule) for rule in _DEVICE_RULES),
    packages.require_packages,
    *adapter.ADAPTER_RULES,
)
CHAT_CHAIN: tuple[Rule, ...] = (
    values.refuse_unconvertible_values,
    *_DEVICE_RULES,
    packages.require_packages,
    *serving.CHAT_RULES,
    *adapter.ADAPTER_RULES,
)
EVAL_CHAIN: tuple[Rule, ...] = (
    values.refuse_unconvertible_values,
    *_DEVICE_RULES,
    packages.require_packages,
    serving.infer_bf16_emulated,
    *adapter.ADAPTER_RULES,
)
# The chains an entry of lf/commands.py's REGISTRY can name.
CHAINS: dict[str, tuple[Rule, ...]] = {
    "TRAIN_RULES": TRAIN_RULES,
    "EXPORT_CHAIN": EXPORT_CHAIN,
    "CHAT_CHAIN": CHAT_CHAIN,
    "EVAL_CHAIN": EVAL_CHAIN,
}


def rules_for(command: str) -> tuple[Rule, ...]:
    """The rules that apply to ``command`` (one of lf.commands.COMMANDS): the chain its entry names."""
    return CHAINS[checked_entry(command).rules or ""]


@dataclass(frozen=True)
class Resolution:
    config: Config
    env: Env  # the relevant environment after the rules (only keys the rules look at)
    env_changes: dict[str, str]
    findings: list[Finding]

    @property
    def ok(self) -> bool:
        return not has_errors(self.findings)


def resolve(
    config: Mapping[str, Any], env: Mapping[str, str], ctx: Context, rules: tuple[Rule, ...] | None = None
) -> Resolution:
    """Run ``rules`` (default: ``RULES``, the training chain) over (config, env); pure: the inputs are not
    modified. ``rules_for(command)`` gives the chain of another command."""
    state = Step(dict(config), dict(env))
    findings: list[Finding] = list(ctx.extra_findings)
    for rule in RULES if rules is None else rules:
        state = rule(state.config, state.env, ctx)
        findings.extend(state.findings)
    changes = {k: v for k, v in state.env.items() if env.get(k) != v}
    return Resolution(state.config, state.env, changes, findings)


__all__ = ["CHAINS", "PLAN_RULES", "RULES", "TRAIN_RULES", "Context", "Resolution", "Target", "resolve", "rules_for"]
