"""``validate_dataset`` (datasets' JSON builder streamed into a sink + LLaMA-Factory's converter on
every row) against ``datasets.load_dataset("json", ...)`` (what LLaMA-Factory runs to read a local
file) on the same generated 1,000,000-row alpaca JSON-lines file, side by side, interleaved.

Each measurement runs in its own subprocess, which reports the seconds of the call alone (imports
excluded) and its own peak RSS (VmHWM). The load gets a fresh cache_dir every run, so it really
parses. Validate also runs on a file of a quarter the rows: its peak RSS should not grow with the
file. Targets: validate not slower than the load; peak RSS flat and under 300 MB.

    python bench/bench_validate.py [--runs 3] [--rows 1000000]

The files are written to bench/out/ (git-ignored) and reused by later runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from _util import machine, median

OUT = Path(__file__).resolve().parent / "out"

_PEAK = """
def peak_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
"""
VALIDATE = (
    _PEAK
    + """
import json, sys, time
from llamafactory_rocm.dataset import validate_dataset
from llamafactory_rocm.dataset.validate import CheckOptions
import llamafactory.data.converter, llamafactory.hparams, datasets  # imports stay out of the timing
start = time.perf_counter()
report = validate_dataset(sys.argv[1], options=CheckOptions(progress=False))
print(json.dumps({"seconds": time.perf_counter() - start, "rows": report.rows, "peak_mb": peak_mb()}))
"""
)
LOAD = (
    _PEAK
    + """
import json, sys, time
import datasets
start = time.perf_counter()
data = datasets.load_dataset("json", data_files=[sys.argv[1]], cache_dir=sys.argv[2], split="train")
print(json.dumps({"seconds": time.perf_counter() - start, "rows": len(data), "peak_mb": peak_mb()}))
"""
)


def make_file(rows: int) -> Path:
    path = OUT / f"alpaca_{rows}.jsonl"
    if path.is_file():
        return path
    OUT.mkdir(exist_ok=True)
    rng = random.Random(0)
    words = [
        "the",
        "rocm",
        "gpu",
        "trains",
        "a",
        "lora",
        "adapter",
        "on",
        "amd",
        "hardware",
        "with",
        "bf16",
        "and",
        "flash",
        "attention",
    ]
    with path.open("w", encoding="utf-8") as handle:
        for i in range(rows):
            text = lambda n: " ".join(rng.choice(words) for _ in range(n))  # noqa: E731
            row = {"instruction": text(12), "input": "" if i % 3 else text(6), "output": text(30)}
            handle.write(json.dumps(row) + "\n")
    return path


def child(code: str, *args: str) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(result.stderr[-2000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    big, small = make_file(args.rows), make_file(args.rows // 4)
    runs: dict[str, list[dict]] = {"validate": [], "load": [], "validate_small": []}
    for _ in range(args.runs):  # interleaved: both see the same machine load
        runs["validate"].append(child(VALIDATE, str(big)))
        with tempfile.TemporaryDirectory(dir=OUT) as cache:
            runs["load"].append(child(LOAD, str(big), cache))
        runs["validate_small"].append(child(VALIDATE, str(small)))
    print(f"machine: {machine()}; file: {big.name} ({big.stat().st_size / 1e6:.0f} MB), {args.runs} runs, medians")
    for name, values in runs.items():
        seconds = median([v["seconds"] for v in values])
        peak = median([v["peak_mb"] for v in values])
        print(f"{name:15s} {seconds:7.2f} s   peak RSS {peak:6.0f} MB   rows {values[0]['rows']}")
    ratio = median([v["seconds"] for v in runs["load"]]) / median([v["seconds"] for v in runs["validate"]])
    print(f"validate is {ratio:.2f}x the load's speed (>= 1 means not slower)")


if __name__ == "__main__":
    main()
