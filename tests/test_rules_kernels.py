"""tf32 dropped off CUDA; fa2 -> sdpa where flash-attn cannot serve the arch; QLoRA needs bitsandbytes."""

import pytest

from llamafactory_rocm.findings import Level
from llamafactory_rocm.rules import kernels
from llamafactory_rocm.rules.base import Context
from tests.conftest import make_ctx


def with_packages(name: str, **packages: str | None) -> Context:
    ctx = make_ctx(name)
    snap = ctx.snapshot.model_copy(update={"packages": {**ctx.snapshot.packages, **packages}})
    return Context(snapshot=snap, catalogue=ctx.catalogue, known_keys=ctx.known_keys)


@pytest.mark.parametrize("name", ["mi300x", "rx7900xtx", "cpu_only"])
def test_tf32_is_dropped_where_torch_is_not_a_cuda_build(name):
    step = kernels.drop_tf32({"tf32": True, "bf16": True}, {}, make_ctx(name))
    assert step.config == {"bf16": True}
    assert step.findings[0].code == "TF32_DROPPED"


def test_tf32_stays_on_cuda():
    assert kernels.drop_tf32({"tf32": True}, {}, make_ctx("cuda_h200")).config == {"tf32": True}


def test_fa2_without_flash_attn_installed_becomes_sdpa():
    step = kernels.flash_attn_where_supported({"flash_attn": "fa2"}, {}, make_ctx("mi300x"))
    assert step.config["flash_attn"] == "sdpa"
    assert "not installed" in step.findings[0].message


def test_fa2_with_a_ck_release_that_covers_mi300x_is_kept():
    ctx = with_packages("mi300x", flash_attn="2.8.3")
    assert kernels.flash_attn_where_supported({"flash_attn": "fa2"}, {}, ctx).config["flash_attn"] == "fa2"


def test_fa2_on_rdna3_with_ck_only_becomes_sdpa_but_triton_backend_serves_it():
    ctx = with_packages("rx7900xtx", flash_attn="2.8.3")
    ck = kernels.flash_attn_where_supported({"flash_attn": "fa2"}, {}, ctx)
    assert ck.config["flash_attn"] == "sdpa"
    assert "FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE" in ck.findings[0].message
    triton = kernels.flash_attn_where_supported(
        {"flash_attn": "fa2"}, {"FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE"}, ctx
    )
    assert triton.config["flash_attn"] == "fa2" and triton.findings == []


def test_fa2_with_a_release_too_old_for_mi355x_becomes_sdpa():
    ctx = make_ctx("mi300x")
    snap = ctx.snapshot.model_copy(deep=True)
    snap.devices[0].arch_name = "gfx950"
    snap.packages["flash_attn"] = "2.6.3"
    ctx = Context(snapshot=snap, catalogue=ctx.catalogue, known_keys=ctx.known_keys)
    step = kernels.flash_attn_where_supported({"flash_attn": "fa2"}, {}, ctx)
    assert step.config["flash_attn"] == "sdpa"
    assert "from 2.8.0" in step.findings[0].message


def test_fa2_on_cuda_is_left_alone():
    assert kernels.flash_attn_where_supported({"flash_attn": "fa2"}, {}, make_ctx("cuda_h200")).findings == []


def test_sdpa_on_mi100_warns_about_the_math_fallback():
    step = kernels.sdpa_kernel_notice({"flash_attn": "sdpa"}, {}, make_ctx("mi100"))
    assert [f.code for f in step.findings] == ["SDPA_MATH_FALLBACK"]


def test_qlora_on_rocm_needs_bitsandbytes_0_49():
    missing = kernels.bitsandbytes_for_qlora({"quantization_bit": 4}, {}, make_ctx("rx7800xt"))
    assert missing.findings[0].code == "QLORA_BITSANDBYTES" and missing.findings[0].level is Level.ERROR
    old = kernels.bitsandbytes_for_qlora({"quantization_bit": 4}, {}, with_packages("rx7800xt", bitsandbytes="0.45.0"))
    assert "0.49" in old.findings[0].message
    ok = kernels.bitsandbytes_for_qlora({"quantization_bit": 4}, {}, with_packages("rx7800xt", bitsandbytes="0.49.1"))
    assert ok.findings == []


def test_qlora_on_an_arch_without_bitsandbytes_kernels_is_refused():
    step = kernels.bitsandbytes_for_qlora({"quantization_bit": 4}, {}, with_packages("mi100", bitsandbytes="0.50.0"))
    assert step.findings[0].code == "QLORA_ARCH_UNSUPPORTED"


def test_tf32_on_this_machine_is_decided_by_transformers_itself():
    """Where the snapshot is this machine, the verdict is transformers' is_torch_tf32_available; the
    oracle is its TrainingArguments refusing (or taking) tf32: true here."""
    from transformers import TrainingArguments

    ctx = make_ctx("cpu_only")
    here = Context(
        snapshot=ctx.snapshot.model_copy(update={"source": "probe"}), catalogue=ctx.catalogue, known_keys=ctx.known_keys
    )
    dropped = "tf32" not in kernels.drop_tf32({"tf32": True}, {}, here).config
    try:
        TrainingArguments(output_dir="unused", tf32=True, use_cpu=True)
        refused = False
    except ValueError as exc:
        refused = "--tf32 requires Ampere" in str(exc)
    assert dropped == refused


def test_versions_are_compared_by_packaging_hip_strings_included():
    assert kernels.version("2.8.0.post2+rocm6.4") < kernels.version("2.10")
    assert kernels.version("6.4.43482-0f2d60242") >= kernels.version("6.4")  # HIP's own form
    assert kernels.version_tuple("2.8.0.post2+rocm") == (2, 8, 0)
    assert kernels.version_tuple("7.0.51831-a3e329ad8") >= (7, 0)
