"""The built-in presets, read from the YAML files in ``presets/``: a preset is its file and nothing else.

Each file says what ``presets list`` shows in its first two lines (docs/architecture.md#add-a-preset-one-file):

    # llamafactory-rocm: target gpu=mi300x arch=gfx942 gpus=1
    # llamafactory-rocm: listed order=1 model=llama3-8b -- Llama-3-8B LoRA, bf16, batch 16 x 4096

The target line is the one ``check`` reads (check/target.py ``header_target``), so the GPU a preset is listed
for is the GPU it is checked for. The name is the file's; the method and the files it refers to follow from
its keys. The export and chat configs that follow training (``NAME_export.yaml``, ``NAME_chat.yaml`` in
``presets/after/``) are optional: a preset without them is listed and checked, and says it has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from .check.target import TARGET_HEADER, header_target
from .errors import UsageError

LISTED_HEADER = "# llamafactory-rocm: listed"
AFTER_COMMANDS = ("export", "chat")  # the order training is followed in: merge the adapter, then chat
# Keys holding paths that LLaMA-Factory resolves against the working directory: a relative one is a file the
# preset ships beside it (``presets copy`` brings it along).
PATH_KEYS = ("deepspeed",)


@dataclass(frozen=True)
class PresetEntry:
    name: str
    gpu: str  # catalogue alias
    model: str
    method: str
    gpus: int = 1
    description: str = ""
    companions: tuple[str, ...] = ()  # files the YAML refers to, relative to presets/
    after: tuple[tuple[str, str], ...] = ()  # (command, file relative to presets/) for those shipped
    order: int | None = None  # its place in `presets list`; None: after the numbered ones, by name

    @property
    def file_name(self) -> str:
        return f"{self.name}.yaml"


def listed_line(path: Path) -> tuple[dict[str, str], str] | None:
    """The ``key=value`` pairs and the description of a file's ``listed`` line, or None."""
    with open(path, encoding="utf-8") as handle:
        head = [handle.readline() for _ in range(5)]
    for line in head:
        if line.startswith(LISTED_HEADER):
            pairs, _, description = line[len(LISTED_HEADER) :].partition(" -- ")
            found = (item.partition("=") for item in pairs.split())
            return {key: value for key, eq, value in found if eq}, description.strip()
    return None


def method_of(config: dict[str, Any]) -> str:
    """lora, qlora (LoRA on quantized weights), freeze or full: what the keys train."""
    method = str(config.get("finetuning_type", "lora"))
    return "qlora" if method == "lora" and config.get("quantization_bit") else method


def read_entry(path: Path) -> PresetEntry:
    """One preset from its file; a header that does not say what the listing needs is one clear line."""
    target, listed = header_target(path), listed_line(path)
    form = f"{TARGET_HEADER} gpu=ALIAS arch=GFX gpus=N` and `{LISTED_HEADER} model=NAME -- DESCRIPTION"
    if not target.get("gpu") or listed is None or not listed[0].get("model"):
        raise UsageError(f"preset {path} lacks its header; its first two lines must be `{form}`.")
    pairs, description = listed
    config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    folder = path.parent
    companions = tuple(
        str(config[key]) for key in PATH_KEYS if config.get(key) and not Path(str(config[key])).is_absolute()
    )
    after = tuple(
        (command, f"after/{path.stem}_{command}.yaml")
        for command in AFTER_COMMANDS
        if (folder / "after" / f"{path.stem}_{command}.yaml").is_file()
    )
    return PresetEntry(
        name=path.stem,
        gpu=target["gpu"],
        model=pairs["model"],
        method=method_of(config),
        gpus=int(target.get("gpus", "1")),
        description=description,
        companions=companions,
        after=after,
        order=int(pairs["order"]) if "order" in pairs else None,
    )


def load_registry(folder: Path) -> tuple[PresetEntry, ...]:
    """Every ``*.yaml`` of ``folder``, in their ``order``, then by name. Read again when a file there changes."""
    files = sorted(folder.glob("*.yaml"))
    stamp = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    after = folder / "after"
    stamp += tuple(sorted(p.name for p in after.glob("*.yaml"))) if after.is_dir() else ()
    return _load(folder, stamp)


@lru_cache(maxsize=4)
def _load(folder: Path, stamp: tuple) -> tuple[PresetEntry, ...]:
    entries = [read_entry(p) for p in sorted(folder.glob("*.yaml"))]
    return tuple(sorted(entries, key=lambda e: (e.order is None, e.order or 0, e.name)))
