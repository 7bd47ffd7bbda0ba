"""What ``check --forecast`` adds to ``check``: the same config checked with and without it, interleaved, on
the tiny local Llama and a Llama-3-8B-shaped folder (its config.json, no weights: the meta model of 8B, whose
FLOPs are counted on FakeTensors with every layer run).

    python bench/bench_forecast.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import yaml
from _util import machine, median, timed, tiny_model
from bench_check import eight_b_folder

from llamafactory_rocm.resources import datasets_dir


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--runs", type=int, default=3)
    args = cli.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lfr-bench-forecast-"))
    try:
        tiny = tiny_model(work / "tiny")
        models = {"tiny": tiny, "8B-shaped": eight_b_folder(tiny, work / "llama3-8b-shape")}
        env = {**os.environ, "HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        variants = {"check": [], "check --forecast": ["--forecast"]}
        times: dict[tuple[str, str], list[float]] = {}
        for run in range(args.runs + 1):  # run 0 warms caches and is not counted
            for label, model in models.items():
                cfg = work / f"{label}.yaml"
                cfg.write_text(yaml.safe_dump({
                    "model_name_or_path": str(model), "stage": "sft", "do_train": True, "finetuning_type": "lora",
                    "lora_target": "all", "template": "llama3", "dataset": "amd_finetune_qa",
                    "dataset_dir": str(datasets_dir()), "cutoff_len": 1024, "output_dir": str(work / f"out-{label}"),
                    "bf16": True, "report_to": "none",
                }))  # fmt: skip
                for name, extra in variants.items():
                    cmd = [sys.executable, "-m", "llamafactory_rocm.cli.main", "check", str(cfg), "--gpu", "mi300x"]
                    elapsed = timed([*cmd, *extra], env=env, cwd=str(work))
                    if run:
                        times.setdefault((label, name), []).append(elapsed)
        print(f"machine: {machine()}; {args.runs} runs each, interleaved after one warm-up round")
        for (label, name), values in times.items():
            shown = ", ".join(f"{v:.2f}" for v in values)
            print(f"  {label:10} {name:17} median {median(values):6.2f} s   runs {shown}")
        for label in models:
            base, with_forecast = median(times[(label, "check")]), median(times[(label, "check --forecast")])
            print(f"  {label:10} forecast adds {with_forecast - base:+.2f} s, ratio {with_forecast / base:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
