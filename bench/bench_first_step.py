"""What step 1 on a shrunk twin (lf/dry_step.py) adds to ``llamafactory-rocm check``, issue 51 item 5.

Four models, each a folder with the tests' tiny tokenizer (tests/conftest.py) and a config.json, no weights
(the twin never reads them): the tiny Llama itself (with its weights), Llama-3-8B's and Qwen3-30B-A3B's
published shapes (llamafactory_rocm/models/*.json) and Llama-3-70B's (Meta's config.json for
meta-llama/Meta-Llama-3-70B: hidden 8192, 80 layers, 64 heads, 8 key-value heads, intermediate 28672). For each:
the whole check as a user runs it (a subprocess, medians of --runs after one warm-up), and in one process the
dry launch's own step times (lf/dry_run.py ``run.timings``: "first step" is the twin's build and run).

    python bench/bench_first_step.py [--runs 3]

The twin's vocabulary is the tokenizer's (460 tokens here); with a real 128k vocabulary the twin's logits cap
cuts cutoff_len (lf/dry_step.py LOGIT_ELEMENTS) so that one micro-batch stays near the same cost.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import yaml
from _util import machine, median, timed, tiny_model

from llamafactory_rocm.resources import datasets_dir

ROOT = Path(__file__).resolve().parents[1]
LLAMA3_70B = {  # meta-llama/Meta-Llama-3-70B config.json
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def shaped_folder(tiny: Path, folder: Path, shape: dict) -> Path:
    """The tiny tokenizer and a config.json of ``shape``: no weights."""
    shutil.copytree(tiny, folder)
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    (folder / "config.json").write_text(json.dumps({**shape, "architectures": None}))
    return folder


def published(name: str) -> dict:
    return json.loads((ROOT / "llamafactory_rocm" / "models" / f"{name}.json").read_text())["config"]


def config_for(model: Path, out: Path) -> dict:
    return {
        "model_name_or_path": str(model), "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "lora_target": "all", "template": "llama3", "dataset": "amd_finetune_qa", "dataset_dir": str(datasets_dir()),
        "cutoff_len": 256, "per_device_train_batch_size": 2, "output_dir": str(out), "report_to": "none",
        "max_samples": 64,
    }  # fmt: skip


def step_times(config: dict) -> dict[str, float]:
    """The dry launch's own step times, in this process (lf/dry_run.py dry_launch)."""
    from llamafactory_rocm.lf.dry_run import dry_launch

    run = dry_launch(config)
    said = [f.code for f in run.findings if f.code.startswith("FIRST_STEP") or f.code == "DRY_RUN_NOT_CHECKED"]
    assert "FIRST_STEP_RAN" in said, [f.message for f in run.findings]
    return dict(run.timings)


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--runs", type=int, default=3)
    cli.add_argument("--models", default="tiny,llama3_8b,qwen3_30b_a3b,llama3_70b", help="which, comma-separated")
    cli.add_argument("--step-only", action="store_true", help="the dry launch's step times only, no whole check")
    args = cli.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lfr-bench-step-"))
    os.environ.update(HF_HOME=str(work / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tiny = tiny_model(work / "tiny")
    models = {
        "tiny": tiny,
        "llama3_8b": shaped_folder(tiny, work / "llama3_8b", published("llama3_8b")),
        "qwen3_30b_a3b": shaped_folder(tiny, work / "qwen3_30b_a3b", published("qwen3_30b_a3b")),
        "llama3_70b": shaped_folder(tiny, work / "llama3_70b", LLAMA3_70B),
    }
    print(f"machine: {machine()}; {args.runs} runs each after one warm-up")
    for label, model in models.items():
        if label not in args.models.split(","):
            continue
        config = config_for(model, work / f"out-{label}")
        cfg = work / f"{label}.yaml"
        cfg.write_text(yaml.safe_dump(config))
        cmd = [sys.executable, "-m", "llamafactory_rocm.cli.main", "check", str(cfg)]
        rounds = 0 if args.step_only else args.runs + 1
        walls = [timed(cmd, env=dict(os.environ), cwd=str(work)) for _ in range(rounds)][1:]
        steps = [step_times(config) for _ in range(args.runs)]
        first = median([s.get("first step", 0.0) for s in steps])
        dry = median([sum(s.values()) for s in steps])
        whole = f"check median {median(walls):6.2f} s (runs {', '.join(f'{w:.2f}' for w in walls)}); " if walls else ""
        print(f"  {label:14} {whole}dry launch {dry:5.2f} s of which step 1 on the twin {first:5.2f} s", flush=True)


if __name__ == "__main__":
    main()
