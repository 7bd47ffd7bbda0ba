"""Memory of the models a workflow holds besides the policy, and of QLoRA's weights (issue 28 item 1).

Oracles, none the estimator's code: transformers' own model for each config on the meta device (its
``num_parameters`` and the bytes of its parameters) beside the real policy LLaMA-Factory's ``load_model`` builds
(the bytes of its parameters: tests/test_memory_oracle.py ``lf_model``); for QLoRA, the modules transformers'
``replace_with_bnb_linear`` would swap (``type(m) is nn.Linear``, less ``get_keys_to_not_convert``), each
stored as bitsandbytes' ``quantize_4bit`` stores it, per tensor; LLaMA-Factory's own
``FinetuningArguments.use_ref_model`` and ``PairwiseDataCollatorWithPadding`` for the reference forward and
the chosen + rejected batch. The installed LLaMA-Factory line decides (.venv: 0.9.5, .venv-main: main).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from llamafactory_rocm.lf.dry_run import dry_launch
from llamafactory_rocm.lf.memory import TrainingShape, model_config_for
from llamafactory_rocm.resources import datasets_dir
from llamafactory_rocm.rules import memory_fit
from tests.conftest import make_ctx
from tests.test_memory_built import lora_config, shape_folder
from tests.test_memory_oracle import lf_model


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def meta_model(folder: Path):
    """transformers' model class for the config (image-text where it has one), on meta."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(folder)
    cls = AutoModelForImageTextToText if type(config) in AutoModelForImageTextToText._model_mapping else None
    with torch.device("meta"):
        return (cls or AutoModelForCausalLM).from_config(config)


def bnb_4bit_bytes(numel: int) -> int:
    """bitsandbytes functional.quantize_4bit (blocksize 64, compress_statistics=True as LLaMA-Factory's
    double_quantization default): packed ``(n + 1) // 2`` bytes, one absmax per block of 64 re-quantized to
    uint8 by ``quantize_blockwise(absmax, blocksize=256)`` (one fp32 absmax per 256) plus the fp32 offset.
    Written from bitsandbytes' source, not called: bitsandbytes is not installed here (``import bitsandbytes``:
    ModuleNotFoundError in .venv), and its quantize_4bit needs a GPU build to run."""
    blocks = math.ceil(numel / 64)
    return (numel + 1) // 2 + blocks + 4 * math.ceil(blocks / 256) + 4


def estimate_for(config: dict, folder: Path, built) -> object:
    ctx = replace(make_ctx("mi300x"), model_config=model_config_for(str(folder)), built_model=built)
    return memory_fit.plan_estimate(config, {}, ctx)


@pytest.mark.parametrize("name", ["llama4_defaults", "qwen3_30b_a3b"])
def test_qlora_weights_are_quantized_linears_and_everything_else_in_its_dtype(name, tiny_model, tmp_path):
    """Llama 4 Scout and Qwen3-30B-A3B keep their experts as fused 3-D parameters in transformers 5
    (Llama4TextExperts, Qwen3MoeExperts): bitsandbytes quantizes nn.Linear only, so they stay in bf16."""
    import torch
    from transformers.quantizers.base import get_keys_to_not_convert
    from transformers.quantizers.quantizers_utils import should_convert_module

    folder = shape_folder(name, tiny_model, tmp_path)
    model = meta_model(folder)
    skip = get_keys_to_not_convert(model)
    swapped = {
        id(m.weight) for n, m in model.named_modules() if type(m) is torch.nn.Linear and should_convert_module(n, skip)
    }
    oracle = sum(
        bnb_4bit_bytes(p.numel()) if id(p) in swapped else p.numel() * p.element_size() for p in model.parameters()
    )
    fused = sum(p.numel() * p.element_size() for p in model.parameters() if p.dim() == 3)
    assert fused > oracle / 2  # most of the bytes are the fused experts, left in bf16

    config = lora_config(folder, tmp_path / "out", quantization_bit=4)
    run = dry_launch(config)  # bitsandbytes is not installed here: refused, and still counted
    assert run.built is not None, run.findings
    est = estimate_for(config, folder, run.built)
    assert est.weights_gib * 2**30 == pytest.approx(oracle, rel=1e-3)


def _pairs_and_kto(into: Path) -> Path:
    rows = json.loads((datasets_dir() / "amd_finetune_qa.json").read_text(encoding="utf-8"))[:8]
    base = [{"instruction": r["instruction"], "input": r.get("input", "")} for r in rows]
    data = into / "data"
    data.mkdir()
    pairs = [{**b, "chosen": r["output"], "rejected": "No."} for b, r in zip(base, rows, strict=True)]
    kto = [{**b, "output": r["output"], "label": i % 2 == 0} for i, (b, r) in enumerate(zip(base, rows, strict=True))]
    (data / "pairs.json").write_text(json.dumps(pairs), encoding="utf-8")
    (data / "kto.json").write_text(json.dumps(kto), encoding="utf-8")
    columns = {"prompt": "instruction", "query": "input"}
    info = {
        "pairs": {"file_name": "pairs.json", "ranking": True, "columns": {**columns, "chosen": "chosen",
                  "rejected": "rejected"}},
        "kto": {"file_name": "kto.json", "columns": {**columns, "response": "output", "kto_tag": "label"}},
        "qa": {"file_name": str(datasets_dir() / "amd_finetune_qa.json"), "columns": {**columns, "response": "output"}},
    }  # fmt: skip
    (data / "dataset_info.json").write_text(json.dumps(info), encoding="utf-8")
    return data


