"""Where `check --measure`'s forecast and a real run part: the per-step record of real runs.

For each config of bench/bench_forecast_wall.py: stock LLaMA-Factory (``run_exp``, hook off) with a
``TrainerCallback`` that only takes timestamps (wall and process CPU seconds) at every trainer event and the
trainer's ``num_input_tokens_seen`` (``include_num_input_tokens_seen: true``, also set by the measuring run).
From that one run's record: what `--measure N`'s arithmetic (the median of the N-1 steps after the first, x the
run's steps, + the first step's extra) gives from the run's own first N steps, against the same run's time to
its last step, in wall seconds and in CPU seconds (which other processes on a shared machine move less than
the wall); the same with each step's time scaled by the run's mean tokens a step over the timed steps' (what
the overhead + FLOPs / rate model does where the overhead is small); the saves' wall seconds; the CPU share.
No run-to-run noise enters: the forecast and the oracle are the same run.

    OMP_NUM_THREADS=1 python bench/bench_forecast_steps.py [--measure 5] [--only base,long]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _util import machine, tiny_model
from bench_forecast_wall import CONFIGS, CROSS, config

CHILD = r"""
import json, sys, time
from pathlib import Path
from transformers import TrainerCallback

class Clock(TrainerCallback):
    def __init__(self):
        self.events = []

def stamp(name):
    def record(self, args, state, control, **kwargs):
        self.events.append((name[3:], time.perf_counter(), time.process_time(), state.num_input_tokens_seen))
    return record

for name in dir(TrainerCallback):  # every on_* event: a timestamp
    if name.startswith("on_"):
        setattr(Clock, name, stamp(name))

from llamafactory.train.tuner import run_exp
clock = Clock()
cfg = json.loads(Path(sys.argv[1]).read_text())
run_exp(args=cfg, callbacks=[clock])
runtime = json.loads((Path(cfg["output_dir"]) / "train_results.json").read_text())["train_runtime"]
Path(sys.argv[2]).write_text(json.dumps({"events": clock.events, "train_runtime": runtime}))
"""


def record(work: Path, name: str, model: Path, overrides: dict, env: dict) -> dict:
    out = work / f"out-{name}"
    shutil.rmtree(out, ignore_errors=True)
    cfg, result = work / f"{name}.json", work / f"{name}-events.json"
    cfg.write_text(json.dumps({**config(model, out, overrides), "include_num_input_tokens_seen": True}))
    done = subprocess.run([sys.executable, "-c", CHILD, str(cfg), str(result)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"stock run {name} failed: {done.stderr[-3000:]}")
    return json.loads(result.read_text())


def extrapolated(ends: list[tuple[float, float, int]], begin: tuple[float, float], n: int, clock: int) -> dict:
    """--measure's arithmetic on the run's own first ``n`` steps (clock 0: wall, 1: CPU), plain and with
    each timed step scaled to the run's mean tokens a step; over the run's time to its last step."""
    times = [b[clock] - a[clock] for a, b in itertools.pairwise(ends[:n])]
    tokens = [b[2] - a[2] for a, b in itertools.pairwise(ends[:n])]
    per_step = statistics.median(times)
    warmup = max(ends[0][clock] - begin[clock] - per_step, 0.0)
    whole = ends[-1][clock] - begin[clock]
    mean_tokens = ends[-1][2] / len(ends)
    scaled = statistics.median(t * mean_tokens / k for t, k in zip(times, tokens, strict=True))
    return {"plain": (len(ends) * per_step + warmup) / whole, "tokens": (len(ends) * scaled + warmup) / whole}


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--only", help="comma-separated config names (default: all)")
    cli.add_argument("--measure", type=int, default=5, help="the N of --measure N (default 5)")
    args = cli.parse_args()
    every = {**CONFIGS, **CROSS}
    chosen = args.only.split(",") if args.only else list(every)
    work = Path(tempfile.mkdtemp(prefix="lfr-bench-steps-"))
    env = {**os.environ, "HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "LLAMAFACTORY_ROCM": "0"}  # fmt: skip
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        model = tiny_model(work / "tiny")
        print(f"machine: {machine()}, OMP_NUM_THREADS={env['OMP_NUM_THREADS']}, --measure {args.measure}")
        print("config | steps | CPU share | wall: plain, tokens-scaled | CPU: plain, tokens-scaled | saves s / run s")
        for name in chosen:
            run = record(work, name, model, every[name], env)
            events = run["events"]
            begin = next((w, c) for n, w, c, _ in events if n == "train_begin")
            ends = [(w, c, k) for n, w, c, k in events if n == "step_end"]
            wall, cpu = extrapolated(ends, begin, args.measure, 0), extrapolated(ends, begin, args.measure, 1)
            saves = sum(b[1] - a[1] for a, b in itertools.pairwise(events) if b[0] == "save")
            share = (ends[-1][1] - begin[1]) / (ends[-1][0] - begin[0])
            print(
                f"{name} | {len(ends)} | {share:.2f} | {wall['plain']:.3f}, {wall['tokens']:.3f} | "
                f"{cpu['plain']:.3f}, {cpu['tokens']:.3f} | {saves:.2f} / {run['train_runtime']:.2f}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
