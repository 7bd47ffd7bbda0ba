"""The preset pack as a Python API, for people with their own LLaMA-Factory setups.

from llamafactory_rocm import presets
cfg = presets.load("mi300x_llama3_lora", overrides={"model_name_or_path": "/models/llama3"})
findings = presets.check(cfg, gpu="mi300x")
from llamafactory.train.tuner import run_exp; run_exp(args=cfg)
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import UsageError
from .findings import Finding
from .fsutil import atomic_write_text
from .lf.memory import Estimate, estimate_config
from .machine.catalogue import load_catalogue
from .preset_registry import PATH_KEYS, PresetEntry, load_registry
from .resources import datasets_dir, presets_dir


@dataclass(frozen=True)
class PresetInfo:
    entry: PresetEntry
    arch: str
    vram_gib: float
    estimate: Estimate | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.entry.name,
            "gpu": self.entry.gpu,
            "arch": self.arch,
            "gpus": self.entry.gpus,
            "model": self.entry.model,
            "method": self.entry.method,
            "description": self.entry.description,
            "vram_gib": self.vram_gib,
            "estimated_peak_gib": None if self.estimate is None else round(self.estimate.total_gib, 1),
            "path": str(path(self.entry.name)),
        }


def entries() -> tuple[PresetEntry, ...]:
    """Every preset of the presets folder, read from the files' own header lines (preset_registry.py)."""
    return load_registry(presets_dir())


def names() -> list[str]:
    return [p.name for p in entries()]


def entry(name: str) -> PresetEntry:
    stem = Path(name).stem if name.endswith((".yaml", ".yml")) else name
    for preset in entries():
        if preset.name == stem:
            return preset
    near = difflib.get_close_matches(stem, names(), n=3, cutoff=0.3) or names()[:3]
    raise UsageError(f"no preset named {name!r}; nearest: {', '.join(near)}. See `llamafactory-rocm presets list`.")


def path(name: str) -> Path:
    return presets_dir() / entry(name).file_name


def after_paths(name: str) -> dict[str, Path]:
    """The export and chat configs that follow the training preset ``name`` (``presets/after/``), where it
    ships them ({} where it does not: they are optional)."""
    return {command: presets_dir() / rel for command, rel in entry(name).after}


def after_copy_names(name: str, dest: str | Path) -> dict[str, Path]:
    """Where ``copy(..., with_after=True)`` writes them: beside the copy, named after it."""
    target = copy_target(name, dest)
    return {command: target.parent / f"{target.stem}_{command}.yaml" for command, _ in entry(name).after}


def raw(name: str) -> dict[str, Any]:
    """The preset exactly as written in its YAML file."""
    return yaml.safe_load(path(name).read_text(encoding="utf-8"))


def load(name: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A plain dict ready for ``run_exp(args=...)``: types kept, paths made absolute."""
    cfg = {**raw(name), **(overrides or {})}
    if cfg.get("dataset_dir") == "datasets":  # the bundled definitions, from any working directory
        cfg["dataset_dir"] = str(datasets_dir())
    for key in PATH_KEYS:
        if key in cfg and cfg[key] and not Path(str(cfg[key])).is_absolute():
            cfg[key] = str(presets_dir() / str(cfg[key]))
    return cfg


def check(config: Mapping[str, Any], gpu: str | None = None, arch: str | None = None) -> list[Finding]:
    """The findings of the pre-launch rules for ``config`` on this machine (or a planned GPU)."""
    from .check.run import check_config

    return check_config(config, gpu=gpu, arch=arch).findings


def info(name: str) -> PresetInfo:
    preset = entry(name)
    found = load_catalogue().gpu(preset.gpu)
    assert found is not None, f"registry names unknown GPU {preset.gpu}"
    product, arch_info = found
    return PresetInfo(preset, arch_info.target, product.vram_gib, estimate_config(load(name), world_size=preset.gpus))


def list_presets(gpu: str | None = None) -> list[PresetInfo]:
    """Every preset, or those for ``gpu``'s arch (an unknown name raises, naming the nearest)."""
    from .check.target import resolve_target

    target = resolve_target(gpu=gpu) if gpu else None
    catalogue = load_catalogue()
    wanted = [
        p
        for p in entries()
        if target is None or catalogue.gpu(p.gpu)[1].target == target.arch  # type: ignore[index]
    ]
    return [info(p.name) for p in wanted]


def copy_target(name: str, dest: str | Path) -> Path:
    """``dest`` itself, or ``dest/<preset>.yaml`` when it is a folder (or written as one, ``out/``)."""
    as_folder = str(dest).endswith(("/", "\\")) or Path(dest).is_dir()
    return Path(dest) / entry(name).file_name if as_folder else Path(dest)


def copy(name: str, dest: str | Path, force: bool = False, with_after: bool = False) -> list[Path]:
    """Copy a preset (and the files it refers to) to ``dest``; never overwrite without ``force``.
    ``with_after``: its export and chat configs too, beside the copy (``after_copy_names``)."""
    preset = entry(name)
    target = copy_target(name, dest)
    if not target.parent.is_dir():
        raise UsageError(f"folder {target.parent} does not exist; create it first (mkdir -p {target.parent}).")
    plan = [(path(name), target)] + [(presets_dir() / c, target.parent / c) for c in preset.companions]
    if with_after:
        if not preset.after:
            raise UsageError(f"preset {preset.name} ships no export or chat config; drop --with-after.")
        sources, names_ = after_paths(name), after_copy_names(name, dest)
        plan += [(sources[command], names_[command]) for command in sources]
    clobbered = [str(dst) for _, dst in plan if os.path.lexists(dst)]  # a link too, even a dangling one
    if clobbered and not force:
        raise UsageError(f"{', '.join(clobbered)} already exists; pass --force to overwrite it.")
    written = []
    for src, dst in plan:
        dst.parent.mkdir(parents=True, exist_ok=True)
        written.append(atomic_write_text(dst, src.read_text(encoding="utf-8")))
    return written
