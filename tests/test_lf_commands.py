"""lf.commands: the command a config is for, and LLaMA-Factory's own parser for it (oracle: LLaMA-Factory)."""

from __future__ import annotations

import pytest

from llamafactory_rocm.lf.commands import (
    backend_requirements,
    command_keys,
    command_verdict,
    infer_command,
    lf_field_default,
    predict_requirements,
    unknown_keys,
)
from llamafactory_rocm.lf.text_only import text_only_llamafactory
from llamafactory_rocm.lf.verdict import DeviceAnswers

with text_only_llamafactory():
    from llamafactory.hparams import ModelArguments, get_eval_args, get_infer_args, get_train_args

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"
CHAT = {"model_name_or_path": MODEL, "adapter_name_or_path": "saves/llama3-8b/lora/sft", "template": "llama3"}
MI300X = DeviceAnswers("mi300x", bf16=True, tf32=False)


@pytest.mark.parametrize(
    ("config", "command"),
    [
        (CHAT, "chat"),
        ({**CHAT, "infer_backend": "vllm"}, "chat"),
        ({**CHAT, "export_dir": "models/merged"}, "export"),
        ({**CHAT, "export_dir": "models/merged", "infer_backend": "huggingface"}, "export"),
        ({**CHAT, "stage": "sft", "do_train": True, "output_dir": "saves/x"}, "train"),
        ({"model_name_or_path": MODEL, "stage": "sft"}, "train"),
        ({**CHAT, "task": "mmlu_test", "n_shot": 5, "save_dir": "saves/eval"}, "eval"),
        ({**CHAT, "do_train": True, "export_dir": "models/merged"}, None),
        ({**CHAT, "infer_backend": "vllm", "per_device_train_batch_size": 2}, None),
        ({"model_name_or_path": MODEL}, None),
    ],
)
def test_infer_command(config, command):
    assert infer_command(config) == command


def test_command_keys_are_what_each_parser_accepts():
    # oracle: LLaMA-Factory's parsers themselves refuse a key of another command and accept their own
    assert "do_train" in command_keys("train") and "do_train" not in command_keys("export")
    assert "task" in command_keys("eval") and "task" not in command_keys("chat")
    assert command_keys("chat") == command_keys("api") == command_keys("webchat") == command_keys("export")
    assert unknown_keys({**CHAT, "do_train": True, "output_dir": "x"}, "export") == ["do_train", "output_dir"]
    with pytest.raises(ValueError, match="do_train"):
        get_infer_args({**CHAT, "do_train": True})
    get_infer_args({**CHAT, **{k: None for k in ("export_dir", "infer_dtype") if k in command_keys("chat")}})


def test_a_training_key_in_an_export_config_is_refused_in_llamafactorys_words():
    config = {**CHAT, "export_dir": "models/merged", "do_train": True, "output_dir": "saves/x"}
    verdict = command_verdict(config, "export")
    with pytest.raises(ValueError) as stock:
        get_infer_args(dict(config))
    assert not verdict.accepted and verdict.message == " ".join(str(stock.value).split())


def test_export_runs_export_models_own_checks_before_loading():
    verdict = command_verdict(CHAT, "export")  # no export_dir: export_model's first check
    assert not verdict.accepted and "export_dir" in verdict.message
    assert command_verdict({**CHAT, "export_dir": "models/merged"}, "export").accepted


def test_a_chat_config_planned_for_an_mi300x_is_not_refused():
    assert command_verdict({**CHAT, "infer_backend": "huggingface"}, "chat", MI300X).accepted
    assert command_verdict({**CHAT, "infer_backend": "vllm"}, "chat", MI300X).accepted
    assert command_verdict({**CHAT, "infer_backend": "vllm"}, "api", MI300X).accepted


def test_vllm_missing_here_is_llamafactorys_own_refusal():
    verdict = command_verdict({**CHAT, "infer_backend": "vllm"}, "chat")
    assert not verdict.accepted and "vllm" in verdict.message


def test_planning_keeps_the_vllm_checks_that_do_not_need_vllm():
    verdict = command_verdict({**CHAT, "infer_backend": "vllm", "quantization_bit": 4}, "chat", MI300X)
    with pytest.raises(ValueError) as stock:
        get_infer_args({**CHAT, "infer_backend": "vllm", "quantization_bit": 4})
    assert not verdict.accepted and verdict.message == str(stock.value)


def test_eval_uses_get_eval_args():
    config = {**CHAT, "task": "mmlu_test", "save_dir": "saves/eval", "infer_backend": "vllm"}
    with pytest.raises(ValueError) as stock:
        get_eval_args(dict(config))
    verdict = command_verdict(config, "eval", MI300X)
    assert not verdict.accepted and verdict.message == str(stock.value)


def test_unknown_command():
    with pytest.raises(ValueError, match="unknown command"):
        command_verdict(CHAT, "serve")


def test_values_read_from_llamafactory():
    assert lf_field_default("vllm_max_lora_rank") == ModelArguments(model_name_or_path="m").vllm_max_lora_rank
    assert lf_field_default("export_device") == ModelArguments(model_name_or_path="m").export_device
    assert ("vllm", True) in backend_requirements("vllm")
    assert ("sglang", True) in backend_requirements("sglang")


def test_predict_requirements_are_what_get_train_args_asks_for():
    needed = predict_requirements()
    assert needed  # 0.9.5: jieba, nltk, rouge_chinese
    config = {
        "model_name_or_path": MODEL,
        "stage": "sft",
        "do_predict": True,
        "predict_with_generate": True,
        "eval_dataset": "alpaca_en_demo",
        "finetuning_type": "lora",
        "template": "llama3",
        "output_dir": "saves/does-not-exist",
    }
    with pytest.raises(Exception) as stock:  # oracle: the real parser refuses, naming the first missing one
        get_train_args(config)
    assert needed[0] in str(stock.value)
