"""Shared by the benchmarks: timing subprocesses and summarising medians."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Sequence


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def timed(cmd: Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None) -> float:
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"benchmark command failed ({result.returncode}): {' '.join(cmd)}\n{result.stderr[-2000:]}")
    return elapsed


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def tiny_model(folder: os.PathLike[str] | str, **shape: int):
    """The tests' tiny Llama (tests/conftest.py tiny_model), built into ``folder``: the model every bench trains.
    ``shape``: build_tiny_model's hidden_size, num_layers, intermediate_size, num_heads, where a bench wants
    it wider."""
    from llamafactory_rocm.demo.tiny import build_tiny_model, texts_from_dataset
    from llamafactory_rocm.resources import datasets_dir

    return build_tiny_model(folder, texts_from_dataset(datasets_dir() / "amd_finetune_qa.json"), **shape)
