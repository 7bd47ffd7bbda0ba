"""PYTORCH_ROCM_ARCH: parsed strictly, must cover every GPU here, set when unset on ROCm."""

import pytest

from llamafactory_rocm.findings import Level
from llamafactory_rocm.machine.catalogue import load_catalogue
from llamafactory_rocm.rules.rocm_arch_env import check_pytorch_rocm_arch, parse_rocm_arch
from tests.conftest import make_ctx


def test_parses_semicolons_spaces_and_feature_suffixes():
    good, bad = parse_rocm_arch("gfx90a:xnack-;gfx942:sramecc+:xnack- gfx1100", load_catalogue())
    assert good == ["gfx90a:xnack-", "gfx942:sramecc+:xnack-", "gfx1100"]
    assert bad == []


@pytest.mark.parametrize(
    ("value", "suggestion"),
    [("gfx94", "gfx942"), ("sm_90", None), ("gfx942;;", None), ("gfx9422", "gfx942"), ("gfx942:xnack", None)],
)
def test_malformed_targets_are_refused_with_the_nearest_valid_one(value, suggestion):
    step = check_pytorch_rocm_arch({}, {"PYTORCH_ROCM_ARCH": value}, make_ctx("mi300x"))
    assert step.findings, value
    assert all(f.code == "ROCM_ARCH_MALFORMED" and f.level is Level.ERROR for f in step.findings)
    if suggestion:
        assert f"Did you mean {suggestion!r}" in step.findings[0].fix


def test_list_that_misses_the_gpu_here_is_refused():
    step = check_pytorch_rocm_arch({}, {"PYTORCH_ROCM_ARCH": "gfx90a;gfx1100"}, make_ctx("mi300x"))
    (finding,) = step.findings
    assert finding.code == "ROCM_ARCH_MISSES_DEVICE"
    assert "invalid device function" in finding.message
    assert finding.fix == "export PYTORCH_ROCM_ARCH=gfx942"


def test_list_that_covers_the_gpu_passes():
    step = check_pytorch_rocm_arch({}, {"PYTORCH_ROCM_ARCH": "gfx90a;gfx942:xnack-"}, make_ctx("mi300x"))
    assert step.findings == []


def test_unset_on_rocm_is_set_to_the_detected_arch_and_said():
    step = check_pytorch_rocm_arch({}, {}, make_ctx("mi250x"))
    assert step.env["PYTORCH_ROCM_ARCH"] == "gfx90a"  # two GCDs, one arch
    assert [f.code for f in step.findings] == ["ROCM_ARCH_SET"]
    assert step.findings[0].level is Level.CHANGE


def test_unset_on_cpu_or_cuda_stays_unset():
    for name in ("cpu_only", "cuda_h200"):
        step = check_pytorch_rocm_arch({}, {}, make_ctx(name))
        assert "PYTORCH_ROCM_ARCH" not in step.env and step.findings == []


def test_malformed_value_is_refused_even_without_a_gpu():
    step = check_pytorch_rocm_arch({}, {"PYTORCH_ROCM_ARCH": "gfx94"}, make_ctx("cpu_only"))
    assert [f.code for f in step.findings] == ["ROCM_ARCH_MALFORMED"]


def _on_rocm(ctx, hip: str):
    from dataclasses import replace

    torch = ctx.snapshot.torch.model_copy(update={"hip": hip})
    return replace(ctx, snapshot=ctx.snapshot.model_copy(update={"torch": torch}))


def test_a_feature_suffix_the_gpu_contradicts_is_refused_with_the_fix():
    # The MI300X snapshot reports gfx942:sramecc+:xnack- (its gcnArchName): xnack+ code does not load.
    step = check_pytorch_rocm_arch({}, {"PYTORCH_ROCM_ARCH": "gfx942:xnack+"}, make_ctx("mi300x"))
    (finding,) = step.findings
    assert finding.code == "ROCM_ARCH_FEATURE_MISMATCH" and finding.level is Level.ERROR
    assert "xnack+" in finding.message and "gfx942:sramecc+:xnack-" in finding.message
    assert finding.fix.startswith("export PYTORCH_ROCM_ARCH=gfx942 ")
    assert finding.new == "gfx942"


def test_a_matching_or_absent_suffix_passes_and_only_the_clashing_entry_is_fixed():
    for value in ("gfx942:xnack-", "gfx942:sramecc+:xnack-", "gfx942", "gfx90a:xnack+;gfx942"):
        assert check_pytorch_rocm_arch({}, {"PYTORCH_ROCM_ARCH": value}, make_ctx("mi300x")).findings == [], value
    step = check_pytorch_rocm_arch({}, {"PYTORCH_ROCM_ARCH": "gfx90a:xnack+;gfx942:sramecc-"}, make_ctx("mi300x"))
    assert [f.code for f in step.findings] == ["ROCM_ARCH_FEATURE_MISMATCH"]
    assert step.findings[0].new == "gfx90a:xnack+;gfx942"  # gfx90a is not here: its suffix is not judged


def test_retired_mi300_targets_are_a_finding():
    step = check_pytorch_rocm_arch({}, {"PYTORCH_ROCM_ARCH": "gfx940;gfx941;gfx942"}, make_ctx("mi300x"))
    (finding,) = step.findings
    assert finding.code == "ROCM_ARCH_RETIRED" and finding.level is Level.WARNING  # ROCm 6.4 still builds them
    assert "gfx940, gfx941" in finding.message and finding.fix == "export PYTORCH_ROCM_ARCH=gfx942"


def test_retired_targets_are_an_error_where_the_compiler_refuses_them():
    ctx = _on_rocm(make_ctx("mi300x"), "7.0.51831")
    step = check_pytorch_rocm_arch({}, {"PYTORCH_ROCM_ARCH": "gfx940;gfx942"}, ctx)
    assert [(f.code, f.level) for f in step.findings] == [("ROCM_ARCH_RETIRED", Level.ERROR)]
    assert "ROCm 7.0.51831" in step.findings[0].message


def test_only_a_retired_target_also_misses_the_gpu():
    step = check_pytorch_rocm_arch({}, {"PYTORCH_ROCM_ARCH": "gfx941"}, make_ctx("mi300x"))
    assert [f.code for f in step.findings] == ["ROCM_ARCH_RETIRED", "ROCM_ARCH_MISSES_DEVICE"]
