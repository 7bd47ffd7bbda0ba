"""``validate_dataset`` against ``datasets.load_dataset("json", ...)`` (what LLaMA-Factory runs to
read a local file) on a generated 1,000,000-row alpaca (or sharegpt) JSON-lines file, side by side,
interleaved. A clean file like this one is what the fast path (``dataset_fast``) proves; ``--reference`` times
the line-by-line scan instead (``fast=False``), the cost for a file with a defect.

Each measurement runs in its own subprocess, which reports the seconds of the call alone (imports
excluded) and its own peak RSS (VmHWM), so the numbers of the two never mix. The load gets a fresh
cache_dir every run, so it really parses. Validate also runs on a 250,000-row file: its peak RSS
should not grow with the file. Targets: validate >= 5x faster than the load, peak RSS < 300 MB.

    python bench/bench_validate.py [--runs 3] [--rows 1000000] [--small-rows 250000] [--jobs N]
        [--reference] [--formatting alpaca|sharegpt]

The files are written to bench/out/ (git-ignored) and reused by later runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _util import machine, median

OUT = Path(__file__).resolve().parent / "out"

# Each child prints one JSON line: {"seconds": call time, "rows": n, "peak_mb": VmHWM}.
_PEAK = """
def peak_mb():
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
"""
VALIDATE = (
    _PEAK
    + """
import json, resource, sys, time
from llamafactory_rocm.dataset_check import validate_dataset
import llamafactory_rocm.dataset_fast  # its libraries load on first use: imports stay out of the timing, as for LOAD
start = time.perf_counter()
report = validate_dataset(sys.argv[1], jobs=int(sys.argv[2]), fast=sys.argv[3] == "fast", formatting=sys.argv[4])
seconds = time.perf_counter() - start
assert report.ok, report.summary()
workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest worker, if any
from llamafactory_rocm.dataset_parallel import default_jobs
jobs = int(sys.argv[2]) or default_jobs()
print(json.dumps({"seconds": seconds, "rows": report.rows, "peak_mb": peak_mb(), "worker_mb": workers, "jobs": jobs}))
"""
)
LOAD = (
    _PEAK
    + """
