"""Environment faults: RDNA4/Strix Halo page faults, torch's HIP vs the system ROCm, the JIT toolchain, WSL2.

Recorded snapshots built from published facts (docs/rocm-facts.md#n7, #n8, #n13, #n14); none ran on AMD hardware.
"""

import json
import sys

import pytest

from llamafactory_rocm.findings import Level
from llamafactory_rocm.rules import environment
from llamafactory_rocm.rules.base import Context
from tests.conftest import make_ctx


def codes(step):
    return [f.code for f in step.findings]


def with_hip(ctx: Context, hip: str) -> Context:
    snap = ctx.snapshot.model_copy(deep=True)
    snap.torch.hip = hip
    return Context(snapshot=snap, catalogue=ctx.catalogue, known_keys=ctx.known_keys)


def test_rdna4_lora_on_rocm_7_2_or_later_names_the_allocator_workaround():
    for name in ("rx9060xt", "r9700", "rx9070xt"):
        ctx = with_hip(make_ctx(name), "7.14.0")
        (finding,) = environment.page_fault_workaround({}, {}, ctx).findings
        assert finding.code == "HIP_PAGE_FAULT_RISK" and finding.level is Level.WARNING
        assert "PYTORCH_NO_HIP_MEMORY_CACHING=1" in finding.fix and "#6647" in finding.message


def test_page_fault_warning_is_quiet_where_it_does_not_apply():
    ctx = with_hip(make_ctx("r9700"), "7.14.0")
    assert codes(environment.page_fault_workaround({}, {"PYTORCH_NO_HIP_MEMORY_CACHING": "1"}, ctx)) == []
    assert codes(environment.page_fault_workaround({"finetuning_type": "full"}, {}, ctx)) == []
    assert codes(environment.page_fault_workaround({}, {}, make_ctx("r9700"))) == []  # ROCm 6.4: before the path
    assert codes(environment.page_fault_workaround({}, {}, make_ctx("rx7900xtx"))) == []


def test_strix_halo_is_warned_without_claiming_the_workaround_is_proven():
    (finding,) = environment.page_fault_workaround({}, {}, make_ctx("strixhalo")).findings
    assert "gfx1151" in finding.message and "not established" in finding.message


def ds_config(tmp_path, **body):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}, **body}))
    return {"deepspeed": str(path)}


