"""Multi-GPU settings that hang or crawl on AMD (docs/rocm-facts.md#f10, docs/rocm-facts.md#f11; Radeon
peer-to-peer: docs/rocm-facts.md#n15)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..findings import Finding
from ..lf.commands import TRAIN
from .base import Context, Step, env_enabled, rule, unchanged
from .kernels import version_tuple


@rule(TRAIN)
def multi_gpu_notices(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    snap = ctx.snapshot
    count = len(snap.devices)
    if not ctx.rocm or count < 2:
        return unchanged(config, env)
    findings = []
    if snap.iommu_pt is False:  # None: unknown (a planned target, or /proc/cmdline unreadable)
        findings.append(iommu_pt_missing(f"{count} GPUs"))
    infos = [(arch, info) for arch, info in ctx.arch_infos() if info is not None]
    if any(count in info.slow_partial_node_gpu_counts for _, info in infos):  # MI300X: 1 or 8 per job
        findings.append(
            Finding(
                code="MI300X_PARTIAL_NODE",
                message=f"{count} MI300X GPUs: AMD's guidance is 1 or 8 per job; 2- and 4-GPU "
                "collectives are slow (ROCm workload.rst).",
            )
        )
    p2p_off = env.get("NCCL_P2P_DISABLE") == "1"
    if any(info.multi_gpu_ddp_report for _, info in infos):  # RX 7900 XTX
        findings.append(
            Finding(
                code="RDNA3_DDP_KNOWN_ISSUE",
                key="NCCL_P2P_DISABLE",
                old=env.get("NCCL_P2P_DISABLE"),
                new=None if p2p_off else "1",
                message="DDP across several RX 7900 XTX is reported to fail (hiyouga/LLaMA-Factory#6271, open); "
                "Radeon multi-GPU runs hang in RCCL without NCCL_P2P_DISABLE=1 (ROCm/vllm#390)"
                + (" (set here)." if p2p_off else "."),
                fix_as="p2p_disabled" if p2p_off else "p2p_enabled",
            )
        )
    rdna4 = [arch for arch, info in infos if info.p2p_hang]  # RDNA4 Radeons
    if rdna4 and not p2p_off:
        findings.append(
            Finding(
                code="RADEON_P2P_HANG",
                key="NCCL_P2P_DISABLE",
                new="1",
                message=f"{count} Radeon RDNA4 GPUs ({', '.join(rdna4)}): direct PCIe peer-to-peer is reported to "
                "hang RCCL and, on 4x R9700, the host (ROCm/rocm-systems#11348, open; ROCm/vllm#390).",
            )
        )
    hip = snap.torch.hip or ""
    if hip and version_tuple(hip) < (7, 0) and env_enabled(env, "OPTIM_TORCH", "1"):
        findings.append(
            Finding(
                code="EXPANDABLE_SEGMENTS_OLD_ROCM",
                key="OPTIM_TORCH",
                message="LLaMA-Factory's multi-GPU launcher sets PYTORCH_CUDA_ALLOC_CONF="
                f"expandable_segments:True, which ROCm {hip} does not support (from ROCm 7.0).",
            )
        )
    return unchanged(config, env, *findings)


def iommu_pt_missing(what: str) -> Finding:
    """RCCL needs iommu=pt for collectives between GPUs, on one node or several (ROCm/rccl#1129)."""
    return Finding(
        code="IOMMU_PT_MISSING",
        key="/proc/cmdline",
        message=f'{what} but "iommu=pt" is missing from the kernel command line: RCCL '
        "collectives can hang or crawl (ROCm/rccl#1129).",
    )
