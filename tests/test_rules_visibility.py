"""Which GPUs the run sees: the iGPU beside a Radeon card, and the three visibility variables (N10, N11).

Recorded snapshots built from published facts; none of it ran on AMD hardware.
"""

from dataclasses import replace

from llamafactory_rocm.findings import Level
from llamafactory_rocm.lf.memory import model_config_for
from llamafactory_rocm.presets import raw
from llamafactory_rocm.rules import Context, resolve, visibility
from llamafactory_rocm.rules.visibility import hip_value_for
from llamafactory_rocm.rules.world import world_size
from tests.conftest import load_snapshot, make_ctx


def viewed_ctx(name: str, env: dict | None = None) -> Context:
    """The Context as check builds it: rules see Snapshot.training_view(), the iGPU recorded aside."""
    snap = load_snapshot(name)
    if env is not None:
        snap = snap.model_copy(update={"env": env})
    view = snap.training_view()
    ctx = make_ctx(name)
    return replace(ctx, snapshot=view, integrated_devices=tuple(view.set_aside))


def test_the_view_sets_the_igpu_aside_with_its_kfd_node():
    snap = load_snapshot("rx7900xtx_with_igpu")
    view = snap.training_view()
    assert [d.arch_name for d in view.devices] == ["gfx1100"] and view.devices[0].index == 1
    assert [d.arch_name for d in view.set_aside] == ["gfx1036"]
    assert view.kfd_targets == ["gfx1100"] and snap.kfd_targets == ["gfx1036", "gfx1100"]  # the input is untouched


def test_an_apu_alone_is_the_gpu_and_is_not_set_aside():
    snap = load_snapshot("strixhalo")
    assert snap.training_view() is snap and snap.integrated_devices()[0].arch_name == "gfx1151"


def test_a_schema_2_snapshot_without_is_integrated_is_recognised_by_its_target():
    snap = load_snapshot("rx7900xtx_with_igpu")
    old = snap.model_copy(update={"devices": [d.model_copy(update={"is_integrated": None}) for d in snap.devices]})
    assert [d.arch_name for d in old.training_view().set_aside] == ["gfx1036"]


def test_one_finding_with_the_exact_hip_visible_devices_and_a_one_device_plan():
    ctx = viewed_ctx("rx7900xtx_with_igpu")
    config = {**raw("rx7900xtx_llama3_lora"), "output_dir": "saves/does-not-exist"}
    ctx = replace(ctx, model_config=model_config_for(config["model_name_or_path"]))
    findings = resolve(config, {}, ctx).findings
    codes = [f.code for f in findings]
    assert codes.count("IGPU_VISIBLE") == 1
    (igpu,) = [f for f in findings if f.code == "IGPU_VISIBLE"]
    assert igpu.level is Level.ERROR and igpu.new == "1" and "export HIP_VISIBLE_DEVICES=1" in igpu.fix
    for code in ("ARCH_NOT_IN_TORCH", "BF16_NOT_NATIVE", "SDPA_MATH_FALLBACK", "MEMORY_OVER_BUDGET",
                 "TARGET_MISMATCH", "IOMMU_PT_MISSING", "RDNA3_DDP_KNOWN_ISSUE"):  # fmt: skip
        assert code not in codes, code
    assert not any("gfx1036" in f.message for f in findings if f.code != "IGPU_VISIBLE")
    assert world_size(config, {}, ctx) == 1
    (memory,) = [f for f in findings if f.code == "MEMORY_ESTIMATE"]
    assert "of 24.0 GiB" in memory.message


def test_the_card_first_order_gives_index_0():
    snap = load_snapshot("rx7900xtx_with_igpu")
    swapped = snap.model_copy(
        update={
            "devices": [
                snap.devices[1].model_copy(update={"index": 0}),
                snap.devices[0].model_copy(update={"index": 1}),
            ]
        }
    )
    view = swapped.training_view()
    ctx = replace(make_ctx("rx7900xtx_with_igpu"), snapshot=view, integrated_devices=tuple(view.set_aside))
    (finding,) = visibility.integrated_gpu_visible({}, {}, ctx).findings
    assert finding.new == "0"


