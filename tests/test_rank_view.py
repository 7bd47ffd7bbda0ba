"""The verdict is a rank's (check/rank.py), tested on simulated nodes (tests/simulated_node.py).

Where LLaMA-Factory's launcher starts torchrun, every rank runs ``run_exp`` with one device and torchrun's
variables; the check judges the config the same way. The oracle of the node corpus is stock
LLaMA-Factory (hook off) in the world its launcher starts: real torchrun ranks on the CPU
(``FORCE_TORCHRUN=1 NPROC_PER_NODE=2``), or ``llamafactory-cli train`` on a simulated node whose
launcher sees the node's GPUs and starts that many ranks. A simulation, not a measurement on AMD.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm import presets
from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.findings import Level
from tests.conftest import load_snapshot, offline_env, tiny_train_config
from tests.simulated_node import device_count, node_env, simulated_node
from tests.stock_runner import hook_off_env

# The node each preset is written for: its GPU's recorded snapshot (an MI250X shows two GCDs, so its
# node has 2 devices), and the 8-GPU node for the presets of 8 and 16 ranks.
PRESET_NODE = {"mi250": "mi250x", "mi300x": "mi300x", "mi355x": "mi355x", "r9700": "r9700",
               "rx7800xt": "rx7800xt", "rx7900xtx": "rx7900xtx", "rx9070xt": "rx9070xt", "strixhalo": "strixhalo",
               "w7900": "w7900"}  # fmt: skip
NODE_PACKAGES = {"bitsandbytes": "0.49.0", "deepspeed": "0.16.9"}
# presets/mi300x_llama3_lora_2node.yaml's own header: what every node exports.
TWO_NODE_ENV = {"FORCE_TORCHRUN": "1", "NNODES": "2", "NODE_RANK": "0", "NPROC_PER_NODE": "8",
                "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}  # fmt: skip


def _node_of(name: str) -> str:
    entry = presets.entry(name)
    return "mi300x_8gpu" if entry.gpus > 1 else PRESET_NODE[entry.gpu]


@pytest.mark.parametrize("name", presets.names())
def test_every_preset_is_ready_on_its_own_simulated_node(name, monkeypatch):
    node = _node_of(name)
    world = TWO_NODE_ENV if presets.entry(name).gpus > 8 else {}
    for key, value in world.items():
        monkeypatch.setenv(key, value)
    # The node a preset is written for has the packages its header installs (QLoRA: bitsandbytes >= 0.49;
    # the multi-GPU presets: DeepSpeed); the recorded snapshots list them as absent.
    snapshot = load_snapshot(node)
    snapshot = snapshot.model_copy(update={"packages": {**snapshot.packages, **NODE_PACKAGES}})
    with simulated_node(node):
        report = check_config(
            presets.load(name), snapshot=snapshot, config_path=presets.path(name), env={**snapshot.env, **world}
        )
    assert [f.line() for f in report.findings if f.level is Level.ERROR] == []
    codes = [f.code for f in report.findings]
    assert ("JUDGED_AS_RANK" in codes) is (device_count(node) > 1 or bool(world))


def test_the_eight_gpu_node_judged_as_one_plain_process_is_what_llamafactory_refuses(tmp_path):
    """Why the rank's view: on the simulated 8-GPU node LLaMA-Factory's own get_train_args, called in one
    plain process (what 0.1.x did), refuses the 8-GPU preset that its launcher starts as 8 ranks."""
    from llamafactory_rocm.lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.hparams import get_train_args
    config = presets.load("mi300x_llama3_lora_8gpu")
    config.pop("deepspeed")
    config.update(output_dir=str(tmp_path / "out"), model_name_or_path=str(tmp_path))
    with simulated_node("mi300x_8gpu"), pytest.raises(ValueError, match="Please launch distributed training"):
        get_train_args(config)


def test_the_rank_view_leaves_no_process_group_and_the_environment_as_it_was(tiny_model, tmp_path, monkeypatch):
    import os

    import torch.distributed as dist

    monkeypatch.setenv("FORCE_TORCHRUN", "1")
    monkeypatch.setenv("NPROC_PER_NODE", "2")
    import torch

    before, threads = dict(os.environ), torch.get_num_threads()
    report = check_config(tiny_train_config(tiny_model, tmp_path / "out", max_steps=1), env=dict(os.environ))
    assert report.ok, [f.line() for f in report.findings if f.level is Level.ERROR]
    assert "JUDGED_AS_RANK" in [f.code for f in report.findings]
    assert not dist.is_initialized()
    assert dict(os.environ) == before
    assert torch.get_num_threads() == threads


# -- the node corpus: the check's verdict against stock LLaMA-Factory in the same world -----------------
TORCHRUN_CPU = {"FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2"}
WORLDS = {
    "torchrun_2_cpu": (None, TORCHRUN_CPU),  # real torchrun ranks, gloo
    "node_2_gpus": ("mi250x", {}),  # launcher sees 2 simulated GPUs -> 2 ranks
    "node_8_gpus": ("mi300x_8gpu", {"NPROC_PER_NODE": "2"}),  # 8 visible, 2 ranks (8 CPU ranks are too many here)
    "one_process": (None, {}),
}
DEEPSPEED = Path(__file__).resolve().parents[1] / "presets" / "deepspeed" / "ds_z2_config.json"
ZERO3 = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
         "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 3}}  # fmt: skip
# id: (world, config overrides, extra environment)
NODE_CASES = {
    "plain_torchrun": ("torchrun_2_cpu", {}, {}),
    "plain_node_2": ("node_2_gpus", {}, {}),
    "plain_node_8": ("node_8_gpus", {}, {}),
    "batch_zero_torchrun": ("torchrun_2_cpu", {"per_device_train_batch_size": 0}, {}),
    "zero2_json_torchrun": ("torchrun_2_cpu", {"deepspeed": str(DEEPSPEED)}, {}),
    "zero3_json_node_2": ("node_2_gpus", {"deepspeed": "ZERO3"}, {}),
    "zero2_json_one_process": ("one_process", {"deepspeed": str(DEEPSPEED)}, {}),
    "nccl_on_cpu_torchrun": ("torchrun_2_cpu", {"ddp_backend": "nccl"}, {}),
    "ray_without_ray": ("one_process", {}, {"USE_RAY": "1"}),
}


def _case_files(case: str, tiny_model: Path, work: Path) -> tuple[Path, dict[str, str], str | None]:
    world, overrides, extra = NODE_CASES[case]
    node, world_env = WORLDS[world]
    folder = work / case
    folder.mkdir(parents=True)
    overrides = dict(overrides)
    if overrides.get("deepspeed") == "ZERO3":
        (folder / "z3.json").write_text(json.dumps(ZERO3))
        overrides["deepspeed"] = str(folder / "z3.json")
    config = tiny_train_config(tiny_model, folder / "out", max_steps=1, **overrides)
    path = folder / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, {**world_env, **extra}, node


def _stock_env(path: Path, env_extra: dict[str, str], node: str | None) -> dict[str, str]:
    env = hook_off_env(path.parent, **env_extra)
    return node_env(node, env) if node is not None else env


def _stock(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["llamafactory-cli", "train", str(path)], cwd=path.parent, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


@contextlib.contextmanager
def _environ(env: dict[str, str]):
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _check(path: Path, env_extra: dict[str, str], node: str | None) -> dict:
    """`llamafactory-rocm check` as the user runs it in that world, in this process: the machine probed
    (on a simulated node, torch answers as the node), the world's variables in the environment."""
    from llamafactory_rocm.check.config_io import load_config
    from llamafactory_rocm.cli.main import main as cli_main

    env = offline_env(path.parent, **env_extra)
    node_context = simulated_node(node) if node is not None else contextlib.nullcontext()
    out = io.StringIO()
    with _environ(env), node_context, contextlib.redirect_stdout(out), contextlib.chdir(path.parent):
        assert load_config(path)  # the file is what the stock run reads
        code = cli_main(["check", str(path), "--json"])
    return {"exit": code, "out": out.getvalue()}