def test_jit_ops_read_from_the_deepspeed_file(tmp_path):
    offload = ds_config(tmp_path, zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu"}})
    assert environment.jit_ops(offload) == ["CPUAdam (offload_optimizer: cpu)"]
    fused = ds_config(tmp_path, optimizer={"type": "AdamW", "params": {}})
    assert environment.jit_ops(fused) == ["FusedAdam (optimizer AdamW)"]
    assert environment.jit_ops(ds_config(tmp_path)) == []
    assert environment.jit_ops({}) == []


def test_hip_and_system_rocm_majors_differ(tmp_path):
    ctx = make_ctx("rx7900xtx_rocm_mismatch")
    (warning,) = environment.rocm_version_mismatch({}, {}, ctx).findings
    assert warning.code == "ROCM_VERSION_MISMATCH" and warning.level is Level.WARNING
    assert "HIP 6.4.43482" in warning.message and "7.1.0-38" in warning.message
    config = ds_config(tmp_path, zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu"}})
    (error,) = environment.rocm_version_mismatch(config, {}, ctx).findings
    assert error.level is Level.ERROR and "CPUAdam" in error.message and "ROCm 7.1" in error.fix


def test_matching_or_unknown_system_rocm_says_nothing():
    assert codes(environment.rocm_version_mismatch({}, {}, make_ctx("rx7900xtx"))) == []  # not read
    ctx = make_ctx("rx7900xtx_rocm_mismatch")
    snap = ctx.snapshot.model_copy(deep=True)
    snap.host.system_rocm = "6.4.1-103"
    same = Context(snapshot=snap, catalogue=ctx.catalogue, known_keys=ctx.known_keys)
    assert codes(environment.rocm_version_mismatch({}, {}, same)) == []


def test_missing_ninja_or_hipcc_refuses_a_jit_built_op(tmp_path):
    ctx = make_ctx("rx7900xtx_rocm_mismatch")
    snap = ctx.snapshot.model_copy(deep=True)
    snap.host.ninja = False
    snap.host.rocm_home = False
    bare = Context(snapshot=snap, catalogue=ctx.catalogue, known_keys=ctx.known_keys)
    config = ds_config(tmp_path, optimizer={"type": "Adam"})
    (finding,) = environment.jit_toolchain(config, {}, bare).findings
    assert finding.code == "JIT_TOOLCHAIN_MISSING" and finding.level is Level.ERROR
    assert "ninja, ROCM_HOME are missing" in finding.message and "FusedAdam" in finding.message
    assert codes(environment.jit_toolchain({}, {}, bare)) == []  # no op to build
    assert codes(environment.jit_toolchain(config, {}, ctx)) == []  # the tools are there
    assert codes(environment.jit_toolchain(config, {}, make_ctx("rx7900xtx"))) == []  # not read: no guess


def test_wsl2_says_dxg_applies_and_names_the_detection_variable():
    ctx = make_ctx("wsl2_rx7900xtx")
    (finding,) = environment.wsl2({}, {}, ctx).findings
    assert finding.code == "WSL2_DXG" and finding.level is Level.INFO
    assert "/dev/dxg" in finding.message and "HSA_ENABLE_DXG_DETECTION=1" in finding.fix
    (quiet,) = environment.wsl2({}, {"HSA_ENABLE_DXG_DETECTION": "1"}, ctx).findings
    assert "HSA_ENABLE_DXG_DETECTION" not in quiet.fix
    assert codes(environment.wsl2({}, {}, make_ctx("rx7900xtx"))) == []


def test_a_therock_install_past_rocm_7_is_compared_only_where_it_holds(tmp_path):
    # HIP 6.4 beside ROCm 10.0 (TheRock's /opt/rocm/core): older whichever HIP ROCm 10 ships.
    ctx = make_ctx("rx7900xtx_therock_rocm10_mismatch")
    (warning,) = environment.rocm_version_mismatch({}, {}, ctx).findings
    assert warning.code == "ROCM_VERSION_MISMATCH" and warning.key == "/opt/rocm/core/.info/version"
    assert "10.0.0 (/opt/rocm/core/.info/version)" in warning.message and "ROCm 10.0" in warning.fix
    # HIP 7.13 beside ROCm 10.0: which HIP major ROCm 10 ships is unsettled (docs/rocm-facts.md#n19): no
    # false mismatch.
    assert codes(environment.rocm_version_mismatch({}, {}, make_ctx("mi300x_therock_rocm10"))) == []


@pytest.mark.parametrize(
    ("hip", "system", "differ"),
    [
        ("6.4.43482", "7.1.0-38", True),
        ("7.13.26154", "7.14.0", False),  # TheRock 7.1x: HIP numbered as ROCm
        ("6.4.43482", "10.0.0", True),
        ("7.13.26154", "10.0.0", None),
        ("10.0.1", "10.0.0", False),
        ("10.0.1", "7.2.0", True),
        ("unknown", "7.2.0", None),
    ],
)
def test_majors_past_7_are_read_as_numbers(hip, system, differ):
    assert environment.hip_and_rocm_majors_differ(hip, system) is differ


def test_a_version_not_read_says_nothing():
    ctx = make_ctx("rx7900xtx_therock_rocm10_mismatch")
    for update in (
        {"system_rocm": None, "system_rocm_layout": "unknown", "system_rocm_file": None},
        {"system_rocm": None, "system_rocm_file": None, "system_rocm_installs": ["core-7.14", "core-10.0"]},
    ):
        snap = ctx.snapshot.model_copy(update={"host": ctx.snapshot.host.model_copy(update=update)})
        unread = Context(snapshot=snap, catalogue=ctx.catalogue, known_keys=ctx.known_keys)
        assert codes(environment.rocm_version_mismatch({}, {}, unread)) == []


def test_ops_deepspeed_built_at_install_are_not_jit_built(tmp_path, monkeypatch):
    """DeepSpeed's installer records the ops it built in deepspeed/git_version_info_installed.py
    (installed_ops, read by its git_version_info and ds_report); the probe reads that record, and the
    JIT rules leave those ops out. The oracle is Python importing the record as DeepSpeed does."""
    import importlib

    from llamafactory_rocm.machine.probe import read_deepspeed_prebuilt_ops

    package = tmp_path / "site" / "deepspeed"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "git_version_info_installed.py").write_text(
        "version='0.16.9'\ninstalled_ops={'async_io': False, 'fused_adam': True, 'cpu_adam': True}\n"
        "compatible_ops={'async_io': False, 'fused_adam': True, 'cpu_adam': True}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "deepspeed", raising=False)
    importlib.invalidate_caches()
    recorded = importlib.import_module("deepspeed.git_version_info_installed").installed_ops
    assert read_deepspeed_prebuilt_ops() == sorted(op for op, built in recorded.items() if built)
    offload = ds_config(tmp_path, zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu"}})
    assert environment.jit_ops(offload, read_deepspeed_prebuilt_ops()) == []
    assert environment.jit_ops(offload, ["fused_adam"]) == ["CPUAdam (offload_optimizer: cpu)"]
    ctx = make_ctx("rx7900xtx_rocm_mismatch")
    snap = ctx.snapshot.model_copy(deep=True)
    snap.host.ninja = False
    bare = Context(snapshot=snap, catalogue=ctx.catalogue, known_keys=ctx.known_keys)
    assert codes(environment.jit_toolchain(offload, {}, bare)) == ["JIT_TOOLCHAIN_MISSING"]
    snap.deepspeed_prebuilt_ops = read_deepspeed_prebuilt_ops()
    assert codes(environment.jit_toolchain(offload, {}, bare)) == []  # built at install: nothing to build
    assert codes(environment.rocm_version_mismatch(offload, {}, bare)) in ([], ["ROCM_VERSION_MISMATCH"])
