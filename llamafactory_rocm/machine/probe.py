"""The only module that reads the machine: torch build, devices, KFD sysfs, environment, packages."""

from __future__ import annotations

import grp
import os
import platform
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from .snapshot import GPU_GROUPS, RELEVANT_ENV_VARS, Device, DeviceAccess, KfdNode, Snapshot, TorchBuild, iommu_pt_in

KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")
PACKAGES = ("flash_attn", "bitsandbytes", "deepspeed", "llamafactory", "transformers", "peft", "torchaudio")


def relevant_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in RELEVANT_ENV_VARS if k in environ}


def probe_torch() -> tuple[TorchBuild, list[Device]]:
    try:
        import torch
    except ImportError:
        return TorchBuild(version=None), []
    build = TorchBuild(
        version=torch.__version__,
        hip=getattr(torch.version, "hip", None),
        cuda=getattr(torch.version, "cuda", None),
    )
    devices: list[Device] = []
    try:
        available = torch.cuda.is_available()
    except Exception:  # a broken driver must not stop the report
        available = False
    if available:
        build.arch_list = list(torch.cuda.get_arch_list())
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            arch = getattr(props, "gcnArchName", "") or f"sm_{props.major}{props.minor}"
            devices.append(Device(index=index, name=props.name, arch_name=arch, total_memory_bytes=props.total_memory))
    return build, devices


def probe_kfd(root: Path = KFD_NODES) -> list[KfdNode]:
    nodes: list[KfdNode] = []
    if not root.is_dir():
        return nodes
    for node_dir in sorted(root.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        try:
            text = (node_dir / "properties").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "gfx_target_version" and value.strip().isdigit() and node_dir.name.isdigit():
                nodes.append(KfdNode(node=int(node_dir.name), gfx_target_version=int(value)))
    return nodes


def probe_access() -> DeviceAccess:
    kfd = Path("/dev/kfd")
    render = sorted(str(p) for p in Path("/dev/dri").glob("renderD*")) if Path("/dev/dri").is_dir() else []
    try:
        # Only the groups the device nodes need: a personal group would name the user.
        groups = sorted({name for g in os.getgroups() if (name := grp.getgrgid(g).gr_name) in GPU_GROUPS})
    except (KeyError, OSError):
        groups = []
    return DeviceAccess(
        kfd_exists=kfd.exists(),
        kfd_accessible=kfd.exists() and os.access(kfd, os.R_OK | os.W_OK),
        render_nodes=render,
        render_nodes_accessible=bool(render) and all(os.access(p, os.R_OK | os.W_OK) for p in render),
        user_groups=groups,
    )


def probe_packages() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            try:
                found[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                found[name] = None
    return found


def read_iommu_pt(path: Path = Path("/proc/cmdline")) -> bool | None:
    """Whether the kernel was booted with iommu=pt; None when unreadable.

    Only this answer leaves the function: the command line holds root devices, UUIDs and paths
    that have no place in a report people post (doctor --json, snapshots, launch records).
    """
    try:
        return iommu_pt_in(path.read_text())
    except OSError:
        return None


def take_snapshot() -> Snapshot:
    build, devices = probe_torch()
    return Snapshot(
        source="probe",
        torch=build,
        devices=devices,
        kfd_nodes=probe_kfd(),
        env=relevant_env(),
        packages=probe_packages(),
        iommu_pt=read_iommu_pt(),
        access=probe_access(),
        python=platform.python_version(),
    )


def installed_distributions() -> frozenset[str]:
    """Names of the installed distributions, normalised (lowercase, '-' for '_'): what a config's keys need."""
    return frozenset((dist.metadata["Name"] or "").lower().replace("_", "-") for dist in metadata.distributions())
