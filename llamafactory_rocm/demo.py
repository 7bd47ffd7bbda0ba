"""The embedded demo: a real LoRA fine-tune on CPU with a tiny local model and the bundled data.

It uses a config written the way blogs write it (``fp16: true``, ``compute_dtype``, ``backend``),
so the demo also shows the rewrites, then goes through LLaMA-Factory's real trainer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .config_io import dump_yaml
from .fsutil import atomic_write_text, first_free_name
from .launch import train
from .resources import datasets_dir
from .tiny import build_tiny_model, texts_from_dataset

DEMO_DATASET = "amd_finetune_qa"


@dataclass(frozen=True)
class DemoResult:
    exit_code: int
    output_dir: Path
    first_loss: float | None
    last_loss: float | None
    adapter: Path | None


def demo_config(model_dir: Path, output_dir: Path, max_steps: int = 60) -> dict:
    return {
        "model_name_or_path": str(model_dir),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "lora",
        "lora_rank": 16,
        "lora_target": "all",
        "template": "llama3",
        "dataset": DEMO_DATASET,
        "dataset_dir": str(datasets_dir()),
        "max_samples": 240,
        "cutoff_len": 256,
        "per_device_train_batch_size": 4,
        "learning_rate": 1.0e-2,
        "max_steps": max_steps,
        "logging_steps": 10,
        "save_steps": max_steps,
        "output_dir": str(output_dir),
        "report_to": "none",
        "overwrite_cache": True,
        "seed": 0,
        # Written the way blog posts write it; the pre-launch check rewrites all three.
        "fp16": True,
        "compute_dtype": "bfloat16",
        "backend": "pt",
    }


def loss_curve(output_dir: Path) -> list[float]:
    state = output_dir / "trainer_state.json"
    if not state.is_file():
        return []
    history = json.loads(state.read_text(encoding="utf-8")).get("log_history", [])
    return [entry["loss"] for entry in history if "loss" in entry]


def run_demo(work_dir: Path, max_steps: int = 60) -> DemoResult:
    work_dir.mkdir(parents=True, exist_ok=True)
    model_dir = work_dir / "tiny-llama"
    if not (model_dir / "config.json").is_file():
        build_tiny_model(model_dir, texts_from_dataset(datasets_dir() / f"{DEMO_DATASET}.json"))
    output_dir = first_free_name(work_dir, "run", "")  # never reuse an earlier run's folder
    config_path = first_free_name(work_dir, "demo_config", ".yaml")
    atomic_write_text(config_path, dump_yaml(demo_config(model_dir, output_dir, max_steps)), overwrite=False)
    code = train(config_path, origin="llamafactory-rocm demo")
    losses = loss_curve(output_dir)
    adapter = output_dir / "adapter_model.safetensors"
    return DemoResult(
        exit_code=code,
        output_dir=output_dir,
        first_loss=losses[0] if losses else None,
        last_loss=losses[-1] if losses else None,
        adapter=adapter if adapter.is_file() else None,
    )
