"""rules/world.py: the world's arithmetic, RCCL's network settings and Ray on ROCm, over recorded snapshots."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from llamafactory_rocm.check.target import planned_snapshot
from llamafactory_rocm.findings import Finding, Level
from llamafactory_rocm.machine.snapshot import Snapshot
from llamafactory_rocm.rules import memory_fit, resolve, world
from llamafactory_rocm.rules.base import Context, Target
from tests.conftest import load_snapshot, make_ctx

LLAMA3 = "meta-llama/Meta-Llama-3-8B-Instruct"
TWO_NODES = {"NNODES": "2", "NPROC_PER_NODE": "8", "MASTER_ADDR": "node-a", "NCCL_SOCKET_IFNAME": "ens",
             "GLOO_SOCKET_IFNAME": "ens"}  # fmt: skip
MI300X_TUNED = {"NCCL_MIN_NCHANNELS": "112", "TORCH_NCCL_HIGH_PRIORITY": "1", "HIP_FORCE_DEV_KERNARG": "1",
                "HSA_NO_SCRATCH_RECLAIM": "1"}  # fmt: skip
CONFIG = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "cutoff_len": 4096}


def findings(rule, config: dict, env: dict, ctx: Context) -> dict[str, Finding]:
    found = rule(config, env, ctx).findings
    assert len({f.code for f in found}) == len(found)
    return {f.code: f for f in found}


def with_rows(ctx: Context, rows: int) -> Context:
    return dataclasses.replace(ctx, train_rows=rows)


def test_one_rank_says_nothing():
    assert world.world_rules(CONFIG, {}, make_ctx("mi300x")).findings == []


def test_two_nodes_of_eight_state_the_global_batch_arithmetic():
    found = findings(world.world_batch, CONFIG, TWO_NODES, make_ctx("mi300x_8gpu"))
    plan = found["WORLD_PLAN"]
    assert plan.level is Level.INFO and plan.new == 16
    arithmetic = "per_device_train_batch_size 8 x gradient_accumulation_steps 1 x world 16 (2 nodes x 8) = 128"
    assert arithmetic in plan.message
    assert "524,288 tokens" in plan.message  # 128 x 4096


def test_without_nproc_per_node_every_visible_gpu_is_a_rank():
    env = {"NNODES": "2"}
    assert world.read_world(CONFIG, env, make_ctx("mi300x_8gpu"))[0].size == 16
    forced = {**env, "FORCE_TORCHRUN": "1"}  # one GPU per node: torchrun only when forced
    size, problems = world.read_world(CONFIG, forced, make_ctx("mi300x"))
    assert size.size == 2 and problems == []


@pytest.mark.parametrize("env", [{"NNODES": "2"}, {"NNODES": "2", "FORCE_TORCHRUN": "yes"}, {"NPROC_PER_NODE": "2"}])
def test_one_gpu_a_node_without_force_torchrun_is_one_process_and_refused(env):
    """LLaMA-Factory's launcher starts torchrun only with FORCE_TORCHRUN or more than one device: each node
    would train alone ("yes" is not one of is_env_enabled's words)."""
    size, problems = world.read_world(CONFIG, env, make_ctx("mi300x"))
    assert size.size == 1 and [(f.code, f.level, f.key) for f in problems] == [
        ("WORLD_NOT_LAUNCHED", Level.ERROR, "FORCE_TORCHRUN")
    ]
    assert "FORCE_TORCHRUN=1" in problems[0].fix
    assert world.read_world(CONFIG, {}, make_ctx("mi300x"))[1] == []  # one node, one GPU: nothing asked


def test_when_planning_the_gpus_per_node_decide_whether_torchrun_starts():
    target = Target(arch="gfx942", alias="mi300x", named_by="--gpu")
    ctx = dataclasses.replace(make_ctx("cpu_only", target=target), snapshot=planned_snapshot(target, {}))
    one_each = world.read_world(CONFIG, {"NNODES": "2", "NPROC_PER_NODE": "1"}, ctx)[1]
    assert [f.code for f in one_each] == ["WORLD_NOT_LAUNCHED"]
    assert world.read_world(CONFIG, {"NNODES": "2", "NPROC_PER_NODE": "8"}, ctx)[0].size == 16
    assert world.read_world(CONFIG, {"NNODES": "2"}, ctx)[1] == []  # the target's GPU count is not known


def test_the_torchrun_condition_and_the_switch_words_are_llamafactorys(monkeypatch):
    """starts_torchrun and env_enabled mirror LLaMA-Factory's launcher line and is_env_enabled: the line is
    pinned, and env_enabled answers as the real function does for each spelling."""
    import inspect

    from llamafactory_rocm.lf.text_only import text_only_llamafactory
    from llamafactory_rocm.rules.base import env_enabled

    with text_only_llamafactory():
        from llamafactory import launcher
        from llamafactory.extras.misc import is_env_enabled
    from llamafactory_rocm.lf.keys import installed_llamafactory_version
    from llamafactory_rocm.lf.launcher_source import torchrun_switches

    source = " ".join(inspect.getsource(launcher.launch).split())
    assert 'is_env_enabled("FORCE_TORCHRUN") or (get_device_count() > 1 and not use_ray() and not use_kt())' in source
    # The forcing line of each release (0.9.5: USE_MCA; main: USE_MCA or USE_MEGATRON_BRIDGE), and the
    # switches read from it.
    forcing = {
        "0.9.5": 'if is_env_enabled("USE_MCA"): # force use torchrun os.environ["FORCE_TORCHRUN"] = "1"',
        "0.9.6.dev0": 'if is_env_enabled("USE_MCA") or is_env_enabled("USE_MEGATRON_BRIDGE"): # force use torchrun '
        'os.environ["FORCE_TORCHRUN"] = "1"',
    }
    expected = {
        "0.9.5": ("FORCE_TORCHRUN", "USE_MCA"),
        "0.9.6.dev0": ("FORCE_TORCHRUN", "USE_MCA", "USE_MEGATRON_BRIDGE"),
    }
    version = installed_llamafactory_version()
    assert forcing[version] in source
    assert torchrun_switches() == expected[version]
    for switch in expected[version]:
        assert world.starts_torchrun({switch: "1"}, make_ctx("cpu_only"))
    for value in ("1", "0", "true", "True", "y", "Y", "yes", "on", "false", ""):
        monkeypatch.setenv("FORCE_TORCHRUN", value)
        assert env_enabled({"FORCE_TORCHRUN": value}, "FORCE_TORCHRUN") is is_env_enabled("FORCE_TORCHRUN"), value
    monkeypatch.delenv("OPTIM_TORCH", raising=False)
    assert env_enabled({}, "OPTIM_TORCH", "1") is is_env_enabled("OPTIM_TORCH", "1")


def _steps_per_epoch(rows: int, batch: int, ranks: int, accumulation: int) -> int:
    """The oracle: accelerate's own sharding of the trainer's DataLoader over the ranks (what Trainer.prepare
    hands each rank), then transformers' update steps per epoch (trainer.py: len_dataloader //
    gradient_accumulation_steps + int(len_dataloader % gradient_accumulation_steps > 0))."""
    import torch
    from accelerate.data_loader import prepare_data_loader

    loader = torch.utils.data.DataLoader(range(rows), batch_size=batch)
    per_rank = len(prepare_data_loader(loader, num_processes=ranks, process_index=0, put_on_device=False))
    return max(per_rank // accumulation + int(per_rank % accumulation > 0), 1)


@pytest.mark.parametrize(("rows", "accumulation"), [(300, 1), (270, 2), (129, 1), (1000, 3), (17, 1)])
def test_steps_per_epoch_when_the_dataset_size_is_known(rows, accumulation):
    config = {**CONFIG, "gradient_accumulation_steps": accumulation}
    plan = findings(world.world_batch, config, TWO_NODES, with_rows(make_ctx("mi300x_8gpu"), rows))["WORLD_PLAN"]
    if rows < 8 * accumulation * 16:
        assert "optimizer steps per epoch" not in plan.message  # GLOBAL_BATCH_OVER_DATASET says it instead
        return
    steps = _steps_per_epoch(rows, 8, 16, accumulation)
    assert f"{rows} rows make {steps} optimizer steps per epoch" in plan.message


def test_a_global_batch_larger_than_the_data_is_a_warning_with_the_arithmetic():
    found = findings(world.world_batch, CONFIG, TWO_NODES, with_rows(make_ctx("mi300x_8gpu"), 64))
    refused = found["GLOBAL_BATCH_OVER_DATASET"]  # a warning: LLaMA-Factory trains it
    assert refused.level is Level.WARNING and (refused.old, refused.new) == (128, 64)
    assert "8 x gradient_accumulation_steps 1 x world 16 (2 nodes x 8) = 128" in refused.message
    assert "64 training rows" in refused.message


def ds_config(tmp_path: Path, **numbers: object) -> str:
    data = json.loads((Path(__file__).parents[1] / "presets" / "deepspeed" / "ds_z2_config.json").read_text())
    data.update(numbers)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_deepspeed_numbers_that_the_world_does_not_make_are_refused(tmp_path):
    config = {**CONFIG, "per_device_train_batch_size": 16, "deepspeed": ds_config(tmp_path, train_batch_size=128)}
    refused = findings(world.world_batch, config, TWO_NODES, make_ctx("mi300x_8gpu"))["GLOBAL_BATCH_MISMATCH"]
    assert refused.level is Level.ERROR and refused.old == {"train_batch_size": 128}
    assert refused.new == {"train_batch_size": 256}
    assert "16 x gradient_accumulation_steps 1 x world 16 (2 nodes x 8) = 256" in refused.message
    # the same JSON is right for one node of eight: 16 x 1 x 8 = 128
    one_node = {**TWO_NODES, "NNODES": "1"}
    assert "GLOBAL_BATCH_MISMATCH" not in findings(world.world_batch, config, one_node, make_ctx("mi300x_8gpu"))


def test_deepspeed_auto_values_always_add_up(tmp_path):
    config = {**CONFIG, "deepspeed": ds_config(tmp_path)}
    assert "GLOBAL_BATCH_MISMATCH" not in findings(world.world_batch, config, TWO_NODES, make_ctx("mi300x_8gpu"))


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"NNODES": "2", "NODE_RANK": "2"}, "NODE_RANK"),
        ({"NNODES": "two"}, "NNODES"),
        ({"NPROC_PER_NODE": "0"}, "NPROC_PER_NODE"),
        ({"NNODES": "2", "RDZV_ID": "x", "MIN_NNODES": "3", "MAX_NNODES": "2"}, "MIN_NNODES"),
    ],
)
def test_torchrun_values_that_cannot_work_are_refused(env, key):
    (refused,) = world.world_rules(CONFIG, env, make_ctx("mi300x_8gpu")).findings
    assert (refused.code, refused.level, refused.key) == ("WORLD_INVALID", Level.ERROR, key)


