"""rules.serving: vLLM/SGLang on ROCm, vLLM's LoRA rank cap, bf16 at inference."""

from __future__ import annotations

from llamafactory_rocm.findings import has_errors
from llamafactory_rocm.lf.commands import CHAT as CHAT_CHAIN
from llamafactory_rocm.lf.text_only import text_only_llamafactory
from llamafactory_rocm.rules import module_rules, serving
from llamafactory_rocm.rules.serving import (
    infer_bf16_emulated,
    sglang_on_rocm,
    vllm_lora_rank,
    vllm_on_rocm,
)
from tests.after_training_helpers import here_ctx, peft_adapter_config
from tests.conftest import make_ctx

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"
CHAT = {"model_name_or_path": MODEL, "adapter_name_or_path": "saves/lora", "template": "llama3"}


def findings(config, ctx):
    out = []
    for rule in module_rules(serving, CHAT_CHAIN):
        out += rule(config, {}, ctx).findings
    return out


def codes(step):
    return {f.code: f for f in step.findings}


def test_a_chat_config_planned_for_an_mi300x_is_not_refused():
    assert not findings({**CHAT, "infer_backend": "huggingface"}, make_ctx("mi300x"))
    found = findings({**CHAT, "infer_backend": "vllm"}, make_ctx("mi300x"))
    assert not has_errors(found) and [f.code for f in found] == ["VLLM_ROCM_REQUIRED"]
    assert "3.12" in found[0].message and "vllm>=" in found[0].message  # LLaMA-Factory's own range


def test_vllm_arch_unsupported_even_when_planned():
    for snapshot, arch in (("mi50", "gfx906"), ("mi100", "gfx908")):
        found = codes(vllm_on_rocm({**CHAT, "infer_backend": "vllm"}, {}, make_ctx(snapshot)))
        assert found["VLLM_ARCH_UNSUPPORTED"].level.value == "error" and arch in found["VLLM_ARCH_UNSUPPORTED"].message
    assert not has_errors(vllm_on_rocm({**CHAT, "infer_backend": "vllm"}, {}, make_ctx("rx7900xtx")).findings)


def test_vllm_here_must_be_the_rocm_build():
    config = {**CHAT, "infer_backend": "vllm"}
    cuda_build = here_ctx("mi300x", packages={"vllm": "0.10.1"})
    assert codes(vllm_on_rocm(config, {}, cuda_build))["VLLM_NOT_ROCM"].old == "0.10.1"
    assert not vllm_on_rocm(config, {}, here_ctx("mi300x", packages={"vllm": "0.10.1+rocm700"})).findings
    # vLLM's CUDA wheel replaced torch: KFD still sees the MI300X
    assert "VLLM_NOT_ROCM" in codes(
        vllm_on_rocm(config, {}, here_ctx("wrong_wheel_mi300x", packages={"vllm": "0.10.1"}))
    )


def test_vllm_missing_here_names_the_python():
    ctx = here_ctx("mi300x", packages={"vllm": None}, python="3.11.7")
    finding = codes(vllm_on_rocm({**CHAT, "infer_backend": "vllm"}, {}, ctx))["VLLM_NOT_INSTALLED"]
    assert "3.11.7" in finding.message and "3.12" in finding.fix
    ctx = here_ctx("mi300x", installed=frozenset({"torch"}))  # from the installed distributions
    assert "VLLM_NOT_INSTALLED" in codes(vllm_on_rocm({**CHAT, "infer_backend": "vllm"}, {}, ctx))


def test_vllm_rule_is_silent_off_amd_and_for_other_backends():
    assert not vllm_on_rocm({**CHAT, "infer_backend": "vllm"}, {}, make_ctx("cuda_h200")).findings
    assert not vllm_on_rocm(CHAT, {}, make_ctx("mi50")).findings


def test_sglang_only_on_gfx942_and_gfx950():
    config = {**CHAT, "infer_backend": "sglang"}
    assert "SGLANG_ARCH_UNSUPPORTED" in codes(sglang_on_rocm(config, {}, make_ctx("rx7900xtx")))
    assert "SGLANG_ARCH_UNSUPPORTED" in codes(sglang_on_rocm(config, {}, make_ctx("mi250x")))
    assert [f.code for f in sglang_on_rocm(config, {}, make_ctx("mi300x")).findings] == ["SGLANG_ROCM_REQUIRED"]


def test_lora_rank_above_llamafactorys_default_cap(tmp_path):
    with text_only_llamafactory():
        from llamafactory.hparams import ModelArguments
    default = ModelArguments(model_name_or_path="m").vllm_max_lora_rank  # oracle: LLaMA-Factory's dataclass
    adapter = peft_adapter_config(tmp_path / "lora", MODEL, r=2 * default)
    config = {**CHAT, "adapter_name_or_path": str(adapter), "infer_backend": "vllm"}
    finding = codes(vllm_lora_rank(config, {}, make_ctx("mi300x")))["VLLM_LORA_RANK_TOO_SMALL"]
    assert finding.old == default and finding.new == 2 * default and finding.key == "vllm_max_lora_rank"
    assert not vllm_lora_rank({**config, "vllm_max_lora_rank": 2 * default}, {}, make_ctx("mi300x")).findings
    assert not vllm_lora_rank({**config, "infer_backend": "huggingface"}, {}, make_ctx("mi300x")).findings
    small = peft_adapter_config(tmp_path / "small", MODEL, r=default)
    assert not vllm_lora_rank({**config, "adapter_name_or_path": str(small)}, {}, make_ctx("mi300x")).findings


def test_lora_rank_rounds_up_to_a_value_vllm_accepts(tmp_path):
    adapter = peft_adapter_config(tmp_path / "lora", MODEL, r=48)
    config = {**CHAT, "adapter_name_or_path": str(adapter), "infer_backend": "vllm", "vllm_max_lora_rank": 32}
    assert codes(vllm_lora_rank(config, {}, make_ctx("mi300x")))["VLLM_LORA_RANK_TOO_SMALL"].new == 64


def test_bf16_at_inference_where_it_is_emulated():
    config = {**CHAT, "infer_dtype": "bfloat16"}
    assert codes(infer_bf16_emulated(config, {}, make_ctx("mi50")))["INFER_BF16_EMULATED"].new == "float16"
    assert not infer_bf16_emulated(config, {}, make_ctx("mi300x")).findings
    assert not infer_bf16_emulated({**config, "infer_dtype": "float16"}, {}, make_ctx("mi50")).findings
