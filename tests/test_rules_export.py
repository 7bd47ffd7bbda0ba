"""rules.export: merging into a quantized model, and export_device: auto against the device.

Oracles: LLaMA-Factory's real ``export_model`` on the tiny model with a PEFT adapter, and its source line.
"""

from __future__ import annotations

import inspect
import json

import pytest

from llamafactory_rocm.lf.commands import EXPORT as EXPORT_CHAIN
from llamafactory_rocm.lf.text_only import text_only_llamafactory
from llamafactory_rocm.rules import export as export_rules
from llamafactory_rocm.rules import module_rules
from llamafactory_rocm.rules.export import export_memory, refuse_merge_into_quantized
from tests.after_training_helpers import peft_adapter
from tests.conftest import make_ctx

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"
EXPORT = {"model_name_or_path": MODEL, "adapter_name_or_path": "saves/lora", "template": "llama3", "export_dir": "out"}


def codes(step):
    return {f.code: f for f in step.findings}


def test_quantization_bit_in_an_export_config_is_refused():
    found = codes(refuse_merge_into_quantized({**EXPORT, "quantization_bit": 4}, {}, make_ctx("mi300x")))
    finding = found["MERGE_INTO_QUANTIZED"]
    assert finding.level.value == "error" and finding.key == "quantization_bit" and "quantization_bit" in finding.fix


@pytest.mark.parametrize(
    "config",
    [
        {**EXPORT, "quantization_bit": None},
        {k: v for k, v in EXPORT.items() if k != "adapter_name_or_path"} | {"quantization_bit": 4},  # no adapter
        {k: v for k, v in EXPORT.items() if k != "export_dir"} | {"quantization_bit": 4},  # chat, not export
    ],
)
def test_no_refusal_without_all_three(config):
    assert not refuse_merge_into_quantized(config, {}, make_ctx("mi300x")).findings


def test_a_prequantized_checkpoint_is_refused_too(tmp_path):
    model = tmp_path / "gptq"
    model.mkdir()
    quantized = {"model_type": "llama", "quantization_config": {"quant_method": "gptq", "bits": 4}}
    (model / "config.json").write_text(json.dumps(quantized))
    found = codes(refuse_merge_into_quantized({**EXPORT, "model_name_or_path": str(model)}, {}, make_ctx("mi300x")))
    assert found["MERGE_INTO_QUANTIZED"].key == "model_name_or_path"


def _tuner():
    with text_only_llamafactory():
        from llamafactory.train import tuner
    return tuner


def _stock_export(tuner):
    """LLaMA-Factory's own export_model: in this process the hook wraps it (train/after.py), and these tests
    pin what stock LLaMA-Factory does."""
    return inspect.unwrap(tuner.export_model)


def test_llamafactory_still_refuses_to_merge_into_a_quantized_model():
    # the line the rule mirrors (llamafactory/train/tuner.py, export_model)
    source = inspect.getsource(_tuner().export_model)
    assert 'raise ValueError("Cannot merge adapters to a quantized model.")' in source
    assert 'getattr(model, "quantization_method", None) is not None and model_args.adapter_name_or_path' in source


@pytest.fixture(scope="module")
def adapter(tiny_model, tmp_path_factory):
    return peft_adapter(tiny_model, tmp_path_factory.mktemp("adapter") / "lora")


def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


def test_stock_export_model_merges_the_adapter_the_rule_lets_through(tiny_model, adapter, tmp_path, monkeypatch):
    _offline(monkeypatch, tmp_path)
    config = {
        "model_name_or_path": str(tiny_model),
        "adapter_name_or_path": str(adapter),
        "template": "llama3",
        "export_dir": str(tmp_path / "merged"),
    }
    assert not any(rule(config, {}, make_ctx("mi300x")).findings for rule in module_rules(export_rules, EXPORT_CHAIN))
    _stock_export(_tuner())(dict(config))
    assert (tmp_path / "merged" / "config.json").is_file()
    assert list((tmp_path / "merged").glob("*.safetensors"))


def test_stock_export_model_stops_where_the_rule_refuses(tiny_model, adapter, tmp_path, monkeypatch):
    """The rule's config through LLaMA-Factory's real export_model.

    On this CPU machine LLaMA-Factory first asks for bitsandbytes while loading (what users saw reported
    alone); with the model loaded as quantized, its own check stops the merge with the rule's reason.
    """
    _offline(monkeypatch, tmp_path)
    tuner = _tuner()
    config = {
        "model_name_or_path": str(tiny_model),
        "adapter_name_or_path": str(adapter),
        "template": "llama3",
        "export_dir": str(tmp_path / "merged"),
        "quantization_bit": 4,
    }
    assert codes(refuse_merge_into_quantized(config, {}, make_ctx("mi300x")))["MERGE_INTO_QUANTIZED"]
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="bitsandbytes"):
            _stock_export(tuner)(dict(config))
    loaded = tuner.load_model

    def load_quantized(*args, **kwargs):  # what load_model returns when bitsandbytes quantized it
        model = loaded(*args, **kwargs)
        model.quantization_method = "bitsandbytes"
        return model

    monkeypatch.setattr(tuner, "load_model", load_quantized)
    config.pop("quantization_bit")  # the real load (no bitsandbytes here) of the same model and adapter
    with pytest.raises(ValueError, match="Cannot merge adapters to a quantized model"):
        _stock_export(tuner)(dict(config))
    assert not (tmp_path / "merged").exists()


def test_export_on_the_gpu_warns_where_the_model_is_larger_than_the_device():
    config = {**EXPORT, "export_device": "auto"}
    found = codes(export_memory(config, {}, make_ctx("rx7800xt")))  # 15 GiB; Llama-3-8B in bf16 is ~15 GiB
    finding = found["EXPORT_MEMORY_OVER_DEVICE"]
    assert finding.key == "export_device" and finding.new == "cpu" and "export_device: cpu" in finding.fix
    assert not export_memory(config, {}, make_ctx("mi300x")).findings  # 192 GiB
    assert not export_memory({**EXPORT, "export_device": "cpu"}, {}, make_ctx("rx7800xt")).findings
    assert not export_memory(EXPORT, {}, make_ctx("rx7800xt")).findings  # LLaMA-Factory's default is cpu


def test_export_memory_counts_infer_dtype():
    config = {**EXPORT, "export_device": "auto", "infer_dtype": "float32"}  # 8B x 4 bytes = 30 GiB
    assert codes(export_memory(config, {}, make_ctx("rx7900xtx")))  # 24 GiB
    assert not export_memory({**config, "infer_dtype": "bfloat16"}, {}, make_ctx("rx7900xtx")).findings
    assert not export_memory(config, {}, make_ctx("cpu_only")).findings  # no device: nothing to compare
