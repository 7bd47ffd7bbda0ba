"""``llamafactory-rocm check --gpu <gpu>`` of MoE and vision-language shapes: time, peak memory, and the
weights it reports against the model transformers builds on the meta device from the same config.json.

Each shape in llamafactory_rocm/models/ named below is written as a model folder (its config.json and the
tiny tokenizer, no weights) and checked with a LoRA SFT config (lora_target all, batch 1, cutoff_len 1024).
Each check runs under ``/usr/bin/time -v`` (wall seconds, maximum resident set size), ``--runs`` times
(median); the activations it reports and where they came from (``estimate.activations_from``: the traced
forward, lf/dry_activations.py, or the per-family formula). The oracle for the weights is
``sum(p.numel() * p.element_size())`` over transformers' ``AutoModelForCausalLM`` /
``AutoModelForImageTextToText.from_config(config)`` under ``torch.device("meta")``.

    python bench/bench_memory_build.py [--runs 3] [--gpu mi300x] [--pythonpath OLD_PACKAGE_COPY]

``--pythonpath`` puts another copy of the package first (the "before" of a change).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from _util import machine, median, tiny_model

from llamafactory_rocm.resources import datasets_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.test_memory_built import shape_folder, transformers_meta_bytes  # noqa: E402  (one oracle for both)

SHAPES = (
    "qwen3_30b_a3b",
    "qwen3_moe_defaults",
    "mixtral_defaults",
    "llama4_defaults",
    "qwen2_5_vl_defaults",
    "gemma3_defaults",
    "deepseek_v3_defaults",
    "qwen3_defaults",
)
GIB = 2**30


def lora_config(folder: Path, out: Path) -> dict:
    return {
        "stage": "sft",
        "do_train": True,
        "model_name_or_path": str(folder),
        "finetuning_type": "lora",
        "lora_target": "all",
        "dataset": "amd_finetune_qa",
        "dataset_dir": str(datasets_dir()),
        "template": "default",
        "cutoff_len": 1024,
        "per_device_train_batch_size": 1,
        "output_dir": str(out),
        "bf16": True,
    }


def check(config_path: Path, gpu: str, pythonpath: str | None) -> tuple[float, float, dict]:
    # run in the config's folder: `python -m` puts the working directory first on sys.path, before PYTHONPATH
    """(wall seconds, max RSS in GB, the --json report) of one check under /usr/bin/time -v."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "llamafactory_rocm.cli.main", "check", str(config_path)]
    proc = subprocess.run(
        [*cmd, "--gpu", gpu, "--json"], env=env, capture_output=True, text=True, cwd=config_path.parent
    )
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", proc.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    if wall is None or rss is None:
        raise SystemExit(f"no timing from /usr/bin/time:\n{proc.stderr[-2000:]}")
    seconds = int(wall[1] or 0) * 3600 + int(wall[2]) * 60 + float(wall[3])
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = {}
    return seconds, int(rss[1]) * 1024 / 1e9, report


def reported_weights(report: dict) -> float | None:
    for finding in report.get("findings", []):
        if finding.get("code", "").startswith("MEMORY_"):
            found = re.search(r"weights ([\d.]+)", finding.get("message", ""))
            if found:
                return float(found[1])
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--gpu", default="mi300x")
    parser.add_argument("--pythonpath", default=None)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    args = parser.parse_args()
    print(f"# check --gpu {args.gpu}, median of {args.runs}, {machine()}")
    print("| shape | meta model weights GiB | check says GiB | activations GiB (from) | wall s | max RSS GB | ready |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        work = Path(tmp)
        tiny = tiny_model(work / "tiny")
        for name in args.shapes.split(","):
            folder = shape_folder(name, tiny, work / "shapes")
            config_path = work / f"{name}.yaml"
            config_path.write_text(yaml.safe_dump(lora_config(folder, work / "out" / name)))
            oracle = transformers_meta_bytes(folder) / GIB
            runs = [check(config_path, args.gpu, args.pythonpath) for _ in range(args.runs)]
            wall = median([r[0] for r in runs])
            rss = median([r[1] for r in runs])
            said = reported_weights(runs[-1][2])
            ok = runs[-1][2].get("ok")
            said_text = "none" if said is None else f"{said:.1f}"
            est = runs[-1][2].get("estimate") or {}
            acts = f"{est['activations_gib']:.2f} ({est.get('activations_from', 'formula')})" if est else "none"
            print(f"| {name} | {oracle:.1f} | {said_text} | {acts} | {wall:.1f} | {rss:.2f} | {ok} |", flush=True)


if __name__ == "__main__":
    main()
