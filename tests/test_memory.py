"""The memory estimator: exact parameter counts, monotone in the knobs, calibrated to published figures."""

from __future__ import annotations

import pytest

from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.findings import Level
from llamafactory_rocm.lf.memory import (
    TrainingShape,
    estimate,
    estimate_config,
    model_config_for,
    shape_and_count,
)
from llamafactory_rocm.presets import load

LLAMA3 = "meta-llama/Meta-Llama-3-8B-Instruct"


def transformers_count(hub_id: str) -> int:
    """The oracle: transformers' own model for the shipped config.json, built on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = model_config_for(hub_id)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg)).num_parameters()


def test_llama3_8b_has_8_03_billion_parameters():
    _, n = shape_and_count(model_config_for(LLAMA3))
    assert n == transformers_count(LLAMA3) == 8_030_261_248  # Meta's model card: 8.03B


def test_qwen3_counts_include_qk_norm_and_tied_embeddings():
    _, n8 = shape_and_count(model_config_for("Qwen/Qwen3-8B"))
    assert n8 == transformers_count("Qwen/Qwen3-8B")
    _, n4 = shape_and_count(model_config_for("Qwen/Qwen3-4B"))
    assert n4 == transformers_count("Qwen/Qwen3-4B")
    assert round(n8 / 1e9, 2) == 8.19 and round(n4 / 1e9, 2) == 4.02


def test_tiny_model_count_matches_the_real_module(tiny_model):
    from transformers import AutoModelForCausalLM

    real = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_model).parameters())
    _, n = shape_and_count(model_config_for(str(tiny_model)))
    assert n == real


def test_torchtune_llama31_8b_lora_lands_within_10_percent_of_16_2_gib():
    # torchtune README: batch 2, packed seq 2048, activation checkpointing, rank 8, chunked loss.
    cfg = {"model_name_or_path": "meta-llama/Llama-3.1-8B", "bf16": True, "lora_rank": 8,
           "per_device_train_batch_size": 2, "cutoff_len": 2048, "enable_liger_kernel": True}  # fmt: skip
    assert estimate_config(cfg).total_gib == pytest.approx(16.2, rel=0.10)


def test_bf16_weights_alone_are_14_96_gib():
    est = estimate_config({"model_name_or_path": LLAMA3, "bf16": True})
    assert est.weights_gib == pytest.approx(14.96, abs=0.01)


def test_qlora_4bit_roughly_thirds_the_weights():
    base = estimate_config({"model_name_or_path": LLAMA3, "bf16": True})
    q4 = estimate_config({"model_name_or_path": LLAMA3, "bf16": True, "quantization_bit": 4})
    assert q4.weights_gib < 0.4 * base.weights_gib


@pytest.mark.parametrize(
    ("knob", "values"),
    [
        ("per_device_train_batch_size", [1, 2, 4, 8]),
        ("cutoff_len", [512, 1024, 2048, 4096]),
        ("lora_rank", [4, 8, 16, 64]),
    ],
)
def test_estimate_grows_with_batch_cutoff_and_rank(knob, values):
    totals = [estimate_config({"model_name_or_path": LLAMA3, "bf16": True, knob: v}).total_gib for v in values]
    assert totals == sorted(totals) and len(set(totals)) == len(totals)


def test_checkpointing_and_zero3_sharding_lower_the_estimate():
    shape, n = shape_and_count(model_config_for(LLAMA3))
    on = estimate(shape, n, TrainingShape(gradient_checkpointing=True)).total_gib
    off = estimate(shape, n, TrainingShape(gradient_checkpointing=False)).total_gib
    assert off > on
    z3 = estimate(shape, n, TrainingShape(method="full", zero_stage=3, world_size=8))
    plain = estimate(shape, n, TrainingShape(method="full"))
    assert z3.weights_gib == pytest.approx(plain.weights_gib / 8)
    assert plain.trainable_state_gib + plain.weights_gib == pytest.approx(18 * n / 2**30, rel=0.01)


def test_check_on_rx7900xtx_with_a_batch_that_cannot_fit_is_refused_naming_one_that_does():
    cfg = load("rx7900xtx_llama3_lora", overrides={"per_device_train_batch_size": 8})
    report = check_config(cfg, gpu="rx7900xtx")
    (over,) = [f for f in report.findings if f.code == "MEMORY_OVER_DEVICE"]
    assert over.level is Level.ERROR and not report.ok
    assert over.new == 1 and "per_device_train_batch_size: 1" in over.fix
    fitted = check_config({**cfg, "per_device_train_batch_size": over.new}, gpu="rx7900xtx")
    assert fitted.ok and not [f for f in fitted.findings if f.code.startswith("MEMORY_OVER")]


def test_between_90_and_100_percent_of_the_device_is_a_warning():
    cfg = load("rx7900xtx_llama3_lora", overrides={"cutoff_len": 4096})  # about 22.4 of 24 GiB
    report = check_config(cfg, gpu="rx7900xtx")
    (warn,) = [f for f in report.findings if f.code == "MEMORY_OVER_BUDGET"]
    assert warn.level is Level.WARNING and report.ok


def test_when_no_batch_fits_it_points_at_qlora():
    cfg = load("rx7900xtx_llama3_lora", overrides={"per_device_train_batch_size": 1, "cutoff_len": 8192})
    (over,) = [f for f in check_config(cfg, gpu="rx7900xtx").findings if f.code == "MEMORY_OVER_DEVICE"]
    assert over.new is None and "quantization_bit: 4" in over.fix


def test_a_memory_refusal_accepted_knowingly_is_shown_and_goes_ahead():
    cfg = load("rx7900xtx_llama3_lora", overrides={"per_device_train_batch_size": 8})
    report = check_config(cfg, gpu="rx7900xtx", accept="MEMORY_OVER_DEVICE")
    assert report.ok
    (over,) = [f for f in report.findings if f.code == "MEMORY_OVER_DEVICE"]
    assert over.level is Level.WARNING and over.message.startswith("(accepted)")
    assert [f.new for f in report.findings if f.code == "FINDING_ACCEPTED"] == [["MEMORY_OVER_DEVICE"]]


def test_unknown_model_gives_no_estimate():
    assert estimate_config({"model_name_or_path": "someone/unknown-model"}) is None


NOT_NUMBERS = [("cutoff_len", "abc"), ("lora_rank", [8]), ("per_device_train_batch_size", 1e400)]


@pytest.mark.parametrize("key, value", NOT_NUMBERS)
def test_a_value_that_is_not_a_number_gives_no_estimate_and_no_crash(key, value):
    """LLaMA-Factory's own parser refuses it, naming the key; the check neither guesses nor crashes."""
    cfg = load("rx7900xtx_llama3_lora", overrides={key: value})
    assert estimate_config(cfg) is None
    codes = [f.code for f in check_config(cfg, gpu="rx7900xtx").findings]
    assert not [code for code in codes if code.startswith("MEMORY_")]


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"hidden_size": 8}', '{"num_attention_heads": 0}'])
def test_a_broken_config_json_in_the_model_folder_gives_no_estimate(tmp_path, text):
    (tmp_path / "config.json").write_text(text)
    assert estimate_config({"model_name_or_path": str(tmp_path)}) is None


