"""Is this machine ready to fine-tune? One line per topic: pass / warn / fail, with the fix.

Machine-level verdicts come from the same rules ``check`` runs (on an empty config), so doctor and
check never disagree; doctor adds the inventory around them (devices, packages, access, RCCL env).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..findings import Finding, Level, explain_hint
from ..lf.schema import train_keys
from ..machine.catalogue import load_catalogue
from ..machine.snapshot import Snapshot
from ..rules import Context, resolve
from ..rules.environment import hip_and_rocm_majors_differ
from ..rules.kernels import flash_attn_gap, version_tuple

PASS, WARN, FAIL = "pass", "warn", "fail"
RCCL_VARS = {  # docs/rocm-facts.md#f10 (ROCm workload.rst, MI300X guidance)
    "NCCL_MIN_NCHANNELS": "112",
    "TORCH_NCCL_HIGH_PRIORITY": "1",
    "GPU_MAX_HW_QUEUES": "2",
    "HIP_FORCE_DEV_KERNARG": "1",
}
_LEVEL_TO_STATUS = {Level.ERROR: FAIL, Level.WARNING: WARN, Level.CHANGE: WARN, Level.INFO: PASS}
# The topic a machine-level finding is shown under (others: "check").
TOPICS = {
    "IGPU_VISIBLE": "integrated GPU",
    "VISIBLE_DEVICES_CONFLICT": "visible devices",
    "HSA_OVERRIDE_NOT_NEEDED": "HSA_OVERRIDE_GFX_VERSION",
    "HSA_OVERRIDE_CROSS_FAMILY": "HSA_OVERRIDE_GFX_VERSION",
    "HSA_OVERRIDE_ACTIVE": "HSA_OVERRIDE_GFX_VERSION",
    "HSA_OVERRIDE_MALFORMED": "HSA_OVERRIDE_GFX_VERSION",
    "ROCM_VERSION_MISMATCH": "system ROCm",
    "JIT_TOOLCHAIN_MISSING": "JIT toolchain",
    "WSL2_DXG": "/dev/dxg",
    "HIP_PAGE_FAULT_RISK": "page faults",
    "RADEON_P2P_HANG": "NCCL_P2P_DISABLE",
    "RDNA3_DDP_KNOWN_ISSUE": "NCCL_P2P_DISABLE",
    "APU_HOST_MEMORY_LOW": "unified memory",
}


@dataclass(frozen=True)
class Line:
    status: str
    topic: str
    detail: str
    fix: str = ""
    code: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)


def _from_finding(topic: str, finding: Finding) -> Line:
    fix = f"{finding.fix} {explain_hint(finding.code)}"
    return Line(_LEVEL_TO_STATUS[finding.level], TOPICS.get(finding.code, topic), finding.message, fix, finding.code)


def torch_lines(snap: Snapshot) -> list[Line]:
    t = snap.torch
    if t.kind == "rocm":
        return [Line(PASS, "torch", f"{t.version}, ROCm build, HIP {t.hip}")]
    if t.kind == "cuda" and not snap.kfd_targets:
        return [Line(PASS, "torch", f"{t.version}, CUDA {t.cuda} build (an NVIDIA machine: nothing ROCm to check)")]
    if t.kind == "cpu" and not snap.kfd_targets:
        return [
            Line(
                WARN,
                "torch",
                f"{t.version}, CPU-only build, and no GPU on this machine",
                "This machine can plan (`check --gpu mi300x`) and run `llamafactory-rocm demo`, not train on a GPU.",
            )
        ]
    return []  # missing torch or a CPU/CUDA wheel on an AMD machine: the rules below say it


def device_lines(snap: Snapshot) -> list[Line]:
    lines = []
    aside = snap.training_view().set_aside
    for d in snap.devices:
        detail = f"{d.name}, {d.arch_name}, {d.total_memory_gib:.1f} GiB"
        if d.is_integrated and d.unified_budget_bytes is not None:
            detail += (
                f" (integrated: carve-out {d.vram_sysfs_bytes / 2**30:.1f} GiB + GTT "
                f"{d.gtt_sysfs_bytes / 2**30:.1f} GiB of system RAM)"
            )
        elif d.is_integrated:
            detail += " (integrated: its memory is system RAM)"
        if d in aside:
            detail += "; an iGPU beside a discrete card: left out of the plan"
        lines.append(Line(PASS, f"gpu {d.index}", detail))
    if snap.is_rocm:
        lines.append(Line(PASS, "torch archs", ", ".join(snap.torch.base_arch_list) or "-"))
    if snap.kfd_targets:
        lines.append(Line(PASS, "kfd targets", ", ".join(snap.kfd_targets)))
    return lines


def access_lines(snap: Snapshot) -> list[Line]:
    if not (snap.is_rocm or snap.kfd_targets):
        return []
    a = snap.access
    fix = "sudo usermod -aG render,video $USER and log in again; in docker: --device /dev/kfd --device /dev/dri"
    if not a.kfd_exists and a.dxg_exists:
        # WSL2 (docs/rocm-facts.md#n14): /dev/dxg replaces /dev/kfd; the rules' WSL2_DXG line says the rest.
        return [Line(PASS, "/dev/kfd", "absent, as under WSL2: the GPU is reached through /dev/dxg")]
    if not a.kfd_exists:
        return [Line(FAIL, "/dev/kfd", "missing: the amdgpu kernel driver is not loaded", "Install/load amdgpu-dkms.")]
    if not (a.kfd_accessible and a.render_nodes_accessible):
        return [Line(FAIL, "/dev/kfd", f"not accessible (groups: {', '.join(a.user_groups) or '-'})", fix)]
    return [Line(PASS, "/dev/kfd", f"accessible; render nodes {', '.join(a.render_nodes)}")]


def package_lines(snap: Snapshot, ctx: Context) -> list[Line]:
    if not snap.is_rocm:
        return []
    pk = snap.packages
    lines = []
    gap = flash_attn_gap(ctx, snap.env)
    if not pk.get("flash_attn"):
        lines.append(Line(PASS, "flash-attn", "not installed: LLaMA-Factory uses SDPA (check rewrites fa2 to sdpa)"))
    elif gap:
        lines.append(
            Line(
                WARN,
                "flash-attn",
                f"{pk['flash_attn']}: {gap}",
                f"Use flash_attn: sdpa. {explain_hint('FLASH_ATTN_TO_SDPA')}",
                "FLASH_ATTN_TO_SDPA",
            )
        )
    else:
        lines.append(Line(PASS, "flash-attn", f"{pk['flash_attn']} covers {', '.join(snap.gpu_base_archs)}"))
    needs = [(a, i.bitsandbytes_min_version if i else None) for a, i in ctx.arch_infos()]
    bnb = pk.get("bitsandbytes")
    if not bnb:
        lines.append(Line(PASS, "bitsandbytes", "not installed: QLoRA unavailable, LoRA is fine"))
    else:
        short = [a for a, need in needs if need is None or version_tuple(bnb) < version_tuple(need)]
        status = WARN if short else PASS
        # Each arch's floor is the catalogue's bitsandbytes_min_version (docs/rocm-facts.md#f9).
        floors = [f"{a}: >= {need}" if need else f"{a}: no ROCm build" for a, need in needs if a in short]
        fix = f"QLoRA needs bitsandbytes with ROCm kernels for the arch ({'; '.join(floors)})." if short else ""
        lines.append(
            Line(
                status, "bitsandbytes", f"{bnb}" + (f": no QLoRA kernels for {', '.join(short)}" if short else ""), fix
            )
        )
    ds = pk.get("deepspeed")
    lines.append(
        Line(
            PASS,
            "deepspeed",
            f"{ds}: its ops JIT-build for PYTORCH_ROCM_ARCH" if ds else "not installed (single-GPU LoRA needs none)",
        )
    )
    return lines


def host_lines(snap: Snapshot) -> list[Line]:
    """System ROCm beside torch's HIP, the JIT toolchain and the RAM an APU shares (docs/rocm-facts.md#n13, #n9)."""
    if not snap.is_rocm:
        return []
    host = snap.host
    lines = []
    if host.system_rocm:
        detail = f"{host.system_rocm} ({host.system_rocm_where}); torch HIP {snap.torch.hip}"
        if snap.torch.hip and hip_and_rocm_majors_differ(snap.torch.hip, host.system_rocm) is None:
            # docs/rocm-facts.md#n19: past ROCm 7 the HIP and ROCm numbers may diverge.
            detail += (
                ": majors not compared (past ROCm 7, which HIP major a ROCm release ships is not settled); "
                "check that torch's wheel was built for this ROCm"
            )
        lines.append(Line(PASS, "system ROCm", detail))
    elif host.system_rocm_layout is not None:
        lines.append(Line(PASS, "system ROCm", f"{host.system_rocm_where}; torch HIP {snap.torch.hip}"))
    tools = {"ninja": host.ninja, "hipcc": host.hipcc, "ROCM_HOME": host.rocm_home}
    if any(v is not None for v in tools.values()):
        missing = [name for name, have in tools.items() if have is False]
        needs = bool(snap.packages.get("deepspeed"))
        detail = f"{', '.join(missing)} missing" if missing else "ninja, hipcc and ROCM_HOME found"
        detail += ": DeepSpeed's JIT-built ops (CPUAdam, FusedAdam) need all three" if missing else ""
        fix = "pip install ninja; install ROCm's hipcc; export ROCM_HOME=/opt/rocm" if missing and needs else ""
        lines.append(Line(WARN if missing and needs else PASS, "JIT toolchain", detail, fix))
    if host.memory_total_bytes and any(d.is_integrated for d in snap.devices):
        avail = host.memory_available_bytes
        more = f", {avail / 2**30:.1f} GiB available" if avail else ""
        ram = f"RAM {host.memory_total_bytes / 2**30:.1f} GiB{more}"
        lines.append(Line(PASS, "unified memory", f"{ram}: what the APU's GPU uses is taken from it"))
    return lines


