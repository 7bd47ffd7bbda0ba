"""PYTORCH_ROCM_ARCH: split as torch splits it, must cover every GPU here, set when unset where torch
would build for every arch it was built for. The oracle for the split and for the unset default is
torch's own ``torch.utils.cpp_extension._get_rocm_arch_flags``."""

from types import SimpleNamespace

import pytest
import torch
from torch.utils.cpp_extension import _get_rocm_arch_flags

from llamafactory_rocm.findings import Level
from llamafactory_rocm.machine.catalogue import load_catalogue
from llamafactory_rocm.rules.rocm_arch_env import (
    VISIBLE_GPUS_DEFAULT_SINCE,
    check_pytorch_rocm_arch,
    default_follows_visible_gpus,
    parse_rocm_arch,
    torch_rocm_archs,
)
from tests.conftest import make_ctx

SPLIT_CASES = [
    "gfx942",
    "gfx90a;gfx942",
    "gfx90a gfx942",
    "gfx942;;",
    "gfx942;",
    "gfx942 ",
    " gfx942",
    "gfx90a  gfx942",
    "gfx90a; gfx942",
    "gfx90a\tgfx942",
    "gfx942:sramecc+:xnack-;gfx1100",
    ";",
    " ",
]


def _torch_flags(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("PYTORCH_ROCM_ARCH", raising=False)
    else:
        monkeypatch.setenv("PYTORCH_ROCM_ARCH", value)
    return _get_rocm_arch_flags()


@pytest.mark.parametrize("value", SPLIT_CASES)
def test_entries_are_the_ones_torch_passes_to_hipcc(monkeypatch, value):
    archs = torch_rocm_archs(value)
    assert archs is not None
    assert [f"--offload-arch={a}" for a in archs] + ["-fno-gpu-rdc"] == _torch_flags(monkeypatch, value)


def test_empty_is_unset_for_torch_and_unset_means_the_visible_gpus(monkeypatch):
    # The GPUs are hardware: two visible devices, as torch.cuda reports them on an MI300X + MI210 host.
    props = [SimpleNamespace(gcnArchName="gfx942:sramecc+:xnack-"), SimpleNamespace(gcnArchName="gfx90a")]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(props))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    assert torch_rocm_archs(None) is None and torch_rocm_archs("") is None
    for value in (None, ""):
        flags = _torch_flags(monkeypatch, value)
        # P1: the visible GPUs' base archs, not the archs torch was built for.
        assert sorted(flags[:-1]) == ["--offload-arch=gfx90a", "--offload-arch=gfx942"], value
    assert default_follows_visible_gpus(torch.__version__)  # the torch installed here does it


def test_the_torch_release_that_follows_the_visible_gpus():
    since = ".".join(map(str, VISIBLE_GPUS_DEFAULT_SINCE))
    # Read in the releases' own cpp_extension.py: 2.11.0 still calls torch._C._cuda_getArchFlags(), 2.12.1
    # takes the visible cards (docs/rocm-facts.md#p1). The installed torch is checked above.
    assert default_follows_visible_gpus(f"{since}.0+rocm7.1") and default_follows_visible_gpus("2.13.0a0+rocm7.13")
    assert not default_follows_visible_gpus("2.11.0+rocm7.1") and not default_follows_visible_gpus("2.7.1+rocm6.4")
    assert not default_follows_visible_gpus(None) and not default_follows_visible_gpus("planned+rocm")


def test_parses_semicolons_spaces_and_feature_suffixes():
    good, bad = parse_rocm_arch("gfx90a:xnack-;gfx942:sramecc+:xnack- gfx1100", load_catalogue())
    assert good == ["gfx90a:xnack-", "gfx942:sramecc+:xnack-", "gfx1100"]
    assert bad == []


@pytest.mark.parametrize(
    ("value", "suggestion"),
    [
        ("gfx94", "gfx942"),
        ("sm_90", None),
        ("gfx9422", "gfx942"),
        ("gfx942:xnack", None),
        ("gfx90a\tgfx942", None),  # torch does not split on a tab: one entry
        ("GFX942", "gfx942"),  # passed on as written; clang's processor names are lowercase
    ],
)
def test_malformed_targets_are_refused_with_the_nearest_valid_one(value, suggestion):
    step = check_pytorch_rocm_arch({}, {"PYTORCH_ROCM_ARCH": value}, make_ctx("mi300x"))
    assert step.findings, value
    assert all(f.code == "ROCM_ARCH_MALFORMED" and f.level is Level.ERROR for f in step.findings)
    if suggestion:
        assert f"Did you mean {suggestion!r}" in step.findings[0].fix


@pytest.mark.parametrize(
    ("value", "empty", "cleaned"),
    [("gfx942;;", 2, "gfx942"), ("gfx942 ", 1, "gfx942"), (" gfx90a  gfx942", 2, "gfx90a;gfx942"), (";", 2, "")],
)
def test_an_empty_entry_torch_makes_is_a_warning_with_the_cleaned_value(monkeypatch, value, empty, cleaned):
    assert _torch_flags(monkeypatch, value).count("--offload-arch=") == empty  # torch's own split
    step = check_pytorch_rocm_arch({}, {"PYTORCH_ROCM_ARCH": value}, make_ctx("mi300x"))
    codes = [(f.code, f.level) for f in step.findings]
    assert ("ROCM_ARCH_EMPTY_ENTRY", Level.WARNING) in codes
    warning = next(f for f in step.findings if f.code == "ROCM_ARCH_EMPTY_ENTRY")
    assert warning.new == cleaned and f"{empty} empty entr" in warning.message
    if cleaned:
        assert codes == [("ROCM_ARCH_EMPTY_ENTRY", Level.WARNING)]  # gfx942 is covered: nothing else


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
    # torch 2.7.1 would build for the 13 archs it was built for.
    for env in ({}, {"PYTORCH_ROCM_ARCH": ""}):
        step = check_pytorch_rocm_arch({}, env, make_ctx("mi250x"))
        assert step.env["PYTORCH_ROCM_ARCH"] == "gfx90a"  # two GCDs, one arch
        assert [f.code for f in step.findings] == ["ROCM_ARCH_SET"]
        assert step.findings[0].level is Level.CHANGE
        assert "13: gfx1030, gfx1100" in step.findings[0].message


def test_unset_stays_unset_where_torch_builds_for_the_visible_gpus():
    # strixhalo: torch 2.13 (TheRock), which takes the visible GPUs' archs by itself (P1).
    ctx = make_ctx("strixhalo")
    assert default_follows_visible_gpus(ctx.snapshot.torch.version) and ctx.snapshot.gpu_base_archs
    step = check_pytorch_rocm_arch({}, {}, ctx)
    assert "PYTORCH_ROCM_ARCH" not in step.env and step.findings == []


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


def test_a_plan_sets_it_since_the_targets_torch_is_not_known():
    from dataclasses import replace

    from llamafactory_rocm.check.target import Target, planned_snapshot

    planned = planned_snapshot(Target(arch="gfx942", alias="mi300x", named_by="--gpu"), {})
    step = check_pytorch_rocm_arch({}, {}, replace(make_ctx("mi300x"), snapshot=planned))
    (finding,) = step.findings
    assert finding.code == "ROCM_ARCH_SET" and step.env["PYTORCH_ROCM_ARCH"] == "gfx942"
    assert "a torch before 2.12 (the target's torch is not known here)" in finding.message
