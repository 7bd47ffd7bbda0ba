"""Is torch a ROCm build with kernels for the GPU here? HSA overrides only within a family."""

from llamafactory_rocm.findings import Level
from llamafactory_rocm.rules import torch_build
from llamafactory_rocm.rules.torch_build import override_target
from tests.conftest import make_ctx


def codes(step):
    return [f.code for f in step.findings]


def test_cuda_wheel_on_an_amd_machine_is_refused():
    step = torch_build.require_rocm_torch({}, {}, make_ctx("wrong_wheel_mi300x"))
    assert codes(step) == ["TORCH_NOT_ROCM"]
    assert step.findings[0].level is Level.ERROR
    assert "ROCm wheel index" in step.findings[0].fix


def test_rocm_wheel_with_its_gpu_passes():
    for name in ("mi300x", "mi250x", "rx7900xtx", "w7900", "mi100"):
        assert codes(torch_build.require_rocm_torch({}, {}, make_ctx(name))) == []
        assert codes(torch_build.require_kernels_for_devices({}, {}, make_ctx(name))) == []


def test_cpu_and_cuda_machines_are_not_refused():
    assert codes(torch_build.require_rocm_torch({}, {}, make_ctx("cpu_only"))) == []
    assert codes(torch_build.require_rocm_torch({}, {}, make_ctx("cuda_h200"))) == []


def test_mi50_is_refused_because_official_wheels_have_no_gfx906_kernels():
    step = torch_build.require_kernels_for_devices({}, {}, make_ctx("mi50"))
    assert codes(step) == ["ARCH_NOT_IN_TORCH"]
    assert "gfx906" in step.findings[0].message
    # there is no sibling in the family to override to: the fix is a wheel, never an override
    assert "HSA_OVERRIDE_GFX_VERSION" not in step.findings[0].fix
    assert "PYTORCH_ROCM_ARCH=gfx906" in step.findings[0].fix


def test_missing_arch_with_a_sibling_suggests_the_in_family_override():
    ctx = make_ctx("rx7800xt")
    trimmed = ctx.snapshot.model_copy(deep=True)
    trimmed.torch.arch_list = ["gfx90a", "gfx942", "gfx1100"]
    ctx = type(ctx)(snapshot=trimmed, catalogue=ctx.catalogue, known_keys=ctx.known_keys)
    step = torch_build.require_kernels_for_devices({}, {}, ctx)
    assert codes(step) == ["ARCH_NOT_IN_TORCH"]
    assert "HSA_OVERRIDE_GFX_VERSION=11.0.0" in step.findings[0].fix


def test_override_target_parses_hsa_versions():
    assert override_target("11.0.0") == "gfx1100"
    assert override_target("9.0.10") == "gfx90a"
    assert override_target("10.3.0") == "gfx1030"
    assert override_target("eleven") is None


def test_override_within_the_family_is_accepted_and_explained_where_torch_lacks_the_arch():
    ctx = make_ctx("rx7800xt_override")
    trimmed = ctx.snapshot.model_copy(deep=True)
    trimmed.torch.arch_list = ["gfx90a", "gfx942", "gfx1100"]
    ctx = type(ctx)(snapshot=trimmed, catalogue=ctx.catalogue, known_keys=ctx.known_keys)
    step = torch_build.check_hsa_override({}, ctx.snapshot.env, ctx)
    assert codes(step) == ["HSA_OVERRIDE_ACTIVE"]
    assert step.findings[0].level is Level.INFO


def test_override_on_a_card_torch_supports_natively_is_a_warning():
    """The official wheel has gfx1101 kernels: 11.0.0 on an RX 7800 XT is not needed and can fault (N12)."""
    ctx = make_ctx("rx7800xt_override")
    step = torch_build.check_hsa_override({}, ctx.snapshot.env, ctx)
    assert codes(step) == ["HSA_OVERRIDE_NOT_NEEDED"]
    finding = step.findings[0]
    assert finding.level is Level.WARNING and "fault" in finding.message
    assert finding.fix.startswith("unset HSA_OVERRIDE_GFX_VERSION")
    # RDNA4 with an RDNA3 override crosses families: refused, as before
    step = torch_build.check_hsa_override({}, {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}, make_ctx("r9700"))
    assert codes(step) == ["HSA_OVERRIDE_CROSS_FAMILY"]
    # an override naming the card itself changes nothing: no finding
    assert (
        codes(torch_build.check_hsa_override({}, {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}, make_ctx("rx7900xtx"))) == []
    )


def test_override_across_families_is_refused():
    step = torch_build.check_hsa_override({}, {"HSA_OVERRIDE_GFX_VERSION": "9.4.2"}, make_ctx("rx7900xtx"))
    assert codes(step) == ["HSA_OVERRIDE_CROSS_FAMILY"]
    assert "INVALID_ISA" in step.findings[0].message


def test_malformed_override_is_refused():
    step = torch_build.check_hsa_override({}, {"HSA_OVERRIDE_GFX_VERSION": "gfx1100"}, make_ctx("rx7900xtx"))
    assert codes(step) == ["HSA_OVERRIDE_MALFORMED"]