import json, sys, time
import datasets
datasets.disable_progress_bars()
datasets.logging.set_verbosity_error()
start = time.perf_counter()
dataset = datasets.load_dataset("json", data_files=sys.argv[1], split="train", cache_dir=sys.argv[2])
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "rows": len(dataset), "peak_mb": peak_mb()}))
"""
)

_WORDS = [
    *("the", "a", "rocm", "gpu", "kernel", "memory", "lora", "rank", "adapter", "batch", "gradient", "loss"),
    *("token", "model", "layer", "attention", "matrix", "wave", "compute", "offload", "precision", "bf16"),
    *("fp16", "checkpoint", "dataset", "template", "cutoff"),
]


def generate(path: Path, rows: int, formatting: str, seed: int = 0) -> Path:
    """Rows of realistic length, one per line (alpaca ~340 bytes; sharegpt ~490 bytes, one to three
    exchanges, a system message in one row of four); written once, then reused."""
    if path.is_file():
        return path
    rng = random.Random(seed)
    phrases = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 12))) for _ in range(4096)]
    make = _alpaca_row if formatting == "alpaca" else _sharegpt_row
    tmp = path.with_suffix(".part")
    with open(tmp, "w", encoding="utf-8") as out:
        for i in range(rows):
            out.write(json.dumps(make(i, rng, phrases)) + "\n")
        out.flush()
        os.fsync(out.fileno())  # else the write-back of a fresh file runs into the timed loads' own writes
    tmp.replace(path)
    return path


def _alpaca_row(i: int, rng: random.Random, phrases: list[str]) -> dict:
    p = rng.choices(phrases, k=6)
    answer = f"{p[2]}. {p[3]}, {p[4]} and {p[5]}."
    return {"instruction": f"Q{i}: {p[0]}?", "input": "" if i % 3 else p[1], "output": answer}


def _sharegpt_row(i: int, rng: random.Random, phrases: list[str]) -> dict:
    turns = [{"from": "system", "value": "Answer in one paragraph."}] if i % 4 == 0 else []
    for _ in range(rng.randint(1, 3)):
        p = rng.choices(phrases, k=3)
        turns += [{"from": "human", "value": f"{p[0]}?"}, {"from": "gpt", "value": f"{p[1]}, and {p[2]}."}]
    return {"conversations": turns}


def child(code: str, *args: str, env: dict[str, str]) -> dict:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"benchmark child failed ({result.returncode}):\n{result.stderr[-3000:]}")
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    measured["wall"] = wall
    return measured


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--runs", type=int, default=3)
    cli.add_argument("--rows", type=int, default=1_000_000)
    cli.add_argument("--small-rows", type=int, default=250_000)
    cli.add_argument("--jobs", type=int, default=0, help="validate's worker processes (0: its own choice)")
    cli.add_argument("--reference", action="store_true", help="time the line-by-line scan, not the fast path")
    cli.add_argument("--formatting", choices=("alpaca", "sharegpt"), default="alpaca")
    args = cli.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    big = generate(OUT / f"{args.formatting}_{args.rows}.jsonl", args.rows, args.formatting)
    small = generate(OUT / f"{args.formatting}_{args.small_rows}.jsonl", args.small_rows, args.formatting)
    hf_home = Path(tempfile.mkdtemp(prefix="bench-hf-"))
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    jobs = str(args.jobs)
    mode = ("reference" if args.reference else "fast", args.formatting)
    validate, load, small_runs = [], [], []
    try:
        child(VALIDATE, str(small), jobs, *mode, env=env)  # warm the page cache and the imports
        for _ in range(args.runs):
            validate.append(child(VALIDATE, str(big), jobs, *mode, env=env))
            cache = tempfile.mkdtemp(prefix="bench-cache-", dir=hf_home)
            load.append(child(LOAD, str(big), cache, env=env))
            shutil.rmtree(cache, ignore_errors=True)
            small_runs.append(child(VALIDATE, str(small), jobs, *mode, env=env))
    finally:
        shutil.rmtree(hf_home, ignore_errors=True)
    report(args, big, small, validate, load, small_runs, mode[0])


def report(
    args: argparse.Namespace, big: Path, small: Path, validate: list, load: list, small_runs: list, mode: str
) -> None:
    v, ld = median([r["seconds"] for r in validate]), median([r["seconds"] for r in load])
    vw, lw = median([r["wall"] for r in validate]), median([r["wall"] for r in load])
    jobs = validate[0]["jobs"]
    v_peak, l_peak = _peak(validate), max(r["peak_mb"] for r in load)
    s_peak = _peak(small_runs)
    mb = big.stat().st_size / 1e6
    print(f"machine: {machine()}")
    print(f"file: {big.name}, {args.rows:,} rows, {mb:.0f} MB; {args.runs} runs each, interleaved")
    print(f"  validate_dataset, jobs={jobs}, {mode}:    median {v:.2f} s (process wall {vw:.2f} s), peak RSS {v_peak}")
    print(f"  datasets.load_dataset json:  median {ld:.2f} s (process wall {lw:.2f} s), peak RSS {l_peak:.0f} MB")
    print(f"  ratio load/validate: {ld / v:.2f}x by call, {lw / vw:.2f}x by process wall (target >= 5x)")
    print(f"  validate on {small.name} ({args.small_rows:,} rows): median "
          f"{median([r['seconds'] for r in small_runs]):.2f} s, peak RSS {s_peak} (target < 300 MB, flat)")  # fmt: skip


def _peak(runs: list) -> str:
    """The main process's peak, and the largest worker's (forked: it shares the parent's pages)."""
    main_mb = max(r["peak_mb"] for r in runs)
    worker_mb = max(r["worker_mb"] for r in runs)
    if not worker_mb:
        return f"{main_mb:.0f} MB"
    jobs = runs[0]["jobs"]
    return f"{main_mb:.0f} MB + {jobs} workers of <= {worker_mb:.0f} MB (sum <= {main_mb + jobs * worker_mb:.0f} MB)"


if __name__ == "__main__":
    main()
