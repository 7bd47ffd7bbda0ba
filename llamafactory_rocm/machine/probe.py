"""The only module that reads the machine: torch build, devices, KFD sysfs, environment, packages."""

from __future__ import annotations

import grp
import os
import platform
import re
import shutil
import sys
from collections.abc import Mapping
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from .snapshot import (
    GPU_GROUPS,
    RELEVANT_ENV_VARS,
    Device,
    DeviceAccess,
    Host,
    KfdNode,
    Snapshot,
    SystemRocm,
    TorchBuild,
    iommu_pt_in,
)

KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")
DRM_CARDS = Path("/sys/class/drm")
ROCM_ROOT = Path("/opt/rocm")
# TheRock's native packages (amdrocm-*) install into /opt/rocm/core-<major>.<minor> (docs/rocm-facts.md#n19).
_THEROCK_CORE = re.compile(r"^core-(\d+)\.(\d+)$")
_PCI_ADDRESS = re.compile(r"^([0-9a-f]{4,}):([0-9a-f]{2}):([0-9a-f]{2})\.[0-7]$")
PciKey = tuple[int, int, int]  # (domain, bus, device)
PACKAGES = ("flash_attn", "bitsandbytes", "deepspeed", "llamafactory", "transformers", "peft", "torchaudio")


def relevant_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in RELEVANT_ENV_VARS if k in environ}