def test_the_defaults_the_estimate_uses_are_llamafactorys_own_field_defaults():
    """What a config leaves out is read from LLaMA-Factory's argument dataclasses; the class defaults (used
    by the calibration tests) are pinned to the same fields, so a release that changes one fails here."""
    import dataclasses

    from llamafactory.hparams.parser import _TRAIN_ARGS

    lf = {f.name: f.default for cls in _TRAIN_ARGS for f in dataclasses.fields(cls)}
    plain = TrainingShape()
    assert plain.lora_rank == lf["lora_rank"] and plain.batch == lf["per_device_train_batch_size"]
    assert plain.cutoff_len == lf["cutoff_len"] and plain.freeze_layers == lf["freeze_trainable_layers"]
    assert plain.gradient_checkpointing is not lf["disable_gradient_checkpointing"]
    assert plain.method == lf["finetuning_type"] and lf["lora_target"] == "all"
    assert plain.fused_loss is lf["enable_liger_kernel"] and plain.quantization_bit is lf["quantization_bit"]
    read = TrainingShape.from_config({})
    assert (read.lora_rank, read.batch, read.cutoff_len) == (
        lf["lora_rank"],
        lf["per_device_train_batch_size"],
        lf["cutoff_len"],
    )


def test_a_model_in_the_hugging_face_cache_is_read_by_transformers(tmp_path, monkeypatch):
    """model_config_for asks AutoConfig.from_pretrained(local_files_only=True): a config.json in the HF
    cache is found by its hub id, as the launch will find it, without the network."""
    import json

    from huggingface_hub.constants import REPO_ID_SEPARATOR

    cache = tmp_path / "hub"
    snapshot = cache / f"models{REPO_ID_SEPARATOR}someone{REPO_ID_SEPARATOR}tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    shape = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    shape |= {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}
    (snapshot / "config.json").write_text(json.dumps(shape))
    found = model_config_for("someone/tiny", cache_dir=str(cache))
    assert found is not None and found["hidden_size"] == 64 and found["num_key_value_heads"] == 2
    assert model_config_for("someone/tiny") is None  # not in the default cache, not shipped
    assert model_config_for(LLAMA3)["hidden_size"] == 4096  # not cached: the shipped shapes


