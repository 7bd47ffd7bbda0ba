"""``prepare``: LLaMA-Factory's own preprocessing on CPU, counted, saved, and reused by a later train."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm.dataset.prepare import prepare
from llamafactory_rocm.errors import UsageError
from tests.conftest import offline_env, run_cli, tiny_train_config

SHORT = [{"instruction": f"Hi {i}", "input": "", "output": "Yes."} for i in range(5)]
LONG = [{"instruction": "Tell me", "input": "", "output": "word " * 400} for _ in range(3)]  # far past 128 tokens
NO_OUTPUT = [{"instruction": "Lost", "input": "", "output": None} for _ in range(2)]


def small_config(tiny_model: Path, tmp_path: Path, **extra: object) -> dict:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SHORT + LONG + NO_OUTPUT))
    (data / "dataset_info.json").write_text(json.dumps({"mine": {"file_name": "mine.jsonl"}}))
    config = tiny_train_config(tiny_model, tmp_path / "out", dataset="mine", dataset_dir=str(data), max_steps=2)
    config.update(per_device_train_batch_size=2, gradient_accumulation_steps=2, **extra)
    return config


def test_prepare_counts_against_a_hand_count(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    result = prepare(small_config(tiny_model, tmp_path), tmp_path, world_size=2)
    # by hand: 10 rows, 2 without an output (dropped), 3 of 400 words (truncated at cutoff_len 128)
    assert (result.examples, result.kept, result.dropped, result.truncated) == (10, 8, 2, 3)
    assert result.ok and result.lengths["max"] > 128 >= result.lengths["p50"]
    assert 0 < result.tokens <= 8 * 128
    assert result.steps_per_epoch == 1  # 8 examples / (2 per device x 2 GPUs) = 2 batches, 2 accumulated
    assert Path(result.tokenized_path, "dataset_dict.json").is_file()
    with pytest.raises(UsageError, match="--force"):
        prepare(small_config(tiny_model, tmp_path), tmp_path, tokenized_path=result.tokenized_path)


def test_prepare_warns_when_the_models_chat_template_disagrees(tiny_model, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    tok = json.loads((model / "tokenizer_config.json").read_text())
    tok["chat_template"] = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    (model / "tokenizer_config.json").write_text(json.dumps(tok))
    result = prepare(small_config(model, tmp_path), tmp_path)
    assert any("disagree" in w for w in result.warnings)


@pytest.mark.trainer
def test_train_reuses_what_prepare_saved(tiny_model, tmp_path):
    env = {**offline_env(tmp_path), "LLAMAFACTORY_VERBOSITY": "INFO"}  # its 'Loaded tokenized dataset' line
    config = small_config(tiny_model, tmp_path, tokenized_path=str(tmp_path / "tok"))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(config))
    prepared = run_cli(["prepare", str(cfg), "--json"], tmp_path, env)
    assert prepared.returncode == 0, prepared.stderr[-2000:]
    assert json.loads(prepared.stdout)["tokenized_path"] == str(tmp_path / "tok")
    trained = run_cli(["train", str(cfg)], tmp_path, env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    log = trained.stdout + trained.stderr
    assert f"Loaded tokenized dataset from {tmp_path / 'tok'}" in log
    assert "Running tokenizer on dataset" not in log
