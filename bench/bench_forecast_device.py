"""The forecast from peak x achieved fraction against real GPU step times, across model families (issue 39).

Prepared for a lent GPU (the device machine: an NVIDIA H100 or H200, not AMD; none was lent to the session that
wrote it, so it has run only in its CPU mode). For each family, a random bf16 model at the family's full width
and ``--layers`` layers (the shipped shapes in llamafactory_rocm/models/: Llama-3-8B, Qwen3-8B and the MoE
Qwen3-30B-A3B) beside the tiny tokenizer:

1. the forecast's FLOPs a step: ``llamafactory-rocm check CFG --forecast --json`` (``run_flops / steps``);
2. the real seconds a step: stock LLaMA-Factory (``run_exp``, hook off) trains ``--steps`` steps; the median
   of the steps after the first two, from a callback's timestamps at each ``on_step_end``.

The achieved fraction of one family (its FLOPs a step / (its seconds a step x the peak)) forecasts each other
family's seconds a step (their FLOPs / (peak x that fraction)); the target: within 20% of the measured, the
fraction always from a different family. The peak cancels from that ratio; it is printed with the fractions
(``--peak``, TFLOPS; default 989.4: the H100 SXM's dense bf16, NVIDIA's H100 datasheet; an H200 has the same).

    python bench/bench_forecast_device.py --out forecast_device.json [--layers 2] [--steps 12]
    python bench/bench_forecast_device.py --out cpu.json --cpu    # the pipeline on tiny widths, no claim

On the device machine: its image has torch, transformers, peft and accelerate but not LLaMA-Factory; carry
the wheels of this checkout's llamafactory (0.9.5) and what it needs beyond the image, as the device tool's
README says (`pip download --no-deps ... -d .whl`, installed there into a folder on PYTHONPATH), and pin
transformers to the version tests/ run here, since the image's may be outside LLaMA-Factory's range. Then
``PYTHONPATH=/tmp/site:. python3 bench/bench_forecast_device.py --out $OUT/forecast_device.json`` (about 3 minutes
for the three families at 2 layers, 12 steps each).

``--cpu`` shrinks every family to hidden 256 (its own heads and layer kinds kept) and trains in bf16 on the
CPU (``use_cpu``): it checks that the script runs, not the forecast.
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
import time
from pathlib import Path

import yaml
from _util import machine, tiny_model

ROOT = Path(__file__).resolve().parents[1]
# GPT-OSS is not among them: LLaMA-Factory cannot load it here or on ROCm (ATTENTION_KERNEL_UNAVAILABLE)
FAMILIES = {"llama3": "llama3_8b.json", "qwen3": "qwen3_8b.json", "qwen3_moe": "qwen3_30b_a3b.json"}
TARGET = 0.20

CHILD = r"""
import json, sys, time
from transformers import TrainerCallback
from llamafactory.train.tuner import run_exp

class Clock(TrainerCallback):
    ends = []
    def on_step_end(self, args, state, control, **kw):
        try:
            import torch
            torch.cuda.synchronize()
        except Exception:
            pass
        self.ends.append(time.perf_counter())

clock = Clock()
run_exp(json.loads(sys.argv[1]), [clock])
print("ENDS " + json.dumps(clock.ends))
"""


def shipped_config(family: str, layers: int, cpu: bool) -> dict:
    """The family's shipped config.json at ``layers`` layers (per-layer lists cut to match); on ``--cpu`` at
    hidden 256 with the family's own kinds of layer."""
    config = dict(json.loads((ROOT / "llamafactory_rocm/models" / FAMILIES[family]).read_text())["config"])
    full = config["num_hidden_layers"]
    for key, value in list(config.items()):
        if isinstance(value, list) and len(value) == full:  # layer_types and the like
            config[key] = value[:layers]
    config["num_hidden_layers"] = layers
    if cpu:
        heads = 4
        config.update(hidden_size=256, intermediate_size=512, num_attention_heads=heads, num_key_value_heads=2,
                      head_dim=64, vocab_size=min(config.get("vocab_size", 32000), 32000))  # fmt: skip
        if "num_experts" in config:
            config.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128)
    return config