def test_elastic_memory_is_sized_for_the_fewest_nodes():
    env = {"NNODES": "4", "NPROC_PER_NODE": "8", "RDZV_ID": "job", "MIN_NNODES": "2", "MAX_NNODES": "4"}
    ctx = make_ctx("mi300x_8gpu")
    assert world.world_size(CONFIG, env, ctx) == 16
    plan = findings(world.world_batch, CONFIG, env, ctx)["WORLD_PLAN"]
    assert "= 256" in plan.message and "elastic: 128 with 2 nodes" in plan.message


def test_full_finetuning_memory_shards_over_both_nodes(tmp_path):
    ctx = dataclasses.replace(make_ctx("mi300x_8gpu"), model_config=_llama3_config())
    config = {**CONFIG, "finetuning_type": "full", "bf16": True, "model_name_or_path": LLAMA3,
              "deepspeed": ds_config(tmp_path), "per_device_train_batch_size": 2}  # fmt: skip
    one = memory_fit.memory_fit(config, {"NPROC_PER_NODE": "8"}, ctx).findings[0]
    two = memory_fit.memory_fit(config, {"NNODES": "2", "NPROC_PER_NODE": "8"}, ctx).findings[0]
    assert two.level is Level.INFO and "ZeRO-2 shards the trainable state over world 16" in two.message
    assert "over world 8" in one.message
    assert float(two.message.split("peak ")[1].split()[0]) < float(one.message.split("peak ")[1].split()[0])


