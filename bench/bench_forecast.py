"""What ``check --forecast`` adds to ``check``: the same config checked with and without it, interleaved, on
the tiny local Llama and a Llama-3-8B-shaped folder (its config.json, no weights: the meta model of 8B).

Two measures: whole ``check`` subprocesses (what a user waits; on a shared machine their spread is larger than
the forecast's cost), and in-process the forecast's own parts timed where they run inside one ``check``
(the FLOP count, the dry run's step hook: wall and CPU seconds; the rest of the forecast: steps, tokens, time).

    python bench/bench_forecast.py [--runs 3] [--in-process-only]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from _util import machine, median, timed, tiny_model
from bench_check import eight_b_folder

from llamafactory_rocm.resources import datasets_dir


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--runs", type=int, default=3)
    cli.add_argument("--in-process-only", action="store_true", help="skip the whole-check subprocesses")
    args = cli.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lfr-bench-forecast-"))
    try:
        tiny = tiny_model(work / "tiny")
        models = {"tiny": tiny, "8B-shaped": eight_b_folder(tiny, work / "llama3-8b-shape")}
        env = {**os.environ, "HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        variants = {"check": [], "check --forecast": ["--forecast"]}
        times: dict[tuple[str, str], list[float]] = {}
        configs = {label: config(model, work / f"out-{label}") for label, model in models.items()}
        print(f"machine: {machine()}")
        in_process(configs, args.runs, env)
        if args.in_process_only:
            return
        for run in range(args.runs + 1):  # run 0 warms caches and is not counted
            for label in models:
                cfg = work / f"{label}.yaml"
                cfg.write_text(yaml.safe_dump(configs[label]))
                for name, extra in variants.items():
                    cmd = [sys.executable, "-m", "llamafactory_rocm.cli.main", "check", str(cfg), "--gpu", "mi300x"]
                    elapsed = timed([*cmd, *extra], env=env, cwd=str(work))
                    if run:
                        times.setdefault((label, name), []).append(elapsed)
        print(f"whole check: {args.runs} runs each, interleaved after one warm-up round")
        for (label, name), values in times.items():
            shown = ", ".join(f"{v:.2f}" for v in values)
            print(f"  {label:10} {name:17} median {median(values):6.2f} s   runs {shown}")
        for label in models:
            base, with_forecast = median(times[(label, "check")]), median(times[(label, "check --forecast")])
            print(f"  {label:10} forecast adds {with_forecast - base:+.2f} s, ratio {with_forecast / base:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def config(model: Path, out: Path) -> dict:
    return {
        "model_name_or_path": str(model), "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "lora_target": "all", "template": "llama3", "dataset": "amd_finetune_qa", "dataset_dir": str(datasets_dir()),
        "cutoff_len": 1024, "output_dir": str(out), "bf16": True, "report_to": "none",
    }  # fmt: skip


def in_process(configs: dict[str, dict], runs: int, env: dict[str, str]) -> None:
    """The forecast's parts inside one ``check_config`` each (after one warm-up check): its FLOP count (the
    dry run's step hook) and the rest of the forecast (forecast_for), wall and CPU seconds, medians."""
    os.environ.update({k: env[k] for k in ("HF_HOME", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")})
    from llamafactory_rocm.check.run import check_config
    from llamafactory_rocm.forecast import flops
    from llamafactory_rocm.forecast import run as forecast_run

    spent: dict[str, list[tuple[float, float]]] = {}

    def clocked(name: str, function: Callable) -> Callable:
        def wrapper(*args: object, **kwargs: object) -> object:
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                spent.setdefault(name, []).append((time.perf_counter() - wall, time.process_time() - cpu))

        return wrapper

    # both are looked up by name where they are used (flops.requested() and check/run.py, at the call)
    originals = flops.count_step_flops, forecast_run.forecast_for
    flops.count_step_flops = clocked("FLOP count (step hook)", originals[0])
    forecast_run.forecast_for = clocked("rest of the forecast", originals[1])
    try:
        for label, cfg in configs.items():
            check_config(cfg, gpu="mi300x")  # warm: imports, the dataset cache
            spent.clear()  # forecast_for runs in every check (it answers None when not asked)
            for _ in range(runs):
                with flops.requested():
                    check_config(cfg, gpu="mi300x")
            for name, values in spent.items():
                walls, cpus = [w for w, _ in values], [c for _, c in values]
                shown = ", ".join(f"{w:.2f}" for w in walls)
                print(f"  {label:10} {name:24} median {median(walls):5.2f} s wall ({shown}), {median(cpus):5.2f} s CPU")
            spent.clear()
    finally:
        flops.count_step_flops, forecast_run.forecast_for = originals


if __name__ == "__main__":
    main()
