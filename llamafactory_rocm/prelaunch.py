"""The pre-launch check as a Python API: config + machine (or a planned GPU) -> resolved config.

``check_config`` is what ``llamafactory-rocm check``, ``train`` and the hook inside stock
``llamafactory-cli train`` all call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .catalogue import Catalogue, base_arch, load_catalogue
from .dataset import config_dataset_findings
from .errors import UsageError
from .findings import Finding, Level
from .lf_keys import train_keys
from .memory import model_config_for
from .rules import Context, Resolution, Target, resolve
from .snapshot import Device, KfdNode, Snapshot, TorchBuild

# Names LLaMA-Factory treats as final weights in output_dir (hparams/parser.py CHECKPOINT_NAMES).
_WEIGHT_FILES = (
    "adapter_model.safetensors",
    "adapter_model.bin",
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


@dataclass(frozen=True)
class Report:
    input_config: dict[str, Any]
    resolution: Resolution
    snapshot: Snapshot
    target: Target | None
    config_path: str | None = None
    env_before: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.resolution.ok

    @property
    def config(self) -> dict[str, Any]:
        return self.resolution.config

    @property
    def findings(self) -> list[Finding]:
        return self.resolution.findings

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "findings": [
                {"code": f.code, "level": f.level.value, "message": f.message, "fix": f.fix} for f in self.findings
            ],
            "config": self.config,
            "env_changes": self.resolution.env_changes,
            "target": None if self.target is None else self.target.__dict__,
            "snapshot_source": self.snapshot.source,
        }


def resolve_target(
    gpu: str | None = None,
    arch: str | None = None,
    config_path: str | Path | None = None,
    catalogue: Catalogue | None = None,
) -> Target | None:
    """The GPU the user means: ``--gpu``/``--arch`` first, else a preset-style file name."""
    catalogue = catalogue or load_catalogue()
    if gpu and arch:
        raise UsageError("give --gpu or --arch, not both.")
    if gpu:
        found = catalogue.gpu(gpu)
        if found is None:
            near = ", ".join(catalogue.nearest_aliases(gpu)) or ", ".join(catalogue.aliases()[:6])
            raise UsageError(f"unknown GPU {gpu!r}; nearest known: {near}. See `llamafactory-rocm presets list`.")
        product, info = found
        return Target(arch=info.target, alias=product.alias, named_by="--gpu")
    if arch:
        if catalogue.arch(arch) is None:
            near = catalogue.nearest_target(arch)
            hint = f" Did you mean {near}?" if near else ""
            raise UsageError(f"unknown arch {arch!r}.{hint} Known: {', '.join(sorted(catalogue.archs))}.")
        return Target(arch=base_arch(arch), alias=None, named_by="--arch")
    if config_path is not None:
        stem = Path(config_path).stem
        found = catalogue.gpu(stem.split("_")[0]) if "_" in stem else None
        if found is not None:
            product, info = found
            return Target(arch=info.target, alias=product.alias, named_by=f"file name {Path(config_path).name}")
    return None


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
                        total_memory_bytes=memory)],
        kfd_nodes=[KfdNode(node=1, gfx_target_version=info.gfx_target_version or 0)],
        env=dict(env),
    )  # fmt: skip


def existing_outputs(output_dir: str | Path) -> tuple[str, ...]:
    """checkpoint-* folders and final weight files already in output_dir (what a run could clobber)."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return ()
    names = sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name.startswith("checkpoint-"))
    names += [n for n in _WEIGHT_FILES if (folder / n).is_file()]
    return tuple(names)


def resolve_deepspeed_path(
    config: Mapping[str, Any], config_path: str | Path | None, cwd: Path
) -> tuple[dict[str, Any], list[Finding]]:
    """A relative ``deepspeed:`` file that is not under the working directory but beside the config
    (presets ship theirs in presets/deepspeed/) is made absolute, so the run works from anywhere."""
    ds = config.get("deepspeed")
    if not ds or config_path is None or Path(str(ds)).is_absolute() or (cwd / str(ds)).is_file():
        return dict(config), []
    beside = (Path(config_path).resolve().parent / str(ds)).resolve()
    if not beside.is_file():
        return dict(config), []
    return {**config, "deepspeed": str(beside)}, [
        Finding(
            code="DEEPSPEED_PATH_RESOLVED",
            level=Level.CHANGE,
            key="deepspeed",
            old=ds,
            new=str(beside),
            message=f"deepspeed: {ds} is not under the working directory {cwd}, but is beside the config.",
            fix=f"Using {beside}.",
        )
    ]


def check_config(
    config: Mapping[str, Any],
    *,
    snapshot: Snapshot | None = None,
    gpu: str | None = None,
    arch: str | None = None,
    config_path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    plan_without_gpu: bool = True,
    extra_findings: tuple[Finding, ...] = (),
) -> Report:
    """Run every rule. With no ``snapshot`` the machine is probed; on a machine without a GPU a
    named target is checked as planned (unless ``plan_without_gpu`` is False, as for training)."""
    catalogue = load_catalogue()
    target = resolve_target(gpu, arch, config_path, catalogue)
    if snapshot is None:
        from .probe import take_snapshot

        snapshot = take_snapshot()
    env = dict(snapshot.env if env is None else env)
    input_config = dict(config)
    config, path_findings = resolve_deepspeed_path(config, config_path, Path.cwd())
    # Datasets are checked here, before any model is loaded: a broken row fails now, not on the GPU.
    config, dataset_findings = config_dataset_findings(config, Path.cwd())
    path_findings += dataset_findings
    if target is not None and not snapshot.devices and not snapshot.kfd_targets and plan_without_gpu:
        snapshot = planned_snapshot(target, env, catalogue)
    ctx = Context(
        snapshot=snapshot,
        catalogue=catalogue,
        known_keys=train_keys(),
        target=target,
        existing_outputs=existing_outputs(config.get("output_dir", "trainer_output")),
        model_config=model_config_for(str(config.get("model_name_or_path", ""))),
        extra_findings=(*extra_findings, *path_findings),
    )
    resolution = resolve(config, env, ctx)
    return Report(
        input_config=input_config,
        resolution=resolution,
        snapshot=snapshot,
        target=target,
        config_path=None if config_path is None else str(config_path),
        env_before=env,
    )