def _llama3_config() -> dict:
    from llamafactory_rocm.lf.memory import model_config_for

    found = model_config_for(LLAMA3)
    assert found is not None
    return found


def test_two_nodes_without_a_network_interface_or_master_address_warn_with_the_fix():
    env = {"NNODES": "2", "NPROC_PER_NODE": "8", "NCCL_SOCKET_IFNAME": "ens", **MI300X_TUNED}
    found = findings(world.network, CONFIG, env, make_ctx("mi300x_8gpu"))
    iface = found["RCCL_SOCKET_IFNAME_UNSET"]
    assert iface.level is Level.WARNING and iface.key == "GLOO_SOCKET_IFNAME"
    assert "NCCL_SOCKET_IFNAME=ens is set" in iface.message and "export GLOO_SOCKET_IFNAME=<if>" in iface.fix
    assert "unset (LLaMA-Factory then uses 127.0.0.1)" in found["MASTER_ADDR_LOOPBACK"].message
    assert set(found) == {"RCCL_SOCKET_IFNAME_UNSET", "MASTER_ADDR_LOOPBACK"}
    assert findings(world.network, CONFIG, {**TWO_NODES, **MI300X_TUNED}, make_ctx("mi300x_8gpu")) == {}


def test_one_node_needs_no_network_interface():
    env = {"NPROC_PER_NODE": "8", **MI300X_TUNED}
    assert findings(world.network, CONFIG, env, make_ctx("mi300x_8gpu")) == {}