def test_llamafactory_loads_the_checkpoints_own_dtype():
    """The premise of checkpoint_weight_bytes, pinned to LLaMA-Factory's line: load_model asks for
    torch_dtype="auto" (the checkpoint's dtype), whatever bf16/fp16 say."""
    import inspect

    from llamafactory_rocm.lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.model import loader
    assert 'init_kwargs["torch_dtype"] = "auto"' in inspect.getsource(loader.load_model)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_frozen_weights_are_counted_in_the_dtype_llamafactory_loads_them_in(tiny_model, tmp_path, dtype):
    """The oracle is LLaMA-Factory's own load_model (LoRA, no bf16/fp16 key): the frozen base weights'
    element size is what the estimate counts."""
    import json
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from llamafactory_rocm.lf.memory import checkpoint_weight_bytes
    from llamafactory_rocm.lf.text_only import text_only_llamafactory

    folder = tmp_path / dtype
    shutil.copytree(tiny_model, folder)
    AutoModelForCausalLM.from_pretrained(tiny_model, dtype=getattr(torch, dtype)).save_pretrained(folder)
    with text_only_llamafactory():
        from llamafactory.hparams import get_train_args
        from llamafactory.model import load_model, load_tokenizer
    args = {"model_name_or_path": str(folder), "stage": "sft", "do_train": True, "finetuning_type": "lora"}
    args.update(output_dir=str(tmp_path / "out"), template="default", dataset="x")
    model_args, _, _, finetuning_args, _ = get_train_args(args)
    tokenizer = load_tokenizer(model_args)["tokenizer"]
    model = load_model(tokenizer, model_args, finetuning_args, is_trainable=True)
    frozen = next(p for n, p in model.named_parameters() if not p.requires_grad and "embed_tokens" in n)
    assert frozen.element_size() == checkpoint_weight_bytes(json.loads((folder / "config.json").read_text()))


def test_a_lora_run_without_precision_keys_counts_half_precision_weights_for_a_bf16_checkpoint():
    from llamafactory_rocm.lf.memory import checkpoint_weight_bytes, shipped_models

    llama = shipped_models()["meta-llama/meta-llama-3-8b-instruct"]
    shape, parameters = shape_and_count(llama)
    plain = TrainingShape.from_config({"finetuning_type": "lora"}, 1, checkpoint_weight_bytes(llama))
    assert estimate(shape, parameters, plain).weights_gib == pytest.approx(parameters * 2 / 2**30)
    assert checkpoint_weight_bytes({"torch_dtype": "float32"}) == 4
    assert checkpoint_weight_bytes({"dtype": "float16"}) == 2 and checkpoint_weight_bytes({}) == 2
