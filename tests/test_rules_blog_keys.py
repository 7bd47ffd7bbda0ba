"""Blog-style keys: compute_dtype and backend are translated, anything else unknown is refused."""

import pytest

from llamafactory_rocm.findings import Level
from llamafactory_rocm.rules import blog_keys
from tests.conftest import make_ctx


@pytest.mark.parametrize(
    ("dtype", "bf16", "fp16"),
    [("bfloat16", True, False), ("torch.bfloat16", True, False), ("float16", False, True), ("fp32", False, False)],
)
def test_compute_dtype_becomes_precision_flags(dtype, bf16, fp16):
    step = blog_keys.rewrite_compute_dtype({"compute_dtype": dtype, "fp16": True}, {}, make_ctx("mi300x"))
    assert "compute_dtype" not in step.config
    assert (step.config["bf16"], step.config["fp16"]) == (bf16, fp16)
    assert [f.code for f in step.findings] == ["COMPUTE_DTYPE_REWRITTEN"]
    assert step.findings[0].old == dtype


def test_compute_dtype_that_is_not_a_dtype_is_an_error():
    step = blog_keys.rewrite_compute_dtype({"compute_dtype": "int3"}, {}, make_ctx("mi300x"))
    assert step.findings[0].code == "COMPUTE_DTYPE_UNKNOWN"
    assert step.findings[0].level is Level.ERROR


def test_backend_pt_is_dropped_with_a_note():
    step = blog_keys.drop_backend({"backend": "pt", "stage": "sft"}, {}, make_ctx("rx7900xtx"))
    assert step.config == {"stage": "sft"}
    assert step.findings[0].code == "BACKEND_DROPPED"
    assert step.findings[0].level is Level.CHANGE


def test_backend_vllm_points_at_infer_backend():
    step = blog_keys.drop_backend({"backend": "vllm"}, {}, make_ctx("rx7900xtx"))
    assert step.findings[0].level is Level.ERROR
    assert "infer_backend" in step.findings[0].fix


def test_unknown_key_names_the_closest_real_key():
    step = blog_keys.refuse_unknown_keys({"lora_rnak": 8, "stage": "sft"}, {}, make_ctx("mi300x"))
    (finding,) = step.findings
    assert finding.code == "UNKNOWN_KEY"
    assert finding.level is Level.ERROR
    assert finding.key == "lora_rnak"
    assert "'lora_rank'" in finding.fix


def test_rocm_arch_as_a_config_key_says_it_is_an_environment_variable():
    step = blog_keys.refuse_unknown_keys({"rocm_arch": "gfx942"}, {}, make_ctx("mi300x"))
    assert "environment variable" in step.findings[0].fix


def test_with_allow_extra_args_unknown_keys_are_a_warning_not_an_error():
    step = blog_keys.refuse_unknown_keys({"lora_rnak": 8}, {"ALLOW_EXTRA_ARGS": "1"}, make_ctx("mi300x"))
    assert step.findings[0].level is Level.WARNING


def test_real_keys_pass_untouched():
    config = {"stage": "sft", "lora_rank": 8, "bf16": True, "flash_attn": "sdpa"}
    step = blog_keys.refuse_unknown_keys(config, {}, make_ctx("mi300x"))
    assert step.config == config and step.findings == []


def test_an_untranslatable_compute_dtype_is_reported_once():
    from llamafactory_rocm.rules import resolve

    result = resolve({"compute_dtype": "int3", "stage": "sft"}, {}, make_ctx("mi300x"))
    assert [f.code for f in result.findings if f.level is Level.ERROR] == ["COMPUTE_DTYPE_UNKNOWN"]


def test_a_bad_compute_dtype_lists_the_values_that_are_translated():
    step = blog_keys.rewrite_compute_dtype({"compute_dtype": "bf32"}, {}, make_ctx("mi300x"))
    (finding,) = step.findings
    for value in ("bfloat16", "bf16", "float16", "fp16", "half", "float32", "fp32", "float"):
        assert value in finding.message.split("Values that are translated: ")[1]


@pytest.mark.parametrize("value", ["deepspeed", "DeepSpeed", "ds"])
def test_backend_deepspeed_points_to_the_deepspeed_key_and_a_shipped_json(value):
    from pathlib import Path

    step = blog_keys.drop_backend({"backend": value}, {}, make_ctx("mi300x_8gpu"))
    (finding,) = step.findings
    assert finding.code == "BACKEND_UNKNOWN" and finding.level is Level.ERROR
    assert "deepspeed: key" in finding.message
    shipped = finding.fix.split("deepspeed: ", 1)[1].split(" ")[0]
    assert shipped.endswith("presets/deepspeed/ds_z2_config.json") and Path(shipped).is_file()
    assert step.config == {"backend": value}  # refused, not silently changed