def test_mi300x_settings_say_what_is_set_what_differs_and_what_is_missing():
    env = {**TWO_NODES, "NCCL_MIN_NCHANNELS": "32", "TORCH_NCCL_HIGH_PRIORITY": "1"}
    found = findings(world.network, CONFIG, env, make_ctx("mi300x_8gpu"))["RCCL_ENV_MI300X"]
    assert found.level is Level.INFO
    assert "set: TORCH_NCCL_HIGH_PRIORITY=1" in found.message
    assert "set otherwise: NCCL_MIN_NCHANNELS=32" in found.message
    assert "missing: HIP_FORCE_DEV_KERNARG, HSA_NO_SCRATCH_RECLAIM" in found.message
    assert found.fix == "export NCCL_MIN_NCHANNELS=112 HIP_FORCE_DEV_KERNARG=1 HSA_NO_SCRATCH_RECLAIM=1 on every node."


def test_iommu_pt_missing_on_one_gpu_nodes_is_said_once():
    snap = load_snapshot("mi300x").model_copy(update={"iommu_pt": False})
    ctx = dataclasses.replace(make_ctx("mi300x"), snapshot=snap)
    env = {**TWO_NODES, "NPROC_PER_NODE": "1", "FORCE_TORCHRUN": "1", **MI300X_TUNED}  # one GPU: torchrun forced
    assert set(findings(world.network, CONFIG, env, ctx)) == {"IOMMU_PT_MISSING"}
    eight = make_ctx("mi300x_8gpu")
    eight = dataclasses.replace(eight, snapshot=eight.snapshot.model_copy(update={"iommu_pt": False}))
    # eight GPUs: multi_gpu already says it for this node
    assert "IOMMU_PT_MISSING" not in findings(world.network, CONFIG, {**TWO_NODES, **MI300X_TUNED}, eight)


@pytest.mark.parametrize("name", ["cpu_only", "cuda_h200"])
def test_rccl_advice_is_for_rocm_only(name):
    assert findings(world.network, CONFIG, {"NNODES": "2", "NPROC_PER_NODE": "2"}, make_ctx(name)) == {}


def test_planning_turns_this_shells_network_variables_into_advice():
    target = Target(arch="gfx942", alias="mi300x", named_by="--gpu")
    base = make_ctx("cpu_only", target=target)
    ctx = dataclasses.replace(base, snapshot=planned_snapshot(target, {}))
    found = findings(world.network, CONFIG, {"NNODES": "2", "NPROC_PER_NODE": "8"}, ctx)
    assert found["RCCL_SOCKET_IFNAME_UNSET"].level is Level.INFO
    assert found["MASTER_ADDR_LOOPBACK"].level is Level.INFO


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1"}, "trains on GPU 0"),
        ({"RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES": "1"}, "trains on GPU 0"),
        ({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}, "invalid device ordinal"),
        ({"ROCR_VISIBLE_DEVICES": "0,1"}, "Please use HIP_VISIBLE_DEVICES"),
    ],
)
def test_ray_on_rocm_refuses_visible_device_variables_the_worker_misreads(env, words):
    (refused,) = world.ray_visible_devices(CONFIG, {"USE_RAY": "1", **env}, make_ctx("mi300x_8gpu")).findings
    assert refused.code == "RAY_ROCM_VISIBLE_DEVICES" and refused.level is Level.ERROR
    assert words in refused.message


