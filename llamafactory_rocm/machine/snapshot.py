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

SNAPSHOT_SCHEMA_VERSION = 2  # 2: iommu_pt replaces the kernel command line; groups are render/video only
# The only groups a rule asks about: /dev/kfd and /dev/dri/renderD* need them (docs/rocm-facts.md#r8).
# Others (often one named after the user) are not kept.
GPU_GROUPS = ("render", "video")

# Environment variables that change how ROCm, torch or the launcher behave (docs/rocm-facts.md#r6,
# docs/rocm-facts.md#f10 and docs/rocm-facts.md#f11). The probe records exactly these.
RELEVANT_ENV_VARS = (
    "PYTORCH_ROCM_ARCH",
    "HSA_OVERRIDE_GFX_VERSION",
    "GPU_ARCHS",
    "HIP_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL",
    "FLASH_ATTENTION_TRITON_AMD_ENABLE",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "HSA_NO_SCRATCH_RECLAIM",
    "GPU_MAX_HW_QUEUES",
    "HIP_FORCE_DEV_KERNARG",
    "NCCL_MIN_NCHANNELS",
    "TORCH_NCCL_HIGH_PRIORITY",
    "FORCE_TORCHRUN",
    "NPROC_PER_NODE",
    "OPTIM_TORCH",
    "ALLOW_EXTRA_ARGS",
    # the world, RCCL and Ray (rules/world.py); not MASTER_ADDR: a host name stays out of records
    "NNODES",
    "NODE_RANK",
    "MASTER_PORT",
    "RDZV_ID",
    "MIN_NNODES",
    "MAX_NNODES",
    "USE_RAY",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES",
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

    @field_validator("user_groups")
    @classmethod
    def _gpu_groups_only(cls, groups: list[str]) -> list[str]:
        return [g for g in groups if g in GPU_GROUPS]


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
    iommu_pt: bool | None = Field(
        default=None,
        description="the kernel command line has iommu=pt (RCCL wants it); None when unknown. "
        "The line itself is never kept: it can hold host-specific paths and ids",
    )
    access: DeviceAccess = Field(default_factory=DeviceAccess)
    python: str | None = None

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