def _probe_torch() -> tuple[TorchBuild, list[tuple[Device, PciKey | None]]]:
    """The build and each device with its PCI address (to find its DRM card; not kept in the snapshot)."""
    try:
        import torch
    except ImportError:
        return TorchBuild(version=None), []
    build = TorchBuild(
        version=torch.__version__,
        hip=getattr(torch.version, "hip", None),
        cuda=getattr(torch.version, "cuda", None),
    )
    devices: list[tuple[Device, PciKey | None]] = []
    try:
        available = torch.cuda.is_available()
    except Exception:  # a broken driver must not stop the report
        available = False
    if available:
        build.arch_list = list(torch.cuda.get_arch_list())
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            arch = getattr(props, "gcnArchName", "") or f"sm_{props.major}{props.minor}"
            integrated = getattr(props, "is_integrated", None)  # docs/rocm-facts.md#n10
            try:
                free: int | None = int(torch.cuda.mem_get_info(index)[0])
            except Exception:  # an old torch or a device that refuses the query: unknown, not fatal
                free = None
            device = Device(
                index=index,
                name=props.name,
                arch_name=arch,
                total_memory_bytes=props.total_memory,
                is_integrated=None if integrated is None else bool(integrated),
                free_memory_bytes=free,
            )
            pci = tuple(getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
            devices.append((device, pci if all(isinstance(v, int) for v in pci) else None))  # type: ignore[misc]
    return build, devices


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def probe_drm(root: Path = DRM_CARDS) -> dict[PciKey | None, tuple[int | None, int | None]]:
    """amdgpu's memory per DRM card, by PCI address: (mem_info_vram_total, mem_info_gtt_total) in bytes
    (docs/rocm-facts.md#n9). Cards without these files (other drivers, connectors) are left out; a card
    whose PCI address cannot be read is keyed None."""
    found: dict[PciKey | None, tuple[int | None, int | None]] = {}
    if not root.is_dir():
        return found
    for card in sorted(root.glob("card[0-9]*")):
        if not card.name[4:].isdigit():
            continue  # card0-DP-1 and the like: connectors, not devices
        device = card / "device"
        vram, gtt = _read_int(device / "mem_info_vram_total"), _read_int(device / "mem_info_gtt_total")
        if vram is None and gtt is None:
            continue
        found[pci_key(os.path.realpath(device))] = (vram, gtt)
    return found


def pci_key(device_path: str) -> PciKey | None:
    """``/sys/devices/pci0000:00/0000:00:01.1/0000:03:00.0`` -> (0, 3, 0); None when not a PCI address."""
    match = _PCI_ADDRESS.match(Path(device_path).name.lower())
    if not match:
        return None
    domain, bus, dev = match.groups()
    return int(domain, 16), int(bus, 16), int(dev, 16)


def attach_drm_memory(
    found: list[tuple[Device, PciKey | None]], cards: Mapping[PciKey | None, tuple[int | None, int | None]]
) -> list[Device]:
    """Each torch device with its card's carve-out/VRAM and GTT: matched by PCI address, or, with one
    device and one card, to that card. Unmatched devices keep None (unknown), never a guess. The match
    by PCI address was not tried on AMD hardware here (docs/rdna4-strixhalo.md)."""
    out = []
    for device, pci in found:
        memory = cards.get(pci) if pci is not None else None
        if memory is None and len(found) == 1 and len(cards) == 1:
            memory = next(iter(cards.values()))
        if memory is not None:
            device = device.model_copy(update={"vram_sysfs_bytes": memory[0], "gtt_sysfs_bytes": memory[1]})
        out.append(device)
    return out


def read_meminfo(path: Path = Path("/proc/meminfo")) -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) in bytes; None where unreadable."""
    values: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return None, None
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if key in ("MemTotal", "MemAvailable") and parts and parts[0].isdigit():
            values[key] = int(parts[0]) * 1024  # kB
    return values.get("MemTotal"), values.get("MemAvailable")


def _read_version(info: Path) -> str | None:
    """The first line of ``info/version``, else ``info/version-dev``; None where neither is readable."""
    for name in ("version", "version-dev"):
        try:
            text = (info / name).read_text().strip()
        except OSError:
            continue
        if text:
            return text.splitlines()[0].strip()[:40]
    return None


def read_system_rocm(root: Path = ROCM_ROOT) -> SystemRocm:
    """The system ROCm's version and the layout it was read from (docs/rocm-facts.md#n13, #n19).

    legacy: ``/opt/rocm/.info/version`` (else ``version-dev``), what ROCm releases through 7.x write.
    therock: TheRock's native packages, ``/opt/rocm/core-X.Y/.info/version``; ``/opt/rocm/core`` is
    their link to the default one. Several ``core-X.Y`` and no ``core`` link: which one a build uses
    is not known, so no version is read (never a guess). A /opt/rocm with neither: ``unknown``.
    Only paths under /opt/rocm are named, never one of the user's.
    """
    if not root.is_dir():
        return SystemRocm(layout="absent")
    version = _read_version(root / ".info")
    if version:
        return SystemRocm(version=version, layout="legacy", file=".info/version")
    version = _read_version(root / "core" / ".info")
    if version:
        return SystemRocm(version=version, layout="therock", file="core/.info/version")
    cores = sorted(
        (child for child in root.iterdir() if _THEROCK_CORE.match(child.name) and child.is_dir()),
        key=lambda child: tuple(int(n) for n in _THEROCK_CORE.match(child.name).groups()),  # type: ignore[union-attr]
    )
    if len(cores) == 1:
        version = _read_version(cores[0] / ".info")
        if version:
            return SystemRocm(version=version, layout="therock", file=f"{cores[0].name}/.info/version")
    if cores:
        return SystemRocm(layout="therock", installs=[c.name for c in cores])
    return SystemRocm(layout="unknown")


def probe_host() -> Host:
    total, available = read_meminfo()
    rocm_home: str | None = None
    try:
        from torch.utils.cpp_extension import ROCM_HOME  # what DeepSpeed's op builder asks (#n13)

        rocm_home = ROCM_HOME
    except Exception:  # no torch, or a CPU/CUDA torch without the attribute
        rocm_home = None
    hipcc = shutil.which("hipcc") is not None or bool(rocm_home and Path(rocm_home, "bin", "hipcc").is_file())
    system = read_system_rocm()
    return Host(
        memory_total_bytes=total,
        memory_available_bytes=available,
        system_rocm=system.version,
        system_rocm_layout=system.layout,
        system_rocm_file=system.file,
        system_rocm_installs=system.installs,
        hipcc=hipcc,
        ninja=shutil.which("ninja") is not None,
        rocm_home=rocm_home is not None,
    )


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
        dxg_exists=Path("/dev/dxg").exists(),
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


def read_deepspeed_prebuilt_ops() -> list[str] | None:
    """The ops DeepSpeed's installer built (``DS_BUILD_OPS=1`` / ``DS_BUILD_CPU_ADAM=1`` ...): its setup.py
    writes them as ``installed_ops = {...}`` to deepspeed/git_version_info_installed.py, which
    git_version_info.py imports. Read with ``ast``, never imported (importing deepspeed starts its
    accelerator); None where DeepSpeed or the file is absent (a JIT-only install has no such file)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("deepspeed")
    for root in list(spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root) / "git_version_info_installed.py"
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "installed_ops" for t in node.targets):
                try:
                    ops = ast.literal_eval(node.value)
                except ValueError:
                    return None
                return sorted(name for name, built in ops.items() if built) if isinstance(ops, dict) else None
    return None


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
    build, found = _probe_torch()
    return Snapshot(
        source="probe",
        torch=build,
        devices=attach_drm_memory(found, probe_drm()),
        kfd_nodes=probe_kfd(),
        env=relevant_env(),
        packages=probe_packages(),
        deepspeed_prebuilt_ops=read_deepspeed_prebuilt_ops(),
        iommu_pt=read_iommu_pt(),
        access=probe_access(),
        python=platform.python_version(),
        host=probe_host(),
    )


def installed_distributions() -> frozenset[str]:
    """Names of the installed distributions, normalised (lowercase, '-' for '_'): what a config's keys need.
    Reading every distribution's metadata costs ~0.8 s (114 distributions here), so the answer is kept while
    no folder on sys.path changes: installing or removing a distribution adds or removes its .dist-info
    folder, which changes its parent's modification time. The working directory ('' on sys.path) is left out of
    the key: pip installs into site-packages, never there."""
    return _distribution_names(tuple(_folder_stamps(sys.path)))


@lru_cache(maxsize=1)
def _distribution_names(_stamps: tuple[tuple[str, int], ...]) -> frozenset[str]:
    """``installed_distributions``' answer, read again whenever the folders' stamps change."""
    return frozenset((dist.metadata["Name"] or "").lower().replace("_", "-") for dist in metadata.distributions())


def _folder_stamps(paths: list[str]) -> list[tuple[str, int]]:
    stamps = []
    for path in filter(None, paths):
        try:
            stamps.append((path, os.stat(path).st_mtime_ns))
        except OSError:
            stamps.append((path, -1))
    return stamps