@pytest.mark.parametrize(
    "env",
    [
        {"USE_RAY": "1"},  # Ray narrows HIP_VISIBLE_DEVICES per worker, LOCAL_RANK 0: right
        {"USE_RAY": "1", "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1",
         "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"},  # all visible, LOCAL_RANK from Ray: right
        {"USE_RAY": "1", "ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0,1"},
        {"RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1"},  # no Ray: nothing reads it
    ],
)  # fmt: skip
def test_ray_settings_that_work_pass(env):
    assert world.ray_visible_devices(CONFIG, env, make_ctx("mi300x_8gpu")).findings == []


def test_ray_on_a_machine_without_a_gpu_is_refused_it_never_schedules():
    env = {"USE_RAY": "1", "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1"}
    (refused,) = world.ray_visible_devices(CONFIG, env, make_ctx("cpu_only")).findings
    assert refused.code == "RAY_CPU_UNSCHEDULABLE" and refused.level is Level.ERROR
    # LLaMA-Factory's own bundle, read from its source on either line (get_placement_group: bundle = {"CPU": 10},
    # plus a device entry only where get_device_name is not CPU)
    import inspect

    from llamafactory_rocm.lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.train.trainer_utils import get_placement_group
    source = inspect.getsource(get_placement_group)
    cpus = int(source.split('bundle = {"CPU": ')[1].split("}")[0])
    assert f"bundle of {{'CPU': {cpus}}} per device" in refused.message
    assert world.ray_visible_devices(CONFIG, env, make_ctx("cuda_h200")).findings == []  # a GPU: not ROCm's


def test_ray_world_is_its_workers():
    found = findings(world.world_batch, {**CONFIG, "ray_num_workers": 4}, {"USE_RAY": "1"}, make_ctx("mi300x_8gpu"))
    assert "x world 4 (1 node x 4) = 32" in found["WORLD_PLAN"].message


def test_the_rule_runs_in_the_chain_before_the_memory_estimate():
    ctx = dataclasses.replace(make_ctx("mi300x_8gpu"), model_config=_llama3_config())
    config = {**CONFIG, "model_name_or_path": LLAMA3, "bf16": True, "flash_attn": "sdpa"}
    codes = [f.code for f in resolve(config, {**TWO_NODES, **MI300X_TUNED}, ctx).findings]
    assert "WORLD_PLAN" in codes and codes.index("WORLD_PLAN") < codes.index("MEMORY_ESTIMATE")


def test_snapshot_fixture_is_the_eight_gpu_one():
    snap: Snapshot = load_snapshot("mi300x_8gpu")
    assert len(snap.devices) == 8 and snap.gpu_base_archs == ["gfx942"]


def test_every_value_transformers_matches_against_the_deepspeed_json_is_checked(tmp_path):
    """The keys come from transformers' own trainer_config_process (read from its source here), so a key
    it adds or drops is still checked as it checks it; each pinned to a wrong value is reported."""
    import inspect
    import re

    from transformers.integrations import deepspeed as hf_deepspeed

    source = inspect.getsource(hf_deepspeed.HfTrainerDeepSpeedConfig.trainer_config_process)
    keys = re.findall(r'self\.fill_match\(\s*"([^"]+)"', source)
    assert {"train_batch_size", "gradient_clipping", "optimizer.params.lr", "bf16.enabled"} <= set(keys)
    # the probe stands on accelerate's HfDeepSpeedConfig, the base transformers gives it with DeepSpeed installed
    assert "from accelerate.utils.deepspeed import HfDeepSpeedConfig as DeepSpeedConfig" in inspect.getsource(
        hf_deepspeed
    )
    ds: dict = {}
    for key in keys:
        *parents, leaf = key.split(".")
        node = ds
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = [0.123, 0.456] if leaf == "betas" else 12345
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    found = world.deepspeed_mismatches({"deepspeed": str(path)}, world_size=2)
    assert set(found) == set(keys)
    codes = findings(world.world_batch, {**CONFIG, "deepspeed": str(path)}, TWO_NODES, make_ctx("mi300x_8gpu"))
    assert {"GLOBAL_BATCH_MISMATCH", "DEEPSPEED_MISMATCH"} <= set(codes)
    assert "optimizer.params.lr=12345 vs hf learning_rate" in codes["DEEPSPEED_MISMATCH"].message
