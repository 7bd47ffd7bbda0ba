"""rules.adapter: the adapter's base model (from PEFT's own adapter_config.json) against model_name_or_path."""

from __future__ import annotations

from llamafactory_rocm.rules.adapter import adapter_base_mismatch, adapter_paths, same_model
from tests.after_training_helpers import peft_adapter_config
from tests.conftest import make_ctx

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"


def test_an_adapter_trained_on_another_model_warns(tmp_path):
    adapter = peft_adapter_config(tmp_path / "lora", "Qwen/Qwen3-8B")
    config = {"model_name_or_path": MODEL, "adapter_name_or_path": str(adapter)}
    (finding,) = adapter_base_mismatch(config, {}, make_ctx("mi300x")).findings
    assert finding.code == "ADAPTER_BASE_MISMATCH" and finding.level.value == "warning"
    assert "Qwen/Qwen3-8B" in finding.message and finding.key == "adapter_name_or_path"


def test_the_same_model_by_another_spelling_does_not_warn(tmp_path):
    local = tmp_path / "models" / "Meta-Llama-3-8B-Instruct"
    local.mkdir(parents=True)
    adapter = peft_adapter_config(tmp_path / "lora", MODEL)
    for model in (MODEL, MODEL.lower() + "/", str(local)):
        config = {"model_name_or_path": model, "adapter_name_or_path": str(adapter)}
        assert not adapter_base_mismatch(config, {}, make_ctx("mi300x")).findings, model
    assert same_model(str(local), str(local / ".." / "Meta-Llama-3-8B-Instruct"))


def test_hub_adapters_and_comma_lists(tmp_path):
    assert adapter_paths({"adapter_name_or_path": "a, b"}) == ["a", "b"]
    config = {"model_name_or_path": MODEL, "adapter_name_or_path": "someone/lora-on-hub"}
    assert not adapter_base_mismatch(config, {}, make_ctx("mi300x")).findings  # nothing local to read
