"""``prepare``: LLaMA-Factory's own preprocessing on CPU, counted, saved, and reused by a later train.

The oracle is stock LLaMA-Factory (hook off, a fresh process): what ``prepare`` saves must equal what its
``get_dataset`` saves for the same config, column by column and row by row; the counts must equal a count
made independently from stock LLaMA-Factory's own output with no cutoff."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm.dataset.prepare import prepare
from llamafactory_rocm.errors import UsageError
from tests.conftest import offline_env, run_cli, tiny_train_config

SHORT = [{"instruction": f"Hi {i}", "input": "", "output": "Yes."} for i in range(5)]
LONG = [{"instruction": "Tell me", "input": "", "output": "word " * 400} for _ in range(3)]  # far past 128 tokens
NO_OUTPUT = [{"instruction": "Lost", "input": "", "output": None} for _ in range(2)]
# Multi-turn: the first exchange alone fills cutoff_len 128, so LLaMA-Factory leaves the later turns out
# without ever passing them to infer_seqlen; the second conversation fits.
CHATS = [
    {"conversations": [
        {"from": "human", "value": "a " * 60}, {"from": "gpt", "value": "b " * 68},
        {"from": "human", "value": "more"}, {"from": "gpt", "value": "done"},
    ]},
    {"conversations": [
        {"from": "human", "value": "one"}, {"from": "gpt", "value": "two"},
        {"from": "human", "value": "three"}, {"from": "gpt", "value": "four"},
    ]},
]  # fmt: skip

PAIRS = [
    {"instruction": f"Q{i}", "input": "", "chosen": "good " * (5 + 100 * (i % 2)), "rejected": "bad"} for i in range(4)
]
PAIR_COLUMNS = {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"}

# The first lines of LLaMA-Factory's run_sft / run_dpo, as stock as it gets: its parser, tokenizer,
# template and get_dataset saving at tokenized_path. Run with the hook off, in its own process.
STOCK = """
import sys, json
from llamafactory.hparams import get_train_args
from llamafactory.model import load_tokenizer
from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
config = json.loads(sys.argv[1])
model_args, data_args, training_args, finetuning_args, _ = get_train_args(config)
tokenizer_module = load_tokenizer(model_args)
template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
get_dataset(template, model_args, data_args, training_args, stage=sys.argv[2], **tokenizer_module)
"""


def small_config(tiny_model: Path, tmp_path: Path, **extra: object) -> dict:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SHORT + LONG + NO_OUTPUT))
    (data / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CHATS))
    (data / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    (data / "text.jsonl").write_text("".join(json.dumps({"text": r["output"] or "x"}) + "\n" for r in SHORT + LONG))
    info = {
        "mine": {"file_name": "mine.jsonl"},
        "chat": {"file_name": "chat.jsonl", "formatting": "sharegpt"},
        "pairs": {"file_name": "pairs.jsonl", "ranking": True, "columns": PAIR_COLUMNS},
        "text": {
            "file_name": "text.jsonl",
            "columns": {"prompt": "text", "response": "text"},
        },  # prompt only: refused by the dataset check (report)
    }
    (data / "dataset_info.json").write_text(json.dumps(info))
    config = tiny_train_config(tiny_model, tmp_path / "out", dataset="mine", dataset_dir=str(data), max_steps=2)
    config.update(per_device_train_batch_size=2, gradient_accumulation_steps=2, **extra)
    return config


def stock_save(config: dict, tmp_path: Path, name: str, stage: str = "sft") -> Path:
    """Stock LLaMA-Factory's tokenize-and-save of ``config`` at tmp_path/name; returns the folder."""
    out = tmp_path / name
    drops = ("fp16", "bf16", "pure_bf16", "deepspeed")
    stock = {k: v for k, v in config.items() if k not in drops}
    stock.update(tokenized_path=str(out), overwrite_cache=True, output_dir=str(tmp_path / f"{name}-out"))
    stock.update(report_to="none", cache_dir=str(tmp_path / f"{name}-cache"))
    env = {**offline_env(tmp_path), "LLAMAFACTORY_ROCM": "0"}
    done = subprocess.run(
        [sys.executable, "-c", STOCK, json.dumps(stock), stage], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def rows(folder: Path | str) -> dict[str, dict[str, list]]:
    from datasets import load_from_disk

    saved = load_from_disk(str(folder))
    return {split: saved[split].to_dict() for split in sorted(saved)}


@pytest.mark.parametrize(
    ("extra", "stock_stage"),
    [
        ({}, "sft"),
        ({"packing": True}, "sft"),
        ({"dataset": "mine,chat", "val_size": 0.25}, "sft"),
        ({"stage": "dpo", "dataset": "pairs"}, "rm"),  # LLaMA-Factory's run_dpo passes stage="rm"
        ({"stage": "pt", "dataset": "text"}, "pt"),
    ],
    ids=["sft", "packing", "two-datasets-val", "dpo", "pt"],
)
def test_prepare_saves_what_stock_llamafactory_saves(tiny_model, tmp_path, monkeypatch, extra, stock_stage):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    config = small_config(tiny_model, tmp_path, **extra)
    result = prepare(config, tmp_path, tokenized_path=str(tmp_path / "ours"))
    assert result.ok, result.findings
    assert rows(result.tokenized_path) == rows(stock_save(config, tmp_path, "stock", stock_stage))
    if stock_stage == "rm":  # 2 of the 4 chosen answers are cut at 128
        assert (result.examples, result.kept, result.dropped, result.truncated) == (4, 4, 0, 2)
    if stock_stage == "pt":  # chunks of cutoff_len, not examples: truncation is not counted
        assert (result.examples, result.kept, result.truncated) == (8, 8, None)


@pytest.mark.parametrize("workers", [None, 2], ids=["in-process", "2-workers"])
def test_prepare_counts_equal_an_independent_count(tiny_model, tmp_path, monkeypatch, workers):
    """Independent: stock LLaMA-Factory with no cutoff gives every example's untruncated length."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    config = small_config(tiny_model, tmp_path, dataset="mine,chat", preprocessing_num_workers=workers)
    result = prepare(config, tmp_path, tokenized_path=str(tmp_path / "ours"))
    full = [
        len(ids) for ids in rows(stock_save({**config, "cutoff_len": 1 << 30}, tmp_path, "nocut"))["train"]["input_ids"]
    ]
    saved = rows(result.tokenized_path)["train"]["input_ids"]
    assert result.examples == len(SHORT + LONG + NO_OUTPUT + CHATS) == 12
    assert result.kept == len(full) == len(saved) == 10  # the two without an output are dropped
    assert result.dropped == 2
    assert result.truncated == sum(1 for n in full if n > 128) == 4  # 3 long answers, 1 conversation's turns
    assert result.tokens == sum(len(ids) for ids in saved)
    ordered = sorted(full)
    assert result.lengths == {
        p: ordered[max(0, math.ceil(len(ordered) * q / 100) - 1)] for p, q in (("p50", 50), ("p90", 90), ("p99", 99))
    } | {"max": ordered[-1]}
    assert result.datasets == [{"name": "mine", "examples": 10}, {"name": "chat", "examples": 2}]


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


def test_prepare_counts_packing_from_what_llamafactory_packs(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    config = small_config(tiny_model, tmp_path, packing=True)
    result = prepare(config, tmp_path)
    saved = rows(result.tokenized_path)["train"]["input_ids"]
    assert (result.examples, result.kept, result.dropped, result.truncated) == (10, 8, 2, 3)
    assert result.sequences == len(saved) < result.kept
    # LLaMA-Factory packs to cutoff_len - 1 and pads each sequence: the tokens packed, independently, are
    # those stock LLaMA-Factory keeps without packing at that cutoff
    unpacked = stock_save({**config, "packing": False, "cutoff_len": result.cutoff_len}, tmp_path, "unpacked")
    assert result.tokens == sum(len(ids) for ids in rows(unpacked)["train"]["input_ids"]) < sum(map(len, saved))


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


def test_prepare_prints_one_summary_and_no_token_dump(tiny_model, tmp_path):
    config = small_config(tiny_model, tmp_path)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(config))
    done = run_cli(["prepare", str(cfg), f"tokenized_path={tmp_path / 'tok'}"], tmp_path, offline_env(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout.splitlines()
    assert [line.split(":")[0] for line in out[:-5]] == ["[warning] DATASET_ROWS_DROPPED"], out  # which rows
    assert out[-5].startswith("prepared 10 examples: 8 kept, 2 dropped, 3 truncated by cutoff_len (at 128 tokens)")
    assert out[-1].startswith(f"next: llamafactory-rocm train {cfg} tokenized_path={tmp_path / 'tok'}")
    assert len(out) == 6, out
    both = done.stdout + done.stderr
    for noise in ("input_ids", "label_ids", "Running tokenizer", "Dropped invalid example:", "%|"):
        assert noise not in both, both
    verbose = run_cli(["prepare", str(cfg), "tokenized_path=tok2", "--verbose"], tmp_path, offline_env(tmp_path))
    assert verbose.returncode == 0 and "input_ids" in verbose.stderr and len(verbose.stdout.splitlines()) <= 6


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
