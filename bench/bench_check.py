"""``llamafactory-rocm check`` latency with and without LLaMA-Factory's launch run dry, interleaved.

  before  the package at a commit before the dry run was wired (a git worktree, on PYTHONPATH)
  after   this checkout

on two configs: the tiny local Llama (tokenizer, data and model all reachable, so every dry step runs)
and a Llama-3-8B-shaped folder (its config.json, no weights, the tiny tokenizer): the meta model of 8B.

    python bench/bench_check.py --before-commit c30ac74 [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from _util import machine, median, timed, tiny_model

from llamafactory_rocm.resources import datasets_dir

ROOT = Path(__file__).resolve().parents[1]


def eight_b_folder(tiny: Path, folder: Path) -> Path:
    """config.json with Llama-3-8B's shape (the shipped shape file) and the tiny tokenizer: no weights."""
    shutil.copytree(tiny, folder)
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    shape = json.loads((ROOT / "llamafactory_rocm" / "models" / "llama3_8b.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    config.update(shape["config"])
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--runs", type=int, default=5)
    cli.add_argument("--before-commit", required=True)
    args = cli.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lfr-bench-check-"))
    before = work / "before"
    try:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before), args.before_commit],
                       check=True, capture_output=True)  # fmt: skip
        tiny = tiny_model(work / "tiny")
        models = {"tiny": tiny, "8B-shaped": eight_b_folder(tiny, work / "llama3-8b-shape")}
        env = {**os.environ, "HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        variants = {"before": {**env, "PYTHONPATH": str(before)}, "after": env}
        times: dict[tuple[str, str], list[float]] = {}
        for run in range(args.runs + 1):  # run 0 warms caches and is not counted
            for label, model in models.items():
                cfg = work / f"{label}.yaml"
                cfg.write_text(yaml.safe_dump({
                    "model_name_or_path": str(model), "stage": "sft", "do_train": True, "finetuning_type": "lora",
                    "lora_target": "all", "template": "llama3", "dataset": "amd_finetune_qa",
                    "dataset_dir": str(datasets_dir()), "cutoff_len": 256, "output_dir": str(work / f"out-{label}"),
                    "bf16": True, "use_cpu": True, "report_to": "none",
                }))  # fmt: skip
                for name, run_env in variants.items():
                    cmd = [sys.executable, "-m", "llamafactory_rocm.cli.main", "check", str(cfg)]
                    elapsed = timed(cmd, env=run_env, cwd=str(work))
                    if run:
                        times.setdefault((label, name), []).append(elapsed)
        print(f"machine: {machine()}; {args.runs} runs each, interleaved after one warm-up round")
        for (label, name), values in times.items():
            shown = ", ".join(f"{v:.2f}" for v in values)
            print(f"  {label:10} {name:7} median {median(values):6.2f} s   runs {shown}")
        for label in models:
            ratio = median(times[(label, "after")]) / median(times[(label, "before")])
            print(f"  {label:10} after/before {ratio:.2f}")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