def test_an_existing_hip_list_is_indexed_not_replaced():
    assert hip_value_for([1], {"HIP_VISIBLE_DEVICES": "2,3"}) == "3"
    assert hip_value_for([1], {"CUDA_VISIBLE_DEVICES": "0,2"}) == "2"
    assert hip_value_for([1], {}) == "1"


def test_an_igpu_torch_has_kernels_for_is_a_warning():
    ctx = viewed_ctx("rx7900xtx_with_igpu")
    phoenix = ctx.integrated_devices[0].model_copy(update={"arch_name": "gfx1103", "name": "AMD Radeon 780M"})
    ctx = replace(ctx, integrated_devices=(phoenix,))
    (finding,) = visibility.integrated_gpu_visible({}, {}, ctx).findings
    assert finding.level is Level.WARNING and "iGPU's pace" in finding.message


def test_no_finding_without_an_igpu():
    assert visibility.integrated_gpu_visible({}, {}, viewed_ctx("rx7900xtx")).findings == []
    assert visibility.integrated_gpu_visible({}, {}, viewed_ctx("strixhalo")).findings == []


def test_hip_and_cuda_disagreeing_says_hip_wins_and_what_the_run_sees():
    ctx = make_ctx("rx7900xtx_visibility_conflict")
    (finding,) = visibility.visibility_conflict({}, ctx.snapshot.env, ctx).findings
    assert finding.code == "VISIBLE_DEVICES_CONFLICT" and finding.level is Level.WARNING
    assert "CUDA_VISIBLE_DEVICES=0 is ignored while HIP_VISIBLE_DEVICES is set" in finding.message
    assert "the run sees 1: GPU 1 (gfx1100)" in finding.message
    assert finding.fix.startswith("Keep one variable: export ROCR_VISIBLE_DEVICES=1 and unset HIP_VISIBLE_DEVICES")


def test_rocr_applied_first_and_the_same_index_in_hip_hides_everything():
    ctx = make_ctx("rx7900xtx_visibility_conflict")
    env = {"ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "1"}
    (finding,) = visibility.visibility_conflict({}, env, ctx).findings
    assert finding.level is Level.ERROR
    assert "ROCR_VISIBLE_DEVICES=1 is applied first, by the ROCm runtime" in finding.message
    assert "HIP_VISIBLE_DEVICES=1 then indexes the devices left" in finding.message
    assert "the run sees no GPU" in finding.message


def test_a_hip_list_longer_than_rocr_is_refused_as_torch_refuses_it():
    ctx = make_ctx("rx7900xtx_visibility_conflict")
    env = {"ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "0,1"}
    (finding,) = visibility.visibility_conflict({}, env, ctx).findings
    assert finding.level is Level.ERROR and "lists more devices than ROCR_VISIBLE_DEVICES" in finding.message


def test_variables_that_agree_or_stand_alone_say_nothing():
    ctx = make_ctx("rx7900xtx_visibility_conflict")
    for env in ({"HIP_VISIBLE_DEVICES": "1"}, {"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "0"},
                {"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0,1"}, {}):  # fmt: skip
        assert visibility.visibility_conflict({}, env, ctx).findings == [], env


def test_uuids_and_no_kfd_topology_are_said_not_guessed():
    ctx = make_ctx("rx7900xtx_visibility_conflict")
    env = {"ROCR_VISIBLE_DEVICES": "GPU-4b2c", "HIP_VISIBLE_DEVICES": "0"}
    (finding,) = visibility.visibility_conflict({}, env, ctx).findings
    assert "UUID" in finding.message and finding.level is Level.WARNING
    wsl = make_ctx("wsl2_rx7900xtx")
    (finding,) = visibility.visibility_conflict(
        {}, {"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0"}, wsl
    ).findings
    assert "no KFD topology" in finding.message
