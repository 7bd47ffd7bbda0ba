"""Real peak GPU memory of LLaMA-Factory LoRA runs against ``memory.py``'s estimate, side by side.

Needs a GPU (it ran on a lent NVIDIA H200, not an AMD card): a Llama-3-8B-shaped model with random
bf16 weights (the shipped config, ``llamafactory_rocm/models/llama3_8b.json``) is trained for a few
steps through LLaMA-Factory's own ``run_exp`` at the presets' batch x cutoff shapes, and
``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` are recorded next to the estimate for
the same config. Random weights cost the same memory as real ones; every example is cut to
``cutoff_len``, so the shapes are the worst case the estimate describes.

    python bench/bench_memory_device.py --out mem.json --shapes 1x2048,4x2048,4x4096,16x4096
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHILD = r"""
import json, sys, torch
from transformers import TrainerCallback
from llamafactory.train.tuner import run_exp

class Peak(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        self.allocated = torch.cuda.max_memory_allocated() / 2**30
        self.reserved = torch.cuda.max_memory_reserved() / 2**30
        self.steps = state.global_step

peak = Peak()
config = json.loads(sys.argv[1])
run_exp(config, [peak])
print("PEAK " + json.dumps({"allocated_gib": peak.allocated, "reserved_gib": peak.reserved, "steps": peak.steps}))
"""


def build_model(folder: Path) -> None:
    """The tiny tokenizer (llama3 special tokens) beside a random Llama-3-8B-shaped bf16 model."""
    import torch
    from _util import tiny_model
    from transformers import LlamaConfig, LlamaForCausalLM

    tiny_model(folder)
    shipped = json.loads((ROOT / "llamafactory_rocm/models/llama3_8b.json").read_text())["config"]
    tiny = json.loads((folder / "config.json").read_text())
    config = LlamaConfig(
        **{k: v for k, v in shipped.items() if k != "model_type"},
        bos_token_id=tiny.get("bos_token_id"),
        eos_token_id=tiny.get("eos_token_id"),
        pad_token_id=tiny.get("pad_token_id"),
        rope_theta=500000.0,
        torch_dtype="bfloat16",
    )
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    del model
    torch.cuda.empty_cache()


def write_data(folder: Path, rows: int) -> None:
    words = ("rocm hip gfx942 lora adapter bf16 kernel memory batch token " * 900).split()
    data = [
        {"instruction": " ".join(words[: 600 + i]), "input": "", "output": " ".join(words[:3000])} for i in range(rows)
    ]
    (folder / "long.json").write_text(json.dumps(data))
    (folder / "dataset_info.json").write_text(json.dumps({"long": {"file_name": "long.json"}}))


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--out", type=Path, required=True)
    cli.add_argument("--shapes", default="1x2048,4x2048,4x4096,16x4096", help="BATCHxCUTOFF,...")
    cli.add_argument("--steps", type=int, default=3)
    cli.add_argument("--work", type=Path, default=Path("/tmp/bench_memory"))
    args = cli.parse_args()

    from llamafactory_rocm.lf.memory import estimate_config

    model, data = args.work / "llama3-8b-random", args.work / "data"
    data.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if not (model / "model.safetensors.index.json").is_file():
        build_model(model)
    write_data(data, rows=64)
    results = {"built_s": round(time.perf_counter() - started, 1), "runs": []}
    for shape in args.shapes.split(","):
        batch, cutoff = (int(x) for x in shape.split("x"))
        config = {
            "stage": "sft", "do_train": True, "model_name_or_path": str(model), "finetuning_type": "lora",
            "lora_rank": 16, "lora_alpha": 32, "lora_target": "all", "dataset": "long", "dataset_dir": str(data),
            "template": "llama3", "cutoff_len": cutoff, "max_samples": batch * args.steps,
            "overwrite_cache": True, "preprocessing_num_workers": 8, "per_device_train_batch_size": batch,
            "gradient_accumulation_steps": 1, "max_steps": args.steps, "learning_rate": 1e-4, "bf16": True,
            "flash_attn": "sdpa", "output_dir": str(args.work / f"out_{shape}"), "overwrite_output_dir": True,
            "save_strategy": "no", "report_to": "none", "logging_steps": 1,
        }  # fmt: skip
        estimate = estimate_config(config)
        t0 = time.perf_counter()
        env = {**os.environ, "LLAMAFACTORY_ROCM": "0", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(config)], capture_output=True, text=True, env=env, timeout=400
        )
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PEAK ")), None)
        run = {
            "shape": shape,
            "estimate_gib": None if estimate is None else round(estimate.total_gib, 2),
            "wall_s": round(time.perf_counter() - t0, 1),
            "rc": proc.returncode,
        }
        if line:
            run.update(json.loads(line[5:]))
        else:
            run["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1][:400]
        results["runs"].append(run)
        print(json.dumps(run), flush=True)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