@pytest.fixture(scope="module")
def node_corpus(tiny_model, tmp_path_factory):
    """Each case run in its world twice: stock LLaMA-Factory (hook off, a subprocess, two at a time) and
    `llamafactory-rocm check` (in this process, meanwhile)."""
    work = tmp_path_factory.mktemp("node-corpus")
    files = {case: _case_files(case, tiny_model, work) for case in NODE_CASES}
    with ThreadPoolExecutor(max_workers=2) as pool:
        envs = {case: _stock_env(*files[case]) for case in NODE_CASES}  # before this process's env changes
        stock = {case: pool.submit(_stock, files[case][0], envs[case]) for case in NODE_CASES}
        checked = {case: _check(*files[case]) for case in NODE_CASES}
        return {case: (stock[case].result(), checked[case]) for case in NODE_CASES}


@pytest.mark.trainer
@pytest.mark.parametrize("case", list(NODE_CASES))
def test_the_check_agrees_with_stock_llamafactory_in_the_world_its_launcher_starts(case, node_corpus):
    stock, checked = node_corpus[case]
    trained = stock.returncode == 0
    log = (stock.stdout + stock.stderr)[-2500:]
    assert checked["exit"] in (0, 1), f"check must answer, not crash: {checked['out'][-3000:]}"
    report = json.loads(checked["out"])
    errors = [f["code"] for f in report["findings"] if f["level"] == "error"]
    assert (checked["exit"] == 0) is trained, f"stock {'trained' if trained else 'stopped'}; check: {errors}\n{log}"
    world = WORLDS[NODE_CASES[case][0]]
    if trained and (world[0] is not None or world[1]):  # a torchrun world: the check judged as its rank
        assert "JUDGED_AS_RANK" in [f["code"] for f in report["findings"]]


