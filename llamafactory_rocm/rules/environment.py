"""Faults of the machine's environment that users hit: RDNA4 / Strix Halo page faults, a torch built for
another ROCm than the system's, the tools DeepSpeed's JIT-built ops need, and WSL2.

Sources: docs/rocm-facts.md#n7, #n8 (page faults), #n13 (HIP versions, JIT ops), #n14 (WSL2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..findings import Finding, Level
from ..lf.commands import CHAT, EVAL, TRAIN
from .base import EXPORT_ON_GPU, Context, Step, lf_value, rule, truthy, unchanged
from .kernels import version_tuple
from .world import deepspeed_json

NO_CACHING = "PYTORCH_NO_HIP_MEMORY_CACHING"


def _adapter_training(config: Mapping[str, Any]) -> bool:
    """LoRA/QLoRA (LLaMA-Factory's default finetuning_type is lora): where the faults were reported."""
    return str(lf_value(config, "finetuning_type", "lora")).lower() in {"lora", "oft"}


# The op DeepSpeed's engine builds for an optimizer (deepspeed/runtime/engine.py _configure_basic_optimizer:
# an optimizer offloaded to the CPU is DeepSpeedCPUAdam, an Adam/AdamW on the GPU FusedAdam), by the name
# its op builder and installed_ops use (op_builder/cpu_adam.py NAME "cpu_adam", fused_adam.py "fused_adam").
def jit_ops(config: Mapping[str, Any], prebuilt: list[str] | None = None) -> list[str]:
    """DeepSpeed ops the config makes DeepSpeed JIT-build at launch (docs/rocm-facts.md#n13): CPUAdam for an
    optimizer offloaded to the CPU, FusedAdam for a DeepSpeed Adam/AdamW on the GPU; not those DeepSpeed's
    installer already built on this machine (``prebuilt``: the snapshot's ``deepspeed_prebuilt_ops``)."""
    ds = deepspeed_json(config)
    if not ds:
        return []
    zero = ds.get("zero_optimization") if isinstance(ds.get("zero_optimization"), dict) else {}
    offload = zero.get("offload_optimizer") if isinstance(zero.get("offload_optimizer"), dict) else {}
    optimizer = ds.get("optimizer") if isinstance(ds.get("optimizer"), dict) else {}
    built = set(prebuilt or ())
    if str(offload.get("device", "none")).lower() == "cpu":
        return [] if "cpu_adam" in built else ["CPUAdam (offload_optimizer: cpu)"]
    if str(optimizer.get("type", "")).lower() in {"adam", "adamw"}:
        return [] if "fused_adam" in built else [f"FusedAdam (optimizer {optimizer['type']})"]
    return []


# HIP's version number follows the ROCm release's through ROCm 7.x (HIP 6.0 in ROCm 6.0.0; TheRock's ROCm
# 7.13 torch reports HIP 7.13). Past 7 (TheRock's ROCm 10) the two may diverge and which HIP major ROCm 10
# ships was not settled (docs/rocm-facts.md#n19): there a major is compared only where the answer holds
# either way.
LAST_MAJOR_NUMBERED_ALIKE = 7


def hip_and_rocm_majors_differ(hip: str, system: str) -> bool | None:
    """Whether torch's HIP and the system ROCm are different major releases; None where it cannot be told
    (an unparsable version, or a ROCm past 7 beside a HIP of 7 or later but not the same major)."""
    hip_major, rocm_major = version_tuple(hip)[0], version_tuple(system)[0]
    if not hip_major or not rocm_major:
        return None  # kernels.version reads text without a number as 0
    if hip_major <= LAST_MAJOR_NUMBERED_ALIKE and rocm_major <= LAST_MAJOR_NUMBERED_ALIKE:
        return hip_major != rocm_major
    if hip_major == rocm_major:
        return False
    # HIP 7 first shipped in ROCm 7.0, so an older HIP is older than any ROCm past 7; a HIP past 7 is
    # newer than any ROCm 7.x. Between (HIP 7 or 8 beside ROCm 10): not known.
    if rocm_major > LAST_MAJOR_NUMBERED_ALIKE and hip_major < LAST_MAJOR_NUMBERED_ALIKE:
        return True
    if hip_major > LAST_MAJOR_NUMBERED_ALIKE and rocm_major <= LAST_MAJOR_NUMBERED_ALIKE:
        return True
    return None


@rule(TRAIN, EXPORT_ON_GPU, CHAT, EVAL)
def rocm_version_mismatch(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    host = ctx.snapshot.host
    system = host.system_rocm
    hip = ctx.snapshot.torch.hip
    if not ctx.rocm or not system or not hip:
        return unchanged(config, env)  # not read (unknown layout, several TheRock installs): nothing said
    if not hip_and_rocm_majors_differ(hip, system):
        return unchanged(config, env)
    ops = jit_ops(config, ctx.snapshot.deepspeed_prebuilt_ops)
    where = f"/opt/rocm/{host.system_rocm_file}" if host.system_rocm_file else "/opt/rocm/.info/version"
    consequence = (
        f"DeepSpeed will build {', '.join(ops)} against ROCm {system} and stop on its HIP version check"
        if ops
        else "any op built at launch (DeepSpeed, flash-attn, bitsandbytes from source) compiles against "
        "the wrong headers and runtime"
    )
    torch_major = version_tuple(hip)[0]
    return unchanged(
        config,
        env,
        Finding(
            code="ROCM_VERSION_MISMATCH",
            level=Level.ERROR if ops else Level.WARNING,
            key=where,
            old=system,
            new=hip,
            message=f"torch {ctx.snapshot.torch.version} is built for HIP {hip} but the system ROCm is "
            f"{system} ({where}), another major version: {consequence}.",
            fix_with={"system_rocm": ".".join(map(str, version_tuple(system)[:2])), "torch_major": torch_major},
        ),
    )


@rule(TRAIN)
def jit_toolchain(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if not ctx.rocm:
        return unchanged(config, env)
    ops = jit_ops(config, ctx.snapshot.deepspeed_prebuilt_ops)
    host = ctx.snapshot.host
    missing = [name for name, have in (("ninja", host.ninja), ("hipcc", host.hipcc), ("ROCM_HOME", host.rocm_home))
               if have is False]  # fmt: skip
    if not ops or not missing:
        return unchanged(config, env)
    return unchanged(
        config,
        env,
        Finding(
            code="JIT_TOOLCHAIN_MISSING",
            key="deepspeed",
            old=missing,
            message=f"DeepSpeed JIT-builds {', '.join(ops)} at launch, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} missing here: the build stops before the first step "
            "('JIT compiled ops requires ninja', or no ROCm found by torch.utils.cpp_extension).",
        ),
    )


@rule(TRAIN, EXPORT_ON_GPU, CHAT, EVAL)
def wsl2(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    access = ctx.snapshot.access
    if not (ctx.rocm and access.dxg_exists and not access.kfd_exists):
        return unchanged(config, env)
    hip = version_tuple(ctx.snapshot.torch.hip or "")
    old_runtime = bool(hip) and hip < (7, 13) and not truthy(env.get("HSA_ENABLE_DXG_DETECTION", "0"))
    extra = " ROCm before 7.13 needs HSA_ENABLE_DXG_DETECTION=1 to find it inside a container." if old_runtime else ""
    return unchanged(
        config,
        env,
        Finding(
            code="WSL2_DXG",
            key="/dev/dxg",
            message="WSL2: the GPU is reached through /dev/dxg, not /dev/kfd; KFD topology and the "
            f"render/video groups do not apply here.{extra}",
            fix_as="runtime_before_7_13" if old_runtime else "runtime_7_13_or_later",
        ),
    )


@rule(TRAIN)
def page_fault_workaround(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    # The archs and the first ROCm that faults are the catalogue's hip_page_faults facts (N7, N8).
    faults = {arch: info for arch, info in ctx.arch_infos() if info is not None and info.hip_page_faults}
    if not ctx.rocm or not faults or env.get(NO_CACHING) == "1" or not _adapter_training(config):
        return unchanged(config, env)
    gemm = [arch for arch, info in faults.items() if info.hip_page_faults == "lora_backward_gemm"]
    access = [arch for arch, info in faults.items() if info.hip_page_faults == "memory_access"]
    hip = version_tuple(ctx.snapshot.torch.hip or "")
    first = [version_tuple(faults[arch].hip_page_faults_from_rocm or "0") for arch in gemm]
    if gemm and not access and hip and all(hip < since for since in first):
        return unchanged(config, env)  # the faulting hipBLASLt load is used from that ROCm on (N7)
    what = []
    if gemm:
        since = faults[gemm[0]].hip_page_faults_from_rocm or "?"
        what.append(
            f"{'/'.join(gemm)}: deterministic [gfxhub] page faults in LoRA's backward GEMMs on ROCm {since} and "
            "later (hipBLASLt reading past a narrow operand; fixed in ROCm/rocm-libraries PR #8909, release "
            f"unsettled), avoided with {NO_CACHING}=1 (ROCm/legacy-rocm-build#6647, #6600)"
        )
    if access:
        what.append(
            f"{'/'.join(access)} (Strix Halo): memory access faults are reported at model load and on the first "
            f"tensor (ROCm/legacy-rocm-build#6182, #5824); whether {NO_CACHING}=1 helps there is not established"
        )
    return unchanged(
        config,
        env,
        Finding(
            code="HIP_PAGE_FAULT_RISK",
            key=NO_CACHING,
            new="1",
            message="; ".join(what) + ".",
            fix_as="gemm_fault" if gemm else "access_fault_only",
        ),
    )
