"""Issue 14: the seed's blog command, verbatim in flag form, trains in bf16 through every entry point.

The command the project exists for is written as a flag list (``--backend pt --compute_dtype
bfloat16 --fp16``). Through stock ``llamafactory-cli train``, through ``llamafactory-rocm train`` and
through ``run_exp()`` with the flags in ``sys.argv`` it must get the same rewrites as a YAML file:
train (exit 0, adapter written) in bf16 (on CPU: ``use_cpu: true``, which the check adds), with the
rewrites in the launch record ``rocm_launch.json``. Only the tiny model and a few small-size flags
(``--max_samples 16 --cutoff_len 64 --overwrite_cache --report_to none``) differ from the blog.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llamafactory_rocm.resources import datasets_dir
from tests.conftest import offline_env

pytestmark = pytest.mark.trainer

BIN = Path(sys.executable).parent
ENTRY_POINTS = {
    "llamafactory-cli train": [str(BIN / "llamafactory-cli"), "train"],
    "llamafactory-rocm train": [sys.executable, "-m", "llamafactory_rocm.cli.main", "train"],
    "run_exp() with flags in argv": [sys.executable, "-c", "from llamafactory.train.tuner import run_exp; run_exp()"],
}


def seed_command(model: Path, output_dir: Path) -> list[str]:
    return [
        *("--stage", "sft", "--do_train"),
        *("--model_name_or_path", str(model)),
        *("--dataset", "amd_finetune_qa", "--dataset_dir", str(datasets_dir())),
        *("--template", "llama3", "--finetuning_type", "lora", "--lora_target", "q_proj,v_proj"),
        *("--output_dir", str(output_dir)),
        *("--per_device_train_batch_size", "2", "--max_steps", "2"),
        *("--fp16", "--backend", "pt", "--compute_dtype", "bfloat16"),
        # only to keep it small on CPU
        *("--max_samples", "16", "--cutoff_len", "64", "--overwrite_cache", "--report_to", "none"),
    ]


def trained_precision(output_dir: Path) -> tuple[bool, bool]:
    import torch

    args = torch.load(output_dir / "training_args.bin", weights_only=False)
    return args.bf16, args.fp16


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_seed_command_in_flag_form_trains_in_bf16_with_the_rewrites_recorded(
    entry: str, tiny_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "saves" / "seed"
    result = subprocess.run(
        [*ENTRY_POINTS[entry], *seed_command(tiny_model, out)],
        cwd=tmp_path,
        env=offline_env(tmp_path, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    said = (result.stdout[-2000:] + "\n" + result.stderr[-3000:]).strip()
    assert result.returncode == 0, said
    assert (out / "adapter_model.safetensors").is_file(), said

    record_file = out / "rocm_launch.json"
    assert record_file.is_file(), f"no launch record in {out}: {sorted(p.name for p in out.iterdir())}"
    record = json.loads(record_file.read_text(encoding="utf-8"))
    resolved = record["resolved_config"]
    assert resolved.get("bf16") is True, resolved
    assert not resolved.get("fp16"), resolved
    assert resolved.get("use_cpu") is True, resolved  # bf16 on a CPU-only machine needs it
    assert "compute_dtype" not in resolved and "backend" not in resolved, resolved
    changes = {f["code"] for f in record["findings"] if f["level"] == "change"}
    assert {"COMPUTE_DTYPE_REWRITTEN", "BACKEND_DROPPED"} <= changes, record["findings"]
    assert record["input_config"].get("compute_dtype") == "bfloat16", record["input_config"]
    assert record["input_config"].get("backend") == "pt", record["input_config"]
    # what the trainer really ran with, not only what the record says
    assert trained_precision(out) == (True, False)
