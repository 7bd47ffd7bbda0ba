"""The GPU a config is meant for, and the machine a plan is checked against when that GPU is not here."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..machine.catalogue import Catalogue, base_arch, load_catalogue
from ..machine.snapshot import Device, KfdNode, Snapshot, TorchBuild
from ..rules import Target

# A preset's first line, kept by `presets copy`: `# llamafactory-rocm: target gpu=mi300x arch=gfx942 gpus=1`.
TARGET_HEADER = "# llamafactory-rocm: target"


def header_target(config_path: str | Path) -> dict[str, str]:
    """The ``key=value`` pairs of a config file's target header, or {} (also for unreadable files)."""
    try:
        with open(config_path, encoding="utf-8") as handle:
            head = [handle.readline() for _ in range(5)]
    except (OSError, UnicodeDecodeError):
        return {}
    for line in head:
        if line.startswith(TARGET_HEADER):
            pairs = (item.partition("=") for item in line[len(TARGET_HEADER) :].split())
            return {key: value for key, eq, value in pairs if eq}
    return {}


def resolve_target(
    gpu: str | None = None,
    arch: str | None = None,
    config_path: str | Path | None = None,
    catalogue: Catalogue | None = None,
) -> Target | None:
    """The GPU the user means: ``--gpu``/``--arch``, else the config's target header, else a
    preset-style file name (a guess: a copied preset keeps its header, not always its name)."""
    catalogue = catalogue or load_catalogue()
    if gpu and arch:
        raise UsageError("give --gpu or --arch, not both.")
    if gpu:
        return _gpu_target(gpu, "--gpu", catalogue)
    if arch:
        if catalogue.arch(arch) is None:
            near = catalogue.nearest_target(arch)
            hint = f" Did you mean {near}?" if near else ""
            raise UsageError(f"unknown arch {arch!r}.{hint} Known: {', '.join(sorted(catalogue.archs))}.")
        return Target(arch=base_arch(arch), alias=None, named_by="--arch")
    if config_path is None:
        return None
    header = header_target(config_path)
    name = Path(config_path).name
    if header.get("gpu"):
        return _gpu_target(header["gpu"], f"the target line of {name}", catalogue)
    if header.get("arch") and catalogue.arch(header["arch"]) is not None:
        return Target(arch=base_arch(header["arch"]), alias=None, named_by=f"the target line of {name}")
    stem = Path(config_path).stem
    found = catalogue.gpu(stem.split("_")[0]) if "_" in stem else None
    if found is not None:
        product, info = found
        return Target(arch=info.target, alias=product.alias, named_by=f"file name {name}")
    return None


def _gpu_target(gpu: str, named_by: str, catalogue: Catalogue) -> Target:
    found = catalogue.gpu(gpu)
    if found is None:
        near = ", ".join(catalogue.nearest_aliases(gpu)) or ", ".join(catalogue.aliases()[:6])
        raise UsageError(
            f"unknown GPU {gpu!r} ({named_by}); nearest known: {near}. See `llamafactory-rocm presets list`."
        )
    product, info = found
    return Target(arch=info.target, alias=product.alias, named_by=named_by)


def machine_for(request: Any, catalogue: Catalogue) -> tuple[Target | None, Snapshot, Snapshot, dict[str, str]]:
    """The request's target, the machine the check is made for (``request.snapshot``, else this machine probed;
    a plan of the target where that has no GPU and the request plans), its training view (an iGPU beside a
    discrete card set aside: rules/visibility.py) and the environment the rules see."""
    target = resolve_target(request.gpu, request.arch, request.config_path, catalogue)
    snapshot = request.snapshot
    if snapshot is None:
        from ..machine.probe import take_snapshot

        snapshot = take_snapshot()
    env = dict(snapshot.env if request.env is None else request.env)
    if target is not None and not snapshot.devices and not snapshot.kfd_targets and request.plan:
        snapshot = planned_snapshot(target, env, catalogue)
    return target, snapshot, snapshot.training_view(), env


def planned_snapshot(target: Target, env: Mapping[str, str], catalogue: Catalogue | None = None) -> Snapshot:
    """A snapshot of the machine the user plans to rent: one device of the target, official wheel."""
    catalogue = catalogue or load_catalogue()
    info = catalogue.archs[target.arch]
    product = next((p for p in info.products if p.alias == target.alias), info.products[0] if info.products else None)
    memory = int((product.vram_gib if product else 0) * 2**30)
    return Snapshot(
        source=f"planned: {target.alias or target.arch} from the catalogue",
        torch=TorchBuild(version="planned+rocm", hip="planned", arch_list=list(catalogue.official_torch_wheel_archs)),
        devices=[Device(index=0, name=product.name if product else target.arch, arch_name=target.arch,
                        total_memory_bytes=memory, is_integrated=bool(product and product.integrated))],
        kfd_nodes=[KfdNode(node=1, gfx_target_version=info.gfx_target_version or 0)],
        env=dict(env),
    )  # fmt: skip


def target_install(requirement: str, snapshot: Snapshot, catalogue: Catalogue | None = None) -> str:
    """The install line for ``requirement`` on the planned machine. bitsandbytes on a ROCm target: its PyPI
    wheel, which carries ROCm kernels for the arch from the catalogue's version on (bitsandbytes'
    installation guide, "AMD ROCm", "Installation from PyPI": ``pip install bitsandbytes``;
    docs/rocm-facts.md#f9), or a source build for an arch no wheel covers. Anything else: as LLaMA-Factory
    asks for it."""
    from ..rules.packages import requirement_name

    if requirement_name(requirement).lower() != "bitsandbytes" or not snapshot.is_rocm:
        return f"pip install '{requirement}'"
    catalogue = catalogue or load_catalogue()
    lines = []
    for arch in sorted({base_arch(d.arch_name) for d in snapshot.devices if d.arch_name}):
        info = catalogue.arch(arch)
        needed = info.bitsandbytes_min_version if info else None
        if needed is None:
            lines.append(f"{arch} has no bitsandbytes ROCm wheel: build it with -DBNB_ROCM_ARCH={arch}")
        else:
            lines.append(f"pip install 'bitsandbytes>={needed}' (its ROCm wheel for {arch})")
    return "; ".join(lines) or f"pip install '{requirement}'"