def build_model(folder: Path, family: str, layers: int, cpu: bool) -> None:
    """The tiny tokenizer beside a random bf16 model of the family's shape, as the families' checkpoints are."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tiny_model(folder)  # the tokenizer files; its model files are replaced below
    tiny = json.loads((folder / "config.json").read_text())
    shape = shipped_config(family, layers, cpu)
    model_type = shape.pop("model_type")
    for key in ("architectures", "torch_dtype", "dtype", "quantization_config", "transformers_version",
                "bos_token_id", "eos_token_id", "pad_token_id"):  # fmt: skip
        shape.pop(key, None)
    ids = {k: tiny.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    config = AutoConfig.for_model(model_type, **shape, **ids)
    with torch.device("cpu" if cpu else "cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    for stale in folder.glob("model*.safetensors*"):
        stale.unlink()
    model.save_pretrained(folder, safe_serialization=True)
    del model


def write_data(folder: Path, rows: int) -> None:
    """Rows longer than any cutoff used here: every batch is cut to ``cutoff_len``, the shape of the forecast."""
    words = ("rocm hip gfx942 lora adapter bf16 kernel memory batch token " * 900).split()
    data = [{"instruction": " ".join(words[: 600 + i]), "input": "", "output": " ".join(words[:3000])}
            for i in range(rows)]  # fmt: skip
    (folder / "long.json").write_text(json.dumps(data))
    (folder / "dataset_info.json").write_text(json.dumps({"long": {"file_name": "long.json"}}))


def train_config(model: Path, data: Path, out: Path, args: argparse.Namespace) -> dict:
    return {
        "stage": "sft", "do_train": True, "model_name_or_path": str(model), "finetuning_type": "lora",
        "lora_rank": 16, "lora_alpha": 32, "lora_target": "all", "dataset": "long", "dataset_dir": str(data),
        "template": "llama3", "cutoff_len": args.cutoff, "max_samples": args.batch * args.steps,
        "overwrite_cache": True, "per_device_train_batch_size": args.batch, "gradient_accumulation_steps": 1,
        "max_steps": args.steps, "learning_rate": 1e-4, "bf16": True, "flash_attn": "sdpa",
        "output_dir": str(out), "overwrite_output_dir": True, "save_strategy": "no", "report_to": "none",
        "logging_steps": 1, "seed": 0, **({"use_cpu": True} if args.cpu else {}),
    }  # fmt: skip


def forecast_flops_per_step(cfg: Path, env: dict) -> tuple[float, int]:
    # planned for an MI300X (--gpu), so that the check's dry run does not hang on the NVIDIA card it finds;
    # the FLOPs do not depend on the card
    cmd = [sys.executable, "-m", "llamafactory_rocm.cli.main", "check", str(cfg), "--forecast", "--json", "--gpu",
           "mi300x"]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode not in (0, 1):  # 1: the check found warnings; the forecast is made all the same
        raise SystemExit(f"check failed ({done.returncode}): {done.stderr[-2000:]}{done.stdout[-1000:]}")
    forecast = json.loads(done.stdout)["forecast"]
    if forecast.get("run_flops") is None:
        raise SystemExit(f"no FLOPs counted: {forecast.get('notes') or forecast.get('why')}")
    steps = forecast["work"]["steps"]
    return forecast["run_flops"] / steps, steps


def seconds_per_step(config: dict, env: dict) -> tuple[float, list[float]]:
    shutil.rmtree(config["output_dir"], ignore_errors=True)
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(config)], env={**env, "LLAMAFACTORY_ROCM": "0"},
                          capture_output=True, text=True)  # fmt: skip
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("ENDS ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"stock run failed ({done.returncode}): {done.stderr[-3000:]}")
    ends = json.loads(line[5:])
    steps = [b - a for a, b in itertools.pairwise(ends)]  # from the end of step 1 on
    return statistics.median(steps[1:] or steps), [round(s, 4) for s in steps]


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--out", type=Path, required=True)
    cli.add_argument("--families", default=",".join(FAMILIES))
    cli.add_argument("--layers", type=int, default=2)
    cli.add_argument("--steps", type=int, default=12)
    cli.add_argument("--batch", type=int, default=4)
    cli.add_argument("--cutoff", type=int, default=2048)
    cli.add_argument("--peak", type=float, default=989.4, help="the card's dense bf16 TFLOPS (default: H100 SXM)")
    cli.add_argument("--cpu", action="store_true", help="tiny widths, on the CPU: checks the script runs")
    args = cli.parse_args()
    if args.cpu:
        args.cutoff, args.steps = min(args.cutoff, 256), min(args.steps, 6)
    work = Path(tempfile.mkdtemp(prefix="lfr-bench-device-"))
    env = {**os.environ, "HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    data = work / "data"
    data.mkdir()
    write_data(data, rows=args.batch * args.steps)
    device = "cpu" if args.cpu else _gpu_name()
    result: dict = {"machine": machine(), "device": device, "date": time.strftime("%Y-%m-%d"), "peak_tflops": args.peak,
                    "layers": args.layers, "batch": args.batch, "cutoff": args.cutoff, "families": {}}  # fmt: skip
    try:
        for family in args.families.split(","):
            model = work / family
            started = time.perf_counter()
            build_model(model, family, args.layers, args.cpu)
            config = train_config(model, data, work / f"out_{family}", args)
            cfg = work / f"{family}.yaml"
            cfg.write_text(yaml.safe_dump(config))
            flops, steps = forecast_flops_per_step(cfg, env)
            seconds, all_steps = seconds_per_step(config, env)
            row = {"flops_per_step": flops, "forecast_steps": steps, "seconds_per_step": seconds,
                   "step_seconds": all_steps, "fraction": flops / (seconds * args.peak * 1e12),
                   "wall_s": round(time.perf_counter() - started, 1)}  # fmt: skip
            result["families"][family] = row
            print(f"{family:8} {flops:.4g} FLOPs a step, {seconds:.4g} s a step, "
                  f"{row['fraction']:.1%} of {args.peak:g} TFLOPS", flush=True)  # fmt: skip
            args.out.write_text(json.dumps(result, indent=1))
        result["cross"] = cross(result["families"], args.peak)
        args.out.write_text(json.dumps(result, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def cross(families: dict, peak: float) -> list[dict]:
    """Each family's seconds a step forecast from each other family's fraction, against its measured."""
    rows = []
    for target, measured in families.items():
        for source, fitted in families.items():
            if source == target:
                continue
            forecast = measured["flops_per_step"] / (peak * 1e12 * fitted["fraction"])
            ratio = forecast / measured["seconds_per_step"]
            rows.append({"target": target, "fraction_from": source, "ratio": ratio})
            print(f"{target:8} from {source:8}'s fraction: forecast / measured {ratio:.3f}"
                  f"{'' if abs(ratio - 1) <= TARGET else '  (outside 20%)'}")  # fmt: skip
    return rows


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"


if __name__ == "__main__":
    main()
