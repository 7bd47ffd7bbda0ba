"""The rule chain: every rule, in the order they run, and ``resolve`` to run them.

Order matters only where one rule's output is another's input: blog-style keys are translated
before unknown keys are refused and before the precision rules read ``fp16``/``bf16``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..findings import Finding, has_errors
from . import (
    blog_keys,
    environment,
    kernels,
    memory_fit,
    multi_gpu,
    outputs,
    packages,
    precision,
    rocm_arch_env,
    target,
    torch_build,
    values,
    visibility,
    world,
)
from .base import Config, Context, Env, Rule, Step, Target

RULES: tuple[Rule, ...] = (
    blog_keys.rewrite_compute_dtype,
    blog_keys.drop_backend,
    blog_keys.refuse_unknown_keys,
    values.refuse_unconvertible_values,
    target.check_target,
    torch_build.require_rocm_torch,
    torch_build.require_kernels_for_devices,
    torch_build.check_hsa_override,
    visibility.integrated_gpu_visible,
    visibility.visibility_conflict,
    environment.rocm_version_mismatch,
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
    outputs.resume_only_from_whole_checkpoints,
    outputs.plot_the_loss,
    multi_gpu.multi_gpu_notices,
    world.world_rules,
    memory_fit.memory_fit,
)


@dataclass(frozen=True)
class Resolution:
    config: Config
    env: Env  # the relevant environment after the rules (only keys the rules look at)
    env_changes: dict[str, str]
    findings: list[Finding]

    @property
    def ok(self) -> bool:
        return not has_errors(self.findings)


def resolve(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Resolution:
    """Run every rule over (config, env); pure: the inputs are not modified."""
    state = Step(dict(config), dict(env))
    findings: list[Finding] = list(ctx.extra_findings)
    for rule in RULES:
        state = rule(state.config, state.env, ctx)
        findings.extend(state.findings)
    changes = {k: v for k, v in state.env.items() if env.get(k) != v}
    return Resolution(state.config, state.env, changes, findings)


__all__ = ["RULES", "Context", "Resolution", "Target", "resolve"]
