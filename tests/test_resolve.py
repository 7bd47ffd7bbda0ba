"""The whole rule chain on every recorded machine: the seed's config, and idempotence."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.findings import Level
from llamafactory_rocm.rules import resolve
from tests.conftest import ALL_SNAPSHOTS, ROCM_SNAPSHOTS, load_snapshot, make_ctx

SEED_CONFIG = {
    "model_name_or_path": "meta-llama/Meta-Llama-3-8B-Instruct",
    "stage": "sft",
    "do_train": True,
    "finetuning_type": "lora",
    "dataset": "my_custom_data",
    "template": "llama3",
    "fp16": True,
    "compute_dtype": "bfloat16",
    "backend": "pt",
    "tf32": True,
    "flash_attn": "fa2",
    "output_dir": "saves/does-not-exist",
}


@pytest.mark.parametrize("name", ["mi300x", "mi250x", "rx7900xtx", "w7900"])
def test_seed_config_on_bf16_cards_is_rewritten_and_accepted(name):
    result = resolve(SEED_CONFIG, {}, make_ctx(name))
    assert result.ok, [f.line() for f in result.findings if f.level is Level.ERROR]
    cfg = result.config
    assert cfg["bf16"] is True and cfg["fp16"] is False
    assert "compute_dtype" not in cfg and "backend" not in cfg and "tf32" not in cfg
    assert cfg["flash_attn"] == "sdpa"
    assert result.env_changes == {"PYTORCH_ROCM_ARCH": load_snapshot(name).gpu_base_archs[0]}
    changes = {f.code for f in result.findings if f.level is Level.CHANGE}
    assert {
        "COMPUTE_DTYPE_REWRITTEN",
        "BACKEND_DROPPED",
        "TF32_DROPPED",
        "FLASH_ATTN_TO_SDPA",
        "ROCM_ARCH_SET",
    } <= changes


def test_seed_config_on_mi50_is_refused():
    result = resolve(SEED_CONFIG, {}, make_ctx("mi50"))
    assert not result.ok
    assert "ARCH_NOT_IN_TORCH" in [f.code for f in result.findings if f.level is Level.ERROR]


def test_seed_config_on_the_wrong_wheel_is_refused():
    result = resolve(SEED_CONFIG, {}, make_ctx("wrong_wheel_mi300x"))
    assert [f.code for f in result.findings if f.level is Level.ERROR] == ["TORCH_NOT_ROCM"]


def test_inputs_are_not_modified():
    config, env = dict(SEED_CONFIG), {}
    resolve(config, env, make_ctx("mi300x"))
    assert config == SEED_CONFIG and env == {}


def test_check_with_a_recorded_snapshot_and_a_gpu_that_is_not_there_is_refused():
    report = check_config(SEED_CONFIG, snapshot=load_snapshot("rx7900xtx"), gpu="mi300x")
    assert "TARGET_MISMATCH" in [f.code for f in report.findings]
    assert not report.ok


configs = st.fixed_dictionaries(
    {},
    optional={
        "fp16": st.booleans(),
        "bf16": st.booleans(),
        "pure_bf16": st.booleans(),
        "use_cpu": st.booleans(),
        "tf32": st.booleans(),
        "flash_attn": st.sampled_from(["auto", "fa2", "sdpa", "disabled"]),
        "compute_dtype": st.sampled_from(["bfloat16", "float16", "float32", "int3"]),
        "backend": st.sampled_from(["pt", "vllm"]),
        "quantization_bit": st.sampled_from([None, 4, 8]),
        "lora_rnak": st.integers(1, 64),
        "stage": st.just("sft"),
    },
)
envs = st.fixed_dictionaries(
    {},
    optional={
        "PYTORCH_ROCM_ARCH": st.sampled_from(["gfx942", "gfx90a;gfx1100", "gfx94", "gfx942;;", "gfx1100 gfx942"]),
        "HSA_OVERRIDE_GFX_VERSION": st.sampled_from(["11.0.0", "9.4.2", "bad"]),
        "FLASH_ATTENTION_TRITON_AMD_ENABLE": st.just("TRUE"),
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, env=envs, name=st.sampled_from(ALL_SNAPSHOTS))
def test_rules_applied_to_their_own_output_change_nothing(config, env, name):
    ctx = make_ctx(name)
    first = resolve(config, env, ctx)
    second = resolve(first.config, first.env, ctx)
    assert second.config == first.config
    assert second.env == first.env
    assert [f for f in second.findings if f.level is Level.CHANGE] == []


@pytest.mark.parametrize("name", ROCM_SNAPSHOTS)
def test_every_rocm_snapshot_gets_its_arch_exported(name):
    result = resolve({"stage": "sft"}, {}, make_ctx(name))
    assert result.env["PYTORCH_ROCM_ARCH"].split(";") == load_snapshot(name).gpu_base_archs
