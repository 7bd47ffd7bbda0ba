"""A simulated node for the tests: torch reports a recorded snapshot's GPUs, the work stays on the CPU.

No AMD GPU exists where the tests run. This layer makes torch answer every device question that
LLaMA-Factory's launcher (``get_device_count``), transformers (``TrainingArguments.n_gpu``, its
``is_torch_*_available`` answers) and accelerate (``PartialState``) ask, from a recorded snapshot
(tests/snapshots/*.json: device count, names, memory, gcnArchName, HIP version, bf16). It is a
simulation, not a measurement: nothing here runs a kernel on a GPU, and a tensor really moved to
``cuda`` fails. It stands in for the hardware only, never for LLaMA-Factory, transformers or us.

In a test process: ``with simulated_node("mi300x_8gpu"):``. In a subprocess (a stock
``llamafactory-cli train`` and the torchrun ranks it starts): ``node_env("mi300x_8gpu")`` puts
tests/simnode/ (its ``sitecustomize``) on PYTHONPATH with the snapshot's path, and every Python
process of the run installs the same answers at start-up. In a torchrun rank the answers hold while
the pre-launch check runs (what a rank of that node sees); the rank's training then runs on the CPU
with gloo, the only world that can really train here.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
SIMNODE_DIR = Path(__file__).resolve().parent / "simnode"
NODE_ENV = "LLAMAFACTORY_ROCM_TEST_NODE"  # the snapshot's path, read by tests/simnode/sitecustomize.py


def snapshot_path(name: str | os.PathLike[str]) -> Path:
    path = Path(name)
    return path if path.suffix == ".json" else SNAPSHOTS / f"{name}.json"


def _visible(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES narrow what torch sees, as the runtime does."""
    for name in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        value = os.environ.get(name)
        if value is not None:
            wanted = [int(part) for part in value.split(",") if part.strip().isdigit()]
            return [devices[i] for i in wanted if i < len(devices)]
    return devices


def _answers(recorded: dict[str, Any]) -> list[tuple[Any, str, Any]]:
    import torch

    devices = _visible(recorded.get("devices", []))
    build = recorded.get("torch", {})
    hip = build.get("hip")

    def props(index: int = 0) -> SimpleNamespace:
        device = devices[int(getattr(index, "index", index) or 0)]
        arch = device["arch_name"]
        major, minor = (9, 4) if hip else (9, 0)
        return SimpleNamespace(
            name=device["name"],
            total_memory=device["total_memory_bytes"],
            gcnArchName=arch,
            major=major,
            minor=minor,
            multi_processor_count=304,
            is_integrated=int(bool(device.get("is_integrated"))),
        )

    def current_device() -> int:
        return int(os.environ.get("LOCAL_RANK", "0") or 0)

    def mem_get_info(index: Any = None) -> tuple[int, int]:
        total = props(index or 0).total_memory
        return total, total

    cuda = torch.cuda
    return [
        (cuda, "is_available", lambda: bool(devices)),
        (cuda, "device_count", lambda: len(devices)),
        (cuda, "get_device_properties", props),
        (cuda, "get_device_name", lambda index=None: props(index or 0).name),
        (cuda, "get_device_capability", lambda index=None: (props(index or 0).major, props(index or 0).minor)),
        (cuda, "get_arch_list", lambda: list(build.get("arch_list") or [])),
        (cuda, "is_bf16_supported", lambda including_emulation=True: bool(hip) or bool(build.get("cuda"))),
        (cuda, "mem_get_info", mem_get_info),
        (cuda, "current_device", current_device),
        (cuda, "set_device", lambda device: None),
        (cuda, "synchronize", lambda device=None: None),
        (cuda, "empty_cache", lambda: None),
        (torch.version, "hip", hip),
        (torch.version, "cuda", build.get("cuda")),
    ]


def _clear_cached_answers() -> None:
    """transformers caches its ``is_torch_*_available`` answers (``@lru_cache``): ask again."""
    import sys

    for name in ("transformers.utils.import_utils", "accelerate.utils.imports"):
        module = sys.modules.get(name)
        for value in vars(module).values() if module else ():
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()


@contextlib.contextmanager
def simulated_node(name: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """torch answers as the snapshot's node while the block runs; the real answers come back after."""
    recorded = json.loads(snapshot_path(name).read_text(encoding="utf-8"))
    answers = _answers(recorded)
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in answers]
    try:
        for owner, attr, value in answers:
            setattr(owner, attr, value)
        _clear_cached_answers()
        yield recorded
    finally:
        for owner, attr, value in saved:
            setattr(owner, attr, value)
        _clear_cached_answers()


_INSTALLED: list[contextlib.AbstractContextManager[Any]] = []  # held: a dropped one would restore torch


def install(name: str | os.PathLike[str]) -> None:
    """For a whole process (sitecustomize): the answers stay until the process ends."""
    node = simulated_node(name)
    node.__enter__()
    _INSTALLED.append(node)


def node_env(name: str | None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a subprocess that runs on the simulated node; with ``name`` None, on this host as it
    is, with tests/simnode's sitecustomize still loaded (the rank recorder, tests/rank_record.py)."""
    env = dict(os.environ if base is None else base)
    env.pop(NODE_ENV, None)
    if name is not None:
        env[NODE_ENV] = str(snapshot_path(name))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SIMNODE_DIR), env.get("PYTHONPATH", "")]))
    return env


@functools.cache
def device_count(name: str) -> int:
    return len(json.loads(snapshot_path(name).read_text(encoding="utf-8")).get("devices", []))
