"""One typed picture of the machine: what the rules look at instead of the hardware.

``probe.take_snapshot()`` fills it from the live machine; tests load recorded snapshots of real
cards from JSON, so every rule runs on a machine with no GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .catalogue import base_arch

# 2: iommu_pt replaces the kernel command line; groups are render/video only.
# 3: optional APU memory per device (carve-out, GTT, is_integrated, free), the host (RAM, system ROCm,
#    JIT toolchain) and /dev/dxg; a schema-2 file loads unchanged, the new facts as unknown (None).
# 4: the system ROCm's layout (legacy /opt/rocm or TheRock's /opt/rocm/core-X.Y) and the file its
#    version was read from; a schema-2/3 file loads unchanged, the layout as unknown (None).
SNAPSHOT_SCHEMA_VERSION = 4
# The only groups a rule asks about: /dev/kfd and /dev/dri/renderD* need them (docs/rocm-facts.md#r8).
# Others (often one named after the user) are not kept.
GPU_GROUPS = ("render", "video")

# What the world rule reads from the environment (rules/world.py): torchrun's and LLaMA-Factory's
# launcher variables, RCCL's and Ray's (docs/rocm-facts.md#l14, #w2, #w3, #w4).
WORLD_ENV_VARS = (
    "NNODES",
    "NODE_RANK",
    "NPROC_PER_NODE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RDZV_ID",
    "MIN_NNODES",
    "MAX_NNODES",
    "USE_RAY",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_MIN_NCHANNELS",
    "TORCH_NCCL_HIGH_PRIORITY",
    "HSA_NO_SCRATCH_RECLAIM",
    "HIP_FORCE_DEV_KERNARG",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES",
)
# Environment variables that change how ROCm, torch or the launcher behave (docs/rocm-facts.md#r6,
# docs/rocm-facts.md#f10 and docs/rocm-facts.md#f11). The probe records exactly these: the world's
# too, but not MASTER_ADDR (a host name stays out of records; the world rule reads it live).
RELEVANT_ENV_VARS = (
    "PYTORCH_ROCM_ARCH",
    "HSA_OVERRIDE_GFX_VERSION",
    "GPU_ARCHS",
    "CUDA_VISIBLE_DEVICES",
    "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL",
    "FLASH_ATTENTION_TRITON_AMD_ENABLE",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "GPU_MAX_HW_QUEUES",
    "FORCE_TORCHRUN",
    "OPTIM_TORCH",
    "ALLOW_EXTRA_ARGS",
    # RDNA4 / Strix Halo faults, Radeon multi-GPU hangs, WSL2 (docs/rocm-facts.md#n7, #n15, #n14)
    "PYTORCH_NO_HIP_MEMORY_CACHING",
    "NCCL_P2P_DISABLE",
    "HSA_ENABLE_DXG_DETECTION",
    *(name for name in WORLD_ENV_VARS if name != "MASTER_ADDR"),
)


class TorchBuild(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str | None = Field(description="torch.__version__, None when torch is missing")
    hip: str | None = Field(default=None, description="torch.version.hip")
    cuda: str | None = Field(default=None, description="torch.version.cuda")
    arch_list: list[str] = Field(default_factory=list, description="torch.cuda.get_arch_list()")

    @property
    def kind(self) -> str:
        if self.version is None:
            return "missing"
        if self.hip:
            return "rocm"
        if self.cuda:
            return "cuda"
        return "cpu"

    @property
    def base_arch_list(self) -> list[str]:
        return sorted({base_arch(a) for a in self.arch_list if a.startswith("gfx")})


class Device(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int
    name: str
    arch_name: str = Field(description="gcnArchName on ROCm, e.g. gfx942:sramecc+:xnack-; sm_XY on CUDA")
    total_memory_bytes: int
    # Unified memory and the iGPU (docs/rocm-facts.md#n9, #n10); None where not read (schema 2, CUDA).
    is_integrated: bool | None = Field(
        default=None, description="torch get_device_properties(i).is_integrated (HIP's integrated): an APU or iGPU"
    )
    vram_sysfs_bytes: int | None = Field(
        default=None, description="/sys/class/drm/cardN/device/mem_info_vram_total: VRAM, or an APU's carve-out"
    )
    gtt_sysfs_bytes: int | None = Field(
        default=None, description="/sys/class/drm/cardN/device/mem_info_gtt_total: system RAM the GPU may map"
    )
    free_memory_bytes: int | None = Field(
        default=None, description="torch.cuda.mem_get_info(i)[0] when probed; on an APU it can exceed the total"
    )

    @property
    def unified_budget_bytes(self) -> int | None:
        """carve-out + GTT: what the kernel lets an APU's GPU map (docs/rocm-facts.md#n9); None if unread."""
        if self.vram_sysfs_bytes is None or self.gtt_sysfs_bytes is None:
            return None
        return self.vram_sysfs_bytes + self.gtt_sysfs_bytes

    @property
    def base_arch(self) -> str:
        return base_arch(self.arch_name)

    @property
    def total_memory_gib(self) -> float:
        return self.total_memory_bytes / 2**30