def env_lines(snap: Snapshot) -> list[Line]:
    shown = (
        "PYTORCH_ROCM_ARCH",
        "HSA_OVERRIDE_GFX_VERSION",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
        "PYTORCH_NO_HIP_MEMORY_CACHING",
        "NCCL_P2P_DISABLE",
        "HSA_ENABLE_DXG_DETECTION",
    )
    values = ", ".join(f"{k}={snap.env[k]}" for k in shown if k in snap.env)
    return [Line(PASS, "environment", values or f"{', '.join(shown[:2])} unset")]


def rccl_lines(snap: Snapshot) -> list[Line]:
    if not (snap.is_rocm and len(snap.devices) > 1):
        return []
    lines = []
    for var, value in RCCL_VARS.items():
        have = snap.env.get(var)
        if have is None:
            lines.append(
                Line(PASS, var, f"unset (AMD's MI300X guidance: {value})", f"export {var}={value} for FSDP/DDP")
            )
        else:
            lines.append(Line(PASS, var, have))
    return lines


def diagnose(snap: Snapshot) -> list[Line]:
    # The rules see the machine a run plans on: an iGPU beside a discrete card is set aside (one
    # IGPU_VISIBLE line says how to hide it), as check does.
    view = snap.training_view()
    ctx = Context(
        snapshot=view,
        catalogue=load_catalogue(),
        known_keys=train_keys(),
        integrated_devices=tuple(view.set_aside),
    )
    machine = resolve({}, snap.env, ctx)
    rule_lines = [_from_finding("check", f) for f in machine.findings]
    return (
        torch_lines(snap)
        + device_lines(snap)
        + env_lines(snap)
        + rule_lines
        + access_lines(snap)
        + host_lines(snap)
        + package_lines(snap, ctx)
        + rccl_lines(view)
        + exposure_lines(snap)
    )


def exposure_lines(snap: Snapshot) -> list[Line]:
    """LlamaBoard, webchat or the API would listen beyond the loopback without a password or key (lf/exposure.py,
    read as LLaMA-Factory reads this shell's variables); only on this machine, where those packages are."""
    import importlib.util

    if snap.source != "probe" or not any(importlib.util.find_spec(name) for name in ("gradio", "fastapi")):
        return []
    from ..lf.exposure import exposure_findings

    return [_from_finding("exposure", finding) for finding in exposure_findings()]


def has_fail(lines: list[Line]) -> bool:
    return any(line.status == FAIL for line in lines)