# (stage, finetuning_type, extra keys; "MODEL": the tiny model's folder) -> the models built beside the policy.
# trainer_utils.py create_ref_model: no ref_model and LoRA -> None (DPO disables the adapter instead); full or
# freeze -> a frozen copy of the policy; a ref_model -> that model. create_reward_model: reward_model_type full
# -> load_model(reward_model, is_trainable=False, add_valuehead=True).
WORKFLOWS = {
    "dpo_lora": ("dpo", "lora", {}, ()),
    "dpo_lora_ref_model": ("dpo", "lora", {"ref_model": "MODEL"}, ("reference",)),
    "dpo_full": ("dpo", "full", {}, ("reference",)),
    "kto_freeze": ("kto", "freeze", {}, ("reference",)),
    "ppo_lora": ("ppo", "lora", {"reward_model": "MODEL", "reward_model_type": "full"}, ("reward",)),
    "ppo_full": ("ppo", "full", {"reward_model": "MODEL", "reward_model_type": "full"}, ("reference", "reward")),
}


@pytest.mark.parametrize("case", list(WORKFLOWS))
def test_reference_and_reward_models_count_at_the_dtype_they_load(case, tiny_model, tmp_path):
    stage, method, extra, roles = WORKFLOWS[case]
    data = _pairs_and_kto(tmp_path)
    extra = {k: (str(tiny_model) if v == "MODEL" else v) for k, v in extra.items()}
    dataset = {"dpo": "pairs", "kto": "kto", "ppo": "qa"}[stage]
    config = lora_config(tiny_model, tmp_path / "out", stage=stage, finetuning_type=method, dataset=dataset,
                         dataset_dir=str(data), **extra)  # fmt: skip
    run = dry_launch(config)
    # ppo: LLaMA-Factory's trainer pins trl<=0.9.6 (STAGE_PACKAGE_VERSION here); the models are built before it
    errors = [f.message for f in run.findings if f.level.name == "ERROR" and f.code != "STAGE_PACKAGE_VERSION"]
    assert not errors
    assert run.built is not None
    assert tuple(o.role for o in run.built.others) == roles
    oracle = meta_model(tiny_model)  # the checkpoint as from_pretrained(torch_dtype="auto") loads it
    bytes_ = sum(p.numel() * p.element_size() for p in oracle.parameters())
    head = oracle.config.hidden_size + 1 if stage == "ppo" else 0  # trl's ValueHead: nn.Linear(hidden, 1)
    for other in run.built.others:  # ppo: create_ref_model(..., add_valuehead=True), create_reward_model
        assert other.memory.trainable_parameters == 0  # load_model(..., is_trainable=False)
        assert other.memory.parameters == oracle.num_parameters() + head
        assert bytes_ + 2 * head <= other.memory.frozen_bytes <= bytes_ + 4 * head  # the head in bf16 or fp32
    # the policy: the real model LLaMA-Factory's load_model builds for this config (the adapter, the fp32 upcast
    # of what trains, ppo's value head), its parameters' bytes; beside it, the models above
    policy = lf_model(config, add_valuehead=stage == "ppo")
    policy_bytes = sum(p.numel() * p.element_size() for p in policy.parameters())
    est = estimate_for(config, tiny_model, run.built).weights_gib * 2**30
    low, high = policy_bytes + len(roles) * (bytes_ + 2 * head), policy_bytes + len(roles) * (bytes_ + 4 * head)
    assert low <= est <= high, (est, low, high)


@pytest.mark.parametrize("pref_loss", ["sigmoid", "hinge", "ipo", "kto_pair", "orpo", "simpo"])
def test_the_reference_forward_is_llamafactorys_use_ref_model(pref_loss):
    from llamafactory.hparams import FinetuningArguments

    lf = FinetuningArguments(stage="dpo", pref_loss=pref_loss).use_ref_model
    assert TrainingShape(stage="dpo", pref_loss=pref_loss).reference_forward is lf


def test_dpo_activations_follow_the_pairwise_collators_batch(tiny_model):
    """PairwiseDataCollatorWithPadding (train/dpo/workflow.py) puts chosen and rejected in one batch."""
    from llamafactory.data import PairwiseDataCollatorWithPadding, get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template="default"))
    ids = [5, 6, 7, 8]
    feature = {f"{k}_{part}": ids if part != "attention_mask" else [1] * 4 for k in ("chosen", "rejected")
               for part in ("input_ids", "attention_mask", "labels")}  # fmt: skip
    features = [{**feature, "images": [], "videos": [], "audios": []} for _ in range(3)]
    batch = PairwiseDataCollatorWithPadding(template=template, tokenizer=tokenizer, processor=None)(features)
    sequences_per_example = batch["input_ids"].shape[0] / len(features)

    from llamafactory_rocm.lf.memory import ModelShape, activation_and_logit_bytes, shape_and_count

    shape, _ = shape_and_count(model_config_for("meta-llama/Meta-Llama-3-8B-Instruct"))
    assert isinstance(shape, ModelShape)
    sft, _ = activation_and_logit_bytes(shape, TrainingShape(batch=3))
    dpo, _ = activation_and_logit_bytes(shape, TrainingShape(batch=3, stage="dpo"))
    assert dpo / sft == sequences_per_example == 2