class KfdNode(BaseModel):
    """One node of /sys/class/kfd/kfd/topology/nodes: the real hardware target, overrides aside."""

    model_config = ConfigDict(extra="forbid")

    node: int
    gfx_target_version: int = Field(description="major*10000 + minor*100 + stepping; 0 on CPU nodes")

    @property
    def target(self) -> str | None:
        return gfx_target_from_version(self.gfx_target_version)


class DeviceAccess(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kfd_exists: bool = False
    kfd_accessible: bool = False
    render_nodes: list[str] = Field(default_factory=list)
    render_nodes_accessible: bool = False
    user_groups: list[str] = Field(default_factory=list, description="render/video, where the user has them")
    dxg_exists: bool = Field(default=False, description="/dev/dxg: WSL2's GPU device (docs/rocm-facts.md#n14)")

    @field_validator("user_groups")
    @classmethod
    def _gpu_groups_only(cls, groups: list[str]) -> list[str]:
        return [g for g in groups if g in GPU_GROUPS]


class SystemRocm(BaseModel):
    """What the probe read of the system ROCm under /opt/rocm (docs/rocm-facts.md#n13, #n19)."""

    model_config = ConfigDict(extra="forbid")

    version: str | None = None
    layout: str = Field(description="'legacy', 'therock', 'unknown' (a /opt/rocm without a version file) or 'absent'")
    file: str | None = Field(default=None, description="the file the version was read from, relative to /opt/rocm")
    installs: list[str] = Field(default_factory=list, description="TheRock core-X.Y folders when several")


class Host(BaseModel):
    """The machine around the GPUs: RAM (an APU's GPU takes its memory from it), the system ROCm and
    the tools DeepSpeed's JIT-built ops need (docs/rocm-facts.md#n9, #n13). Presence only, never a path."""

    model_config = ConfigDict(extra="forbid")

    memory_total_bytes: int | None = Field(default=None, description="/proc/meminfo MemTotal")
    memory_available_bytes: int | None = Field(default=None, description="/proc/meminfo MemAvailable")
    system_rocm: str | None = Field(
        default=None, description="the system ROCm's version, from the file system_rocm_file names"
    )
    system_rocm_layout: str | None = Field(
        default=None,
        description="'legacy' (/opt/rocm/.info/version), 'therock' (/opt/rocm/core[-X.Y]/.info/version), "
        "'unknown' (/opt/rocm without a version file), 'absent'; None where not probed (schema 3 and before)",
    )
    system_rocm_file: str | None = Field(
        default=None, description="relative to /opt/rocm, e.g. core-10.0/.info/version"
    )
    system_rocm_installs: list[str] = Field(
        default_factory=list, description="TheRock's core-X.Y folders when several and no core link: version not read"
    )

    @property
    def system_rocm_where(self) -> str:
        """Where the version was read, or why it was not, in words for doctor and the findings."""
        if self.system_rocm_file:
            return f"/opt/rocm/{self.system_rocm_file}, {self.system_rocm_layout} layout"
        if self.system_rocm_installs:
            return (
                f"TheRock layout with several installs ({', '.join(self.system_rocm_installs)}) and no "
                "/opt/rocm/core link: version not read"
            )
        if self.system_rocm_layout == "unknown":
            return "/opt/rocm holds neither .info/version nor TheRock's core-X.Y: version not read"
        if self.system_rocm_layout == "absent":
            return "no /opt/rocm"
        return "/opt/rocm/.info/version" if self.system_rocm else "not read"

    hipcc: bool | None = Field(default=None, description="hipcc on PATH or in ROCM_HOME/bin")
    ninja: bool | None = Field(default=None, description="ninja on PATH (DeepSpeed: 'JIT compiled ops requires ninja')")
    rocm_home: bool | None = Field(default=None, description="torch.utils.cpp_extension.ROCM_HOME was found")

    @property
    def memory_gib(self) -> float | None:
        return None if self.memory_total_bytes is None else self.memory_total_bytes / 2**30


class Snapshot(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = SNAPSHOT_SCHEMA_VERSION
    source: str = Field(description="'probe', 'planned: <gpu>' or 'recorded: <where from>'")
    torch: TorchBuild
    devices: list[Device] = Field(default_factory=list)
    kfd_nodes: list[KfdNode] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    packages: dict[str, str | None] = Field(
        default_factory=dict, description="versions of flash_attn, bitsandbytes, deepspeed, ..."
    )
    deepspeed_prebuilt_ops: list[str] | None = Field(
        default=None,
        description="DeepSpeed ops built when DeepSpeed was installed (its git_version_info_installed.py "
        "installed_ops): those are loaded, not JIT-built at launch; None when not read",
    )
    iommu_pt: bool | None = Field(
        default=None,
        description="the kernel command line has iommu=pt (RCCL wants it); None when unknown. "
        "The line itself is never kept: it can hold host-specific paths and ids",
    )
    access: DeviceAccess = Field(default_factory=DeviceAccess)
    python: str | None = None
    host: Host = Field(default_factory=Host)
    set_aside: list[Device] = Field(
        default_factory=list,
        description="integrated devices training_view() left out of the plan (an iGPU beside a discrete card)",
    )

    @model_validator(mode="before")
    @classmethod
    def _reduce_legacy_cmdline(cls, data: Any) -> Any:
        """Snapshots saved before schema 2 hold the whole ``kernel_cmdline``: keep only ``iommu_pt``."""
        if isinstance(data, dict) and "kernel_cmdline" in data:
            data = dict(data)
            line = data.pop("kernel_cmdline")
            if "iommu_pt" not in data:
                data["iommu_pt"] = None if line is None else iommu_pt_in(str(line))
            data["schema_version"] = SNAPSHOT_SCHEMA_VERSION
        if isinstance(data, dict) and isinstance(data.get("schema_version"), int) and data["schema_version"] in (2, 3):
            # 2 -> 3 -> 4 added optional fields only: they load as unknown.
            data = {**data, "schema_version": SNAPSHOT_SCHEMA_VERSION}
        return data

    @property
    def is_rocm(self) -> bool:
        return self.torch.kind == "rocm"

    @property
    def gpu_base_archs(self) -> list[str]:
        """Distinct base archs of the visible devices, in device order."""
        seen: list[str] = []
        for device in self.devices:
            if device.base_arch not in seen:
                seen.append(device.base_arch)
        return seen

    @property
    def kfd_targets(self) -> list[str]:
        """Real GPU targets from KFD sysfs (CPU nodes report 0 and are left out)."""
        return [t for t in (n.target for n in self.kfd_nodes) if t]

    def integrated_devices(self) -> list[Device]:
        """Devices that are an APU or an iGPU: torch's ``is_integrated`` where the probe read it, else a
        target whose every catalogued product is integrated (gfx1036, gfx1103, gfx115x; docs/rocm-facts.md#n10).
        gfx942 is not guessed: it is an MI300X and an MI300A."""
        from .catalogue import load_catalogue

        catalogue = load_catalogue()
        found = []
        for device in self.devices:
            if device.is_integrated is None:
                info = catalogue.arch(device.arch_name)
                integrated = bool(info and info.products and all(p.integrated for p in info.products))
            else:
                integrated = device.is_integrated
            if integrated:
                found.append(device)
        return found

    def training_view(self) -> Snapshot:
        """The machine a run should plan on: an iGPU beside a discrete card is set aside (``set_aside``),
        with its KFD node, so world, arch and memory rules see the discrete card(s) only. An APU alone
        (Strix Halo) is the GPU and stays. Device indices keep torch's numbering, the value
        HIP_VISIBLE_DEVICES needs (docs/rocm-facts.md#n10, #n11)."""
        integrated = self.integrated_devices()
        if not integrated or len(integrated) == len(self.devices):
            return self
        kept = [d for d in self.devices if d not in integrated]
        kept_archs = {d.base_arch for d in kept}
        dropped_archs = {d.base_arch for d in integrated} - kept_archs
        nodes = [n for n in self.kfd_nodes if n.target not in dropped_archs]
        return self.model_copy(
            update={"devices": kept, "kfd_nodes": nodes, "set_aside": [*self.set_aside, *integrated]}, deep=True
        )

    def save(self, path: str | Path, *, overwrite: bool = True) -> None:
        """``overwrite=False``: UsageError where ``path`` exists (the user's file is never replaced)."""
        from ..errors import UsageError
        from ..fsutil import atomic_write_text

        try:
            atomic_write_text(Path(path), self.model_dump_json(indent=2) + "\n", overwrite=overwrite)
        except FileExistsError:
            raise UsageError(f"{path} exists: give --save-snapshot a new file name (nothing was written).") from None

    @classmethod
    def load(cls, path: str | Path) -> Snapshot:
        return cls.model_validate(json.loads(Path(path).read_text(encoding="utf-8")))


def iommu_pt_in(cmdline: str) -> bool:
    """Whether a kernel command line passes ``iommu=pt`` (docs/rocm-facts.md#r7, #f10)."""
    return "iommu=pt" in cmdline.split()


def gfx_target_from_version(value: int) -> str | None:
    """KFD ``gfx_target_version`` -> target name: 90010 -> gfx90a, 110001 -> gfx1101, 0 -> None.

    The stepping is written as one hex digit (docs/rocm-facts.md#r5).
    """
    if value <= 0:
        return None
    major, rest = divmod(value, 10000)
    minor, stepping = divmod(rest, 100)
    return f"gfx{major}{minor}{stepping:x}"