def test_the_corpus_covers_each_world_and_both_verdicts(node_corpus):
    """A corpus of one verdict or one world cannot tell a rank's view from a plain process's."""
    assert {NODE_CASES[case][0] for case in NODE_CASES} == set(WORLDS)
    verdicts = {stock.returncode == 0 for stock, _ in node_corpus.values()}
    assert verdicts == {True, False}


# -- the hook on a simulated 2-GPU node ----------------------------------------------------------------
def _train_on_node(node: str, folder: Path) -> subprocess.CompletedProcess[str]:
    env = node_env(node, offline_env(folder))
    return subprocess.run(["llamafactory-cli", "train", str(folder / "train.yaml")], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


@pytest.mark.trainer
def test_the_hook_on_a_simulated_two_gpu_node_trains_with_the_rewrites_on_both_ranks(tiny_model, tmp_path):
    """A blog key the check drops (backend: pt) would stop any rank that still had it (LLaMA-Factory's parser:
    'Some keys are not used'): both ranks train, so both trained the rewritten config; one record."""
    from llamafactory_rocm.check.record import latest_record

    config = tiny_train_config(tiny_model, tmp_path / "out", max_steps=2, backend="pt")
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    proc = _train_on_node("mi250x", tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "Initializing 2 distributed tasks" in log  # LLaMA-Factory's launcher saw the node's 2 GPUs
    assert sorted(p.name for p in (tmp_path / "out").glob("rocm_launch*.json")) == ["rocm_launch.json"]
    record = latest_record(tmp_path / "out")
    assert "backend" not in record["resolved_config"]
    codes = [f["code"] for f in record["findings"]]
    assert "BACKEND_DROPPED" in codes
    assert "JUDGED_AS_RANK" in codes
    assert json.loads((tmp_path / "out" / "trainer_state.json").read_text())["global_step"] == 2


@pytest.mark.trainer
def test_a_refusal_on_a_simulated_two_gpu_node_stops_both_ranks_said_once(tiny_model, tmp_path):
    config = tiny_train_config(tiny_model, tmp_path / "out", max_steps=2, learning_rat=1.0e-4)
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    proc = _train_on_node("mi250x", tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert log.count("[error] UNKNOWN_KEY") == 1, log[-4000:]
    assert "learning_rate" in log  # the fix names the real key
    assert "This is a bug" not in log
    assert not (tmp_path / "out" / "trainer_state.json").exists()


def test_planning_keeps_deepspeeds_resume_of_a_zero3_checkpoint(tiny_model, tmp_path):
    """Planning drops the deepspeed: key from the dry run (DeepSpeed and torchrun are the target's), but the
    checkpoint is still judged as DeepSpeed resumes it: a ZeRO-3 folder (latest + global_step*, no gathered
    weights) is what transformers' deepspeed_load_checkpoint reads, so it is not CHECKPOINT_NOT_LOADABLE."""
    from tests.test_verdict_corpus import deepspeed_zero3_checkpoint

    config = tiny_train_config(tiny_model, tmp_path / "out", max_steps=30)
    deepspeed_zero3_checkpoint(True)(tmp_path, config)
    report = check_config(config, gpu="mi300x", env={"NPROC_PER_NODE": "8"})
    codes = [f.code for f in report.findings]
    assert "CHECKPOINT_NOT_LOADABLE" not in codes, [f.line() for f in report.findings if f.level is Level.ERROR]
    assert "JUDGED_AS_RANK" in codes
    without = {k: v for k, v in config.items() if k != "deepspeed"}  # the same folder without DeepSpeed is refused
    assert "CHECKPOINT_NOT_LOADABLE" in [f.code for f in check_config(without, gpu="mi300x").findings]
