"""End to end on CPU through LLaMA-Factory's real trainer: our ``train``, stock ``llamafactory-cli
train`` with the hook, ``run_exp(args=dict)``, two torchrun ranks, the divergence guard."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm.check.record import latest_record
from tests.conftest import offline_env, run_cli, tiny_train_config

pytestmark = pytest.mark.trainer

LLAMAFACTORY_CLI = str(Path(sys.executable).parent / "llamafactory-cli")
BLOG_KEYS = {"fp16": True, "compute_dtype": "bfloat16", "backend": "pt"}


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def losses(output_dir: Path) -> list[float]:
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return [e["loss"] for e in history if "loss" in e]


def trained_precision(output_dir: Path) -> tuple[bool, bool]:
    import torch

    args = torch.load(output_dir / "training_args.bin", weights_only=False)
    return args.bf16, args.fp16


def assert_trained_in_bf16_and_learned(output_dir: Path) -> None:
    assert (output_dir / "adapter_model.safetensors").is_file()
    assert trained_precision(output_dir) == (True, False)
    curve = losses(output_dir)
    assert len(curve) >= 10
    assert sum(curve[-3:]) / 3 < curve[0] - 0.5, curve  # the loss falls


def codes(record: dict, level: str = "change") -> set[str]:
    return {f["code"] for f in record["findings"] if f["level"] == level}


def test_llamafactory_rocm_train_rewrites_the_blog_config_and_trains_in_bf16(tiny_model, tmp_path):
    out = tmp_path / "out"
    config = tiny_train_config(tiny_model, out, include_num_input_tokens_seen=True, **BLOG_KEYS)
    cfg = write_config(tmp_path / "blog.yaml", config)
    result = run_cli(["train", str(cfg)], tmp_path, offline_env(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert_trained_in_bf16_and_learned(out)
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    speeds = [e["rocm_tokens_per_s"] for e in history if "rocm_tokens_per_s" in e]
    assert len(speeds) >= 5 and all(s > 0 for s in speeds)  # the guard logs speed at every logging step
    record = latest_record(out)
    assert record["origin"] == "llamafactory-rocm train"
    assert {"COMPUTE_DTYPE_REWRITTEN", "BACKEND_DROPPED", "PRECISION_CPU_USE_CPU", "PLOT_LOSS_ADDED"} <= codes(record)
    summary = result.stdout + result.stderr
    assert "llamafactory-rocm: training summary" in summary
    assert f"loss plot      {out / 'training_loss.png'}" in summary and (out / "training_loss.png").is_file()
    assert f"launch record  {out / 'rocm_launch.json'}" in summary
    assert record["input_config"]["compute_dtype"] == "bfloat16"
    resolved = record["resolved_config"]
    assert resolved["bf16"] is True and resolved["fp16"] is False and resolved["use_cpu"] is True
    assert "compute_dtype" not in resolved and "backend" not in resolved
    assert yaml.safe_load((out / record["resolved_yaml"]).read_text()) == resolved
    assert record["versions"]["llamafactory"] and record["snapshot"]["source"] == "probe"
    # our own launch is recorded once: the hook inside LLaMA-Factory saw the digest and stayed quiet
    assert sorted(p.name for p in out.glob("rocm_launch*.json")) == ["rocm_launch.json"]
    # train's check forecast the run; the hook found that forecast in train's record and said it beside the
    # trainer's own count, in the summary and in the record's "run" block
    step = json.loads((out / "trainer_state.json").read_text())["global_step"]
    assert record["forecast"]["work"]["steps"] == step == record["run"]["global_step"]
    assert f"forecast       {step} steps (global_step {step})" in summary


def test_train_refuses_an_unknown_key_before_loading_anything(tiny_model, tmp_path):
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "typo.yaml", tiny_train_config(tiny_model, out, lora_rnak=8))
    result = run_cli(["train", str(cfg)], tmp_path, offline_env(tmp_path))
    assert result.returncode == 1
    assert "UNKNOWN_KEY" in result.stdout and "lora_rank" in result.stdout
    assert not out.exists()


def test_train_overwrite_output_dir_is_done_as_asked_with_a_warning(tiny_model, tmp_path):
    """overwrite_output_dir: true over a checkpoint is the user's explicit choice, and LLaMA-Factory trains it
    (its parser skips the resume): train says what goes, then trains."""
    out = tmp_path / "out"
    (out / "checkpoint-5").mkdir(parents=True)
    (out / "checkpoint-5" / "adapter_model.safetensors").write_bytes(b"earlier run")
    cfg = write_config(tmp_path / "c.yaml", tiny_train_config(tiny_model, out, overwrite_output_dir=True, max_steps=2))
    result = run_cli(["train", str(cfg)], tmp_path, offline_env(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "[warning] CHECKPOINT_OVERWRITE" in result.stdout and "checkpoint-5" in result.stdout
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2  # trained from step 0


def test_stock_llamafactory_cli_gets_the_same_rewrites(tiny_model, tmp_path):
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "blog.yaml", tiny_train_config(tiny_model, out, **BLOG_KEYS))
    result = subprocess.run(
        [LLAMAFACTORY_CLI, "train", str(cfg)], cwd=tmp_path, env=offline_env(tmp_path), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert_trained_in_bf16_and_learned(out)
    record = latest_record(out)
    assert record["origin"] == "llamafactory-cli train (hook)"
    assert {"COMPUTE_DTYPE_REWRITTEN", "BACKEND_DROPPED"} <= codes(record)
    assert "llamafactory-rocm: training summary" in result.stdout + result.stderr
    assert "loss " in result.stderr + result.stdout and (out / "training_loss.png").is_file()


def test_switched_off_stock_behaviour_returns_and_text_training_still_runs(tiny_model, tmp_path):
    # This venv has no torchaudio (the README's install): switched off, stock LLaMA-Factory still imports.
    env = offline_env(tmp_path, LLAMAFACTORY_ROCM="0")
    blog_out = tmp_path / "blog_out"
    cfg = write_config(tmp_path / "blog.yaml", tiny_train_config(tiny_model, blog_out, **BLOG_KEYS))
    result = subprocess.run(
        [LLAMAFACTORY_CLI, "train", str(cfg)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "Some keys are not used by the HfArgumentParser" in result.stderr
    assert "compute_dtype" in result.stderr and "backend" in result.stderr
    assert not blog_out.exists() or not list(blog_out.glob("rocm_launch*.json"))
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "plain.yaml", tiny_train_config(tiny_model, out, max_steps=2))
    result = subprocess.run(
        [LLAMAFACTORY_CLI, "train", str(cfg)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "adapter_model.safetensors").is_file()
    assert not list(out.glob("rocm_launch*.json"))  # no check, no record, no summary
    assert "training summary" not in result.stdout + result.stderr


def test_run_exp_from_a_script_gets_the_rewrites_and_the_guard(tiny_model, tmp_path):
    out = tmp_path / "out"
    config = tiny_train_config(tiny_model, out, **BLOG_KEYS)
    script = tmp_path / "my_script.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from llamafactory.train.tuner import run_exp
            callbacks = []
            run_exp(args={config!r}, callbacks=callbacks)
            print("GUARD" if any(type(c).__name__ == "DivergenceGuard" for c in callbacks) else "NO-GUARD")
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=offline_env(tmp_path), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert_trained_in_bf16_and_learned(out)
    record = latest_record(out)
    assert record["origin"] == "run_exp (hook)"
    assert "COMPUTE_DTYPE_REWRITTEN" in codes(record)


@pytest.mark.torchrun
def test_two_torchrun_ranks_both_run_the_hook_and_write_one_record(tiny_model, tmp_path):
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "blog.yaml", tiny_train_config(tiny_model, out, max_steps=6, **BLOG_KEYS))
    # LLaMA-Factory's own INFO lines (quiet by default) say what each rank ran with.
    env = offline_env(
        tmp_path, FORCE_TORCHRUN="1", NPROC_PER_NODE="2", MASTER_PORT="29517", LLAMAFACTORY_VERBOSITY="INFO"
    )
    result = subprocess.run(
        [LLAMAFACTORY_CLI, "train", str(cfg)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    # Without the hook, rank 1 would reject compute_dtype/backend as unknown keys; it trained in bf16.
    assert "Process rank: 1, world size: 2" in log
    assert "compute dtype: torch.bfloat16" in log
    assert sorted(p.name for p in out.glob("rocm_launch*.json")) == ["rocm_launch.json"]
    assert (out / "adapter_model.safetensors").is_file()
    # the world's rank 0 forecast the run as a rank of 2, and added the trainer's count beside it; one summary
    record, step = latest_record(out), json.loads((out / "trainer_state.json").read_text())["global_step"]
    assert record["forecast"]["work"]["world_size"] == 2 and record["forecast"]["work"]["steps"] == step
    assert record["run"]["global_step"] == step and log.count("llamafactory-rocm: training summary") == 1


def test_guard_stops_a_diverging_run_and_keeps_the_earlier_checkpoint(tiny_model, tmp_path):
    out = tmp_path / "out"
    config = tiny_train_config(tiny_model, out, learning_rate=1e30, save_steps=1, max_steps=8)
    cfg = write_config(tmp_path / "diverge.yaml", config)
    result = run_cli(["train", str(cfg)], tmp_path, offline_env(tmp_path))
    assert result.returncode == 3, result.stderr[-3000:]
    (line,) = {ln.split("llamafactory-rocm: ")[-1] for ln in result.stderr.splitlines() if "stopped at step" in ln}
    step = int(line.split("stopped at step ")[1].split(":")[0])
    assert "learning_rate 1e+30" in line
    assert "is nan" in line or "is inf" in line
    checkpoints = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert checkpoints and max(checkpoints) < step  # nothing saved at or after the bad step
    assert (out / f"checkpoint-{max(checkpoints)}" / "adapter_model.safetensors").is_file()
    assert not (out / "adapter_model.safetensors").exists()  # the diverged weights were not saved


def test_text_training_works_where_torchaudio_is_broken(tiny_model, tmp_path):
    # The PyPI torchaudio wheel on a non-CUDA machine fails like this at import (llamafactory-facts.md).
    broken = tmp_path / "site" / "torchaudio"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise OSError('libc10_cuda.so: cannot open shared object file')\n")
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "c.yaml", tiny_train_config(tiny_model, out, bf16=True, max_steps=4))
    env = offline_env(tmp_path, PYTHONPATH=str(tmp_path / "site"))
    result = subprocess.run(
        [LLAMAFACTORY_CLI, "train", str(cfg)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize(("dataset", "template"), [("amd_finetune_chat", "llama3"), ("my_custom_data", "llama3")])
def test_each_bundled_dataset_trains(dataset, template, tiny_model, tmp_path):
    out = tmp_path / "out"
    config = tiny_train_config(tiny_model, out, dataset=dataset, template=template, max_steps=4, bf16=True)
    cfg = write_config(tmp_path / "c.yaml", config)
    result = run_cli(["train", str(cfg)], tmp_path, offline_env(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "adapter_model.safetensors").is_file()
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 4


def _pairs(folder: Path) -> Path:
    """A tiny preference dataset (ranking: true), as DPO and RM read it."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"instruction": f"What is {i} + {i}?", "chosen": f"{2 * i}.", "rejected": "No idea."} for i in range(8)]
    (folder / "pairs.json").write_text(json.dumps(rows))
    columns = {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected"}
    (folder / "dataset_info.json").write_text(
        json.dumps({"pairs": {"file_name": "pairs.json", "ranking": True, "columns": columns}})
    )
    return folder


def test_stock_llamafactory_cli_trains_dpo_on_a_ranking_dataset_with_the_hook_on(tiny_model, tmp_path):
    """The DPO workflow passes stage="rm" to the data pipeline: a ranking dataset is what it needs."""
    out = tmp_path / "out"
    config = tiny_train_config(tiny_model, out, stage="dpo", dataset="pairs", dataset_dir=str(_pairs(tmp_path / "d")))
    config.update(max_steps=2, max_samples=8)
    cfg = write_config(tmp_path / "dpo.yaml", config)
    result = subprocess.run(
        [LLAMAFACTORY_CLI, "train", str(cfg)], cwd=tmp_path, env=offline_env(tmp_path), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (out / "adapter_model.safetensors").is_file()
    assert latest_record(out)["origin"] == "llamafactory-cli train (hook)"


def _board_log(tiny_model: Path, tmp_path: Path, hook: str = "1") -> list[str]:
    """running_log.txt of stock llamafactory-cli train started as LlamaBoard starts it (webui/runner.py _launch)."""
    out = tmp_path / f"out-{hook}"
    cfg = write_config(tmp_path / f"board-{hook}.yaml", tiny_train_config(tiny_model, out, max_steps=4, fp16=True))
    env = offline_env(tmp_path, LLAMABOARD_ENABLED="1", LLAMABOARD_WORKDIR=str(out), LLAMAFACTORY_ROCM=hook)
    result = subprocess.run(
        [LLAMAFACTORY_CLI, "train", str(cfg)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return (out / "running_log.txt").read_text().splitlines()


def test_llamaboards_run_log_keeps_llamafactorys_lines_and_gets_the_findings_and_summary(tiny_model, tmp_path):
    """The quiet default once emptied running_log.txt (1 line); it must stay LLaMA-Factory's whole INFO log
    (about 276 lines for this run with the hook off) with our findings and summary added."""
    on = _board_log(tiny_model, tmp_path, "1")
    text = "\n".join(on)
    assert len(on) > 150, text[-2000:]
    assert "trainable params" in text  # LLaMA-Factory's own INFO line (model/loader.py), kept at its level
    assert "PRECISION_CPU_FP16" in text, text[-2000:]  # fp16 on a CPU: the finding is in the log
    assert "llamafactory-rocm: training summary" in text and "launch record" in text
    # the check's forecast block (as check --forecast says it) and the summary's forecast beside the run
    step = json.loads((tmp_path / "out-1" / "trainer_state.json").read_text())["global_step"]
    assert "  how (docs/forecast.md):" in text and f"  steps: {step} optimizer steps: " in text, text[-3000:]
    assert f"{step} steps (global_step {step})" in text and "forecast time  none for this machine" in text


def test_a_record_that_cannot_be_written_is_a_warning_and_the_resolved_config_still_trains(tiny_model, tmp_path):
    """Resolution apart from side effects: the record fails on rank 0, the rank trains the resolved config."""
    out = tmp_path / "out"
    config = tiny_train_config(tiny_model, out, **BLOG_KEYS)
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import llamafactory_rocm.check.record as record

            def refuse(*args, **kwargs):
                raise PermissionError(13, "Permission denied", "rocm_launch.json")

            record.write_launch_files = refuse
            from llamafactory.train.tuner import run_exp
            run_exp({config!r})
            """
        )
    )
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=offline_env(tmp_path), capture_output=True,
                            text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning: the launch record could not be written" in result.stderr
    assert_trained_in_bf16_and_learned(out)  # the blog config's fp16 was rewritten: what trained is resolved
    assert not list(out.glob("rocm_launch*.json"))


def test_a_resumed_run_is_said_before_and_counted_as_the_steps_this_process_ran(tiny_model, tmp_path):
    out = tmp_path / "out"
    first = write_config(tmp_path / "first.yaml", tiny_train_config(tiny_model, out, max_steps=4, save_steps=2))
    env = offline_env(tmp_path)
    done = subprocess.run(
        [LLAMAFACTORY_CLI, "train", str(first)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    longer = write_config(tmp_path / "longer.yaml", tiny_train_config(tiny_model, out, max_steps=6, save_steps=2))
    check = run_cli(["check", str(longer)], tmp_path, env)
    assert "RESUMES_FROM_CHECKPOINT" in check.stdout and "global step 4" in check.stdout, check.stdout[-3000:]
    assert "2 of 6 steps left" in check.stdout
    again = subprocess.run(
        [LLAMAFACTORY_CLI, "train", str(longer)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr[-3000:]
    text = again.stdout + again.stderr
    assert "steps          2 (resumed at step 4)" in text, text[-3000:]
    assert "forecast       6 steps for the whole run (global_step 6)" in text  # the check's, from step 0
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 6  # what transformers ran
