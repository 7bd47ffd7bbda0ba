"""How fast could validation be at all? The fast path's stages, each alone, on one core, against
``datasets.load_dataset("json")`` on the same file (both cores: pyarrow reads with threads).

Stages, each timed over the whole file in one process (median of ``--runs``):

1. read: the file in the fast path's 512 KB chunks, nothing else;
2. + bytes: the line-structure and UTF-8 checks (numpy) on each chunk;
3. + syntax: msgspec parses each chunk into structs with no fields (every value skipped): JSON
   syntax checked, nothing kept, so no row rule at all;
4. the fast path itself (``prove_clean``): typed structs and the row rules.

The floor of a msgspec validator is stage 3, split over the cores; the issue's target is a fifth of
the load. Stage 3 above that target means no msgspec validator reaches it on this machine.

    python bench/bench_floor.py [--runs 5] [--rows 1000000]

Uses (and writes, once) the file of bench_validate.py in bench/out/.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _util import machine, median
from bench_validate import LOAD, OUT, child, generate

TARGET_RATIO = 5.0


def _stages(path: Path) -> dict[str, Callable[[], object]]:
    import msgspec

    from llamafactory_rocm.dataset_entry import resolve_mapping
    from llamafactory_rocm.dataset_fast import _chunks, _is_utf8, _one_row_per_line, prove_clean

    size = path.stat().st_size
    skip_all = msgspec.json.Decoder(msgspec.defstruct("Skipped", []))
    mapping = resolve_mapping({"file_name": path.name, "formatting": "alpaca"})

    def read() -> None:
        for _ in _chunks(path, 0, size):
            pass

    def read_bytes() -> None:
        for chunk in _chunks(path, 0, size):
            _checked(_one_row_per_line(chunk) is not None and _is_utf8(chunk))

    def read_bytes_syntax() -> None:
        for chunk in _chunks(path, 0, size):
            _checked(_one_row_per_line(chunk) is not None and _is_utf8(chunk))
            skip_all.decode_lines(chunk)

    def fast_path() -> None:
        _checked(prove_clean(path, 0, size, mapping) is not None)

    return {"read": read, "+ bytes": read_bytes, "+ syntax (floor)": read_bytes_syntax, "fast path": fast_path}


def _checked(clean: bool) -> None:
    """Not an assert: the work must run under python -O too."""
    if not clean:
        raise SystemExit("the benchmark file is not clean: regenerate it (delete bench/out/)")


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--runs", type=int, default=5)
    cli.add_argument("--rows", type=int, default=1_000_000)
    args = cli.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    path = generate(OUT / f"alpaca_{args.rows}.jsonl", args.rows, "alpaca")
    cores = os.cpu_count() or 1
    stages = _stages(path)
    hf_home = Path(tempfile.mkdtemp(prefix="bench-hf-"))
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    loads: list[float] = []
    seconds: dict[str, list[float]] = {name: [] for name in stages}
    try:
        for _ in range(args.runs):  # interleaved: this machine's speed drifts by tens of percent
            cache = tempfile.mkdtemp(prefix="bench-cache-", dir=hf_home)
            loads.append(child(LOAD, str(path), cache, env=env)["seconds"])
            shutil.rmtree(cache, ignore_errors=True)
            for name, run in stages.items():
                start = time.perf_counter()
                run()
                seconds[name].append(time.perf_counter() - start)
    finally:
        shutil.rmtree(hf_home, ignore_errors=True)
    load = median(loads)
    target = load / TARGET_RATIO
    print(f"machine: {machine()}")
    print(f"file: {path.name}, {path.stat().st_size / 1e6:.0f} MB; medians of {args.runs} runs, interleaved")
    print(f"  datasets.load_dataset json: {load:.3f} s; the {TARGET_RATIO:g}x target: {target:.3f} s")
    for name, times in seconds.items():
        one_core = median(times)
        split = one_core / cores  # a perfect split over every core, with no cost to split or join
        print(
            f"  {name:17} one core {one_core:.3f} s, / {cores} cores {split:.3f} s: "
            f"{load / split:.2f}x the load ({'under' if split <= target else 'over'} the target)"
        )


if __name__ == "__main__":
    main()
