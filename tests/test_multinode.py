"""Several nodes, one run: the agreement before step 1 (agreement.py) and `check --nodes/--gpus-per-node`.

The two-node runs start two stock ``llamafactory-cli train`` commands on this host, as two nodes would
(FORCE_TORCHRUN=1 NNODES=2 NODE_RANK=0/1 NPROC_PER_NODE=1 MASTER_ADDR=127.0.0.1, gloo), each in its own
working directory with its own output_dir, as real nodes have their own disks.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm import presets
from llamafactory_rocm.errors import EXIT_FINDINGS, EXIT_NODES_DISAGREE, EXIT_OK, EXIT_USAGE
from llamafactory_rocm.train.agreement import differences, disagreement, log_line, node_facts
from tests.conftest import SNAPSHOTS, load_snapshot, offline_env, tiny_train_config
from tests.rank_record import RANKS_ENV
from tests.simulated_node import node_env

LLAMAFACTORY_CLI = str(Path(sys.executable).parent / "llamafactory-cli")
PRESET = "mi300x_llama3_lora_2node"


def free_port() -> int:
    """A port free now and below the kernel's ephemeral range (ip_local_port_range): a port got by binding port
    0 is in that range, where any process's outgoing connection (gloo's, a TCPStore client's) may take it
    between this check and torchrun's bind; below it only an explicit bind can."""
    import random

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    for _ in range(200):
        port = random.randrange(20000, max(low, 20001))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between 20000 and {low}")


def other_arch_snapshot(tmp_path: Path) -> Path:
    """The recorded 8 x MI300X machine, and the same machine with MI250X-class devices (gfx90a)."""
    data = json.loads((SNAPSHOTS / "mi300x_8gpu.json").read_text())
    for device in data["devices"]:
        device["arch_name"] = "gfx90a:sramecc+:xnack-"
    path = tmp_path / "gfx90a_8gpu.json"
    path.write_text(json.dumps(data))
    return path


# ---------------------------------------------------------------- the agreement line, pure


def peer(node: int, facts: dict) -> dict:
    return {"node": node, "host": f"host{node}", "facts": facts}


def test_the_line_names_each_difference_and_the_nodes_holding_each_value():
    base = node_facts({"learning_rate": 2e-4, "lora_rank": 16, "output_dir": "/a"}, load_snapshot("mi300x_8gpu"))
    other = {**base, "learning_rate": 1e-4}
    peers = [peer(0, base), peer(0, base), peer(1, other), peer(1, other)]
    assert differences(peers) == ["learning_rate: 0.0002 on node 0 (host0), 0.0001 on node 1 (host1)"]
    line = log_line(disagreement(peers))
    assert line.startswith("llamafactory-rocm: [error] NODES_DISAGREE: the 2 nodes (4 ranks) disagree")
    assert "stopped before step 1" in line and "\n" not in line
    assert line.endswith("(more: llamafactory-rocm explain NODES_DISAGREE)")  # the fix is the code's entry
    accepted = log_line(disagreement(peers, accepted=True))
    assert accepted.startswith("llamafactory-rocm: [warning] NODES_DISAGREE: (accepted) the 2 nodes (4 ranks)")


def test_ranks_of_one_node_that_differ_are_named_by_rank():
    base = {"device count": 8}
    peers = [peer(0, base), peer(0, {"device count": 7}), peer(1, base), peer(1, base)]
    said = "device count: 8 on rank 0 (node 0, host0), node 1 (host1), 7 on rank 1 (node 0, host0)"
    assert differences(peers) == [said]


def test_per_node_paths_and_secrets_are_not_compared_but_file_contents_are(tmp_path):
    snap = load_snapshot("mi300x_8gpu")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text('{"zero_optimization": {"stage": 2}}')
    b.write_text('{"zero_optimization": {"stage": 2}}')
    one = node_facts({"output_dir": "/n0", "dataset_dir": "/n0/d", "hf_hub_token": "s0", "deepspeed": str(a)}, snap)
    two = node_facts({"output_dir": "/n1", "dataset_dir": "/n1/d", "hf_hub_token": "s1", "deepspeed": str(b)}, snap)
    assert one == two and "hf_hub_token" not in one
    b.write_text('{"zero_optimization": {"stage": 3}}')
    three = node_facts({"deepspeed": str(b)}, snap)
    assert three["deepspeed"] != one["deepspeed"]
    assert one["device arch"] == ["gfx942:sramecc+:xnack-"] and one["device count"] == 8


# ---------------------------------------------------------------- two gloo ranks, no trainer

AGREE_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch.distributed as dist
    from llamafactory_rocm.train.agreement import NodeAgreement, NodesDisagree
    from llamafactory_rocm.machine.snapshot import Snapshot

    rank = int(os.environ["RANK"])

    def say(line):  # one write per line: the two ranks share torchrun's stdout
        os.write(1, (line + "\\n").encode())

    config = {"learning_rate": 2e-4, "lora_rank": 16, "output_dir": f"/node{rank}/out"}
    dist.init_process_group("gloo")
    base = Snapshot.load(sys.argv[1])
    NodeAgreement(config, base).agree()  # equal: goes on
    say(json.dumps({"rank": rank, "equal": "passed"}))
    mine = Snapshot.load(sys.argv[2]) if rank == 1 else base  # this "node" records other devices
    os.environ["LLAMAFACTORY_ROCM_ACCEPT"] = "NODES_DISAGREE"
    NodeAgreement(config, mine).agree()  # accepted: said, goes on
    say(json.dumps({"rank": rank, "accepted": "passed"}))
    os.environ["LLAMAFACTORY_ROCM_ACCEPT"] = ""
    try:
        NodeAgreement(config, mine).agree()
    except NodesDisagree as stop:
        say(json.dumps({"rank": rank, "stopped": stop.code}))
        raise
    """
)


@pytest.mark.torchrun
def test_two_gloo_ranks_with_different_recorded_archs_stop_together(tmp_path):
    script = tmp_path / "agree.py"
    script.write_text(AGREE_SCRIPT)
    env = offline_env(tmp_path)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
               "127.0.0.1", "--master_port", str(free_port()), str(script), str(SNAPSHOTS / "mi300x_8gpu.json"),
               str(other_arch_snapshot(tmp_path))]  # fmt: skip
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    log = result.stdout + result.stderr
    said = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert {(s["rank"], next(iter(set(s) - {"rank"}))) for s in said} == {
        (0, "equal"), (1, "equal"), (0, "accepted"), (1, "accepted"), (0, "stopped"), (1, "stopped")}  # fmt: skip
    assert all(s["stopped"] == EXIT_NODES_DISAGREE for s in said if "stopped" in s)
    assert result.returncode != 0 and f"exitcode  : {EXIT_NODES_DISAGREE}" in log
    accepted = [
        ln for ln in log.splitlines() if ln.startswith("llamafactory-rocm: [warning] NODES_DISAGREE: (accepted)")
    ]
    stopped = [ln for ln in log.splitlines() if ln.startswith("llamafactory-rocm: [error] NODES_DISAGREE")]
    assert len(accepted) == 1 and len(stopped) == 1  # one line per node: both ranks are LOCAL_RANK 0 and 1 here
    # one torchrun, so one node: the ranks are named
    assert 'device arch: ["gfx942:sramecc+:xnack-"] on rank 0 (node 0, ' in stopped[0]
    assert '["gfx90a:sramecc+:xnack-"] on rank 1 (node 0, ' in stopped[0] and "learning_rate" not in stopped[0]


# ---------------------------------------------------------------- two nodes through stock llamafactory-cli


def start_node(rank: int, cwd: Path, config: Path, port: int, **extra: str) -> subprocess.Popen:
    env = offline_env(cwd, FORCE_TORCHRUN="1", NNODES="2", NODE_RANK=str(rank), NPROC_PER_NODE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    env.update(extra)
    env = node_env(None, env)  # tests/simnode's sitecustomize: the rank recorder where RANKS_ENV asks for it
    return subprocess.Popen([LLAMAFACTORY_CLI, "train", str(config)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def two_nodes(tmp_path: Path, configs: tuple[dict, dict], **every_node: str):
    port = free_port()
    procs = []
    for rank, config in enumerate(configs):
        node = tmp_path / f"node{rank}"
        node.mkdir()
        path = node / "run.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        procs.append(start_node(rank, node, path, port, **every_node))
    start = time.perf_counter()
    logs = [p.communicate(timeout=600)[0] for p in procs]
    wall = time.perf_counter() - start
    print(f"two-node wall time: {wall:.1f} s")  # shown with -s; the report quotes it
    return [p.returncode for p in procs], logs, wall


def node_config(model: Path, tmp_path: Path, rank: int, **overrides: object) -> dict:
    config = tiny_train_config(model, tmp_path / f"node{rank}" / "out", max_steps=2, save_steps=2, bf16=True)
    config.update(overrides)
    return config


@pytest.mark.torchrun
@pytest.mark.trainer
def test_two_nodes_train_with_identical_rewrites_and_one_record_per_node(tiny_model, tmp_path):
    from llamafactory_rocm.check.record import latest_record

    ranks = tmp_path / "ranks"
    configs = (node_config(tiny_model, tmp_path, 0), node_config(tiny_model, tmp_path, 1))
    codes, logs, _ = two_nodes(tmp_path, configs, **{RANKS_ENV: str(ranks)})
    assert codes == [EXIT_OK, EXIT_OK], logs[0][-3000:] + logs[1][-3000:]
    for rank, log in enumerate(logs):  # LLaMA-Factory's launcher, before the hook: each node joined as itself
        assert f"Multi-node training enabled: num nodes: 2, node rank: {rank}" in log
    assert not any("NODES_DISAGREE" in log for log in logs)
    outs = [tmp_path / f"node{rank}" / "out" for rank in (0, 1)]
    # Not a shared output_dir: the world's rank 0 writes the run's record, and node 1's first rank, which
    # cannot see it, writes its node's own.
    assert sorted(p.name for p in outs[0].glob("rocm_launch*.json")) == ["rocm_launch.json"]
    assert sorted(p.name for p in outs[1].glob("rocm_launch*.json")) == ["rocm_launch.node1.json"]
    records = [latest_record(out) for out in outs]
    assert [n["node"] for n in records[0]["nodes"]] == [0, 1]  # every node's facts, from the agreement
    resolved = [{k: v for k, v in r["resolved_config"].items() if k != "output_dir"} for r in records]
    assert resolved[0] == resolved[1] and resolved[0]["use_cpu"] is True  # the same rewrites on both
    codes_said = [sorted(f["code"] for f in record["findings"]) for record in records]
    assert codes_said[0] == codes_said[1]
    # In each rank, the hook's check ran LLaMA-Factory's parser as the world the rank's real parse then got
    # (tests/rank_record.py: torchrun's variables, TrainingArguments, torch.distributed, accelerate), and its
    # record says that rank.
    by_process: dict[int, list[dict]] = {}
    twins = []  # the hook's step 1 on a twin (lf/dry_step.py): a forked child that parses as one process
    for path in sorted(ranks.glob("*.json")):
        record = json.loads(path.read_text())
        if record["env"]["RANK"] is None:
            twins.append(record)
            continue
        by_process.setdefault(int(path.name.split("-")[0]), []).append(record)
    assert len(by_process) == 2
    assert all(t["training_args"]["parallel_mode"] == "not_parallel" and t["torch.distributed"] is None for t in twins)
    for parses in by_process.values():  # the hook's dry parses (its verdict, its dry launch), then the trainer's
        real = parses[-1]
        assert len(parses) >= 2 and all(parse == real for parse in parses), parses
        node = int(real["env"]["GROUP_RANK"])
        (said,) = [f["message"] for f in records[node]["findings"] if f["code"] == "JUDGED_AS_RANK"]
        assert f"as rank {real['env']['RANK']} of a torchrun world of {real['env']['WORLD_SIZE']} (1 per node" in said
    assert (outs[0] / "adapter_model.safetensors").is_file()  # global rank 0 saves the adapter
    assert json.loads((outs[0] / "trainer_state.json").read_text())["global_step"] == 2


@pytest.mark.torchrun
@pytest.mark.trainer
def test_two_nodes_sharing_an_output_dir_train_and_write_one_record(tiny_model, tmp_path):
    """On a cluster the output_dir is usually on a shared filesystem: one record, by the world's rank 0."""
    from llamafactory_rocm.check.record import latest_record

    shared = tmp_path / "shared"
    configs = tuple(node_config(tiny_model, tmp_path, rank, output_dir=str(shared)) for rank in (0, 1))
    codes, logs, _ = two_nodes(tmp_path, configs)
    assert codes == [EXIT_OK, EXIT_OK], logs[0][-3000:] + logs[1][-3000:]
    assert sorted(p.name for p in shared.glob("rocm_launch*.json")) == ["rocm_launch.json"]
    record = latest_record(shared)
    assert [n["node"] for n in record["nodes"]] == [0, 1] and record["nodes"][1]["ranks"] == [1]
    assert "host" not in json.dumps(record["nodes"])  # no host name in a record
    assert json.loads((shared / "trainer_state.json").read_text())["global_step"] == 2


@pytest.mark.torchrun
@pytest.mark.trainer
def test_a_node_whose_ranks_never_arrive_stops_the_others_after_the_timeout_naming_it(tiny_model, tmp_path):
    """Node 1's check refuses its config (a misspelt key), so its rank never checks in; node 0 does not wait
    for ddp_timeout: it stops after LLAMAFACTORY_ROCM_NODE_TIMEOUT, naming node 1, with exit code 5."""
    refused = node_config(tiny_model, tmp_path, 1, lora_rnk=8)
    started = time.perf_counter()
    codes, logs, _ = two_nodes(
        tmp_path, (node_config(tiny_model, tmp_path, 0), refused), LLAMAFACTORY_ROCM_NODE_TIMEOUT="20"
    )
    assert "UNKNOWN_KEY" in logs[1] and codes[1] == 1, logs[1][-3000:] + logs[0][-2000:]
    (line,) = [ln for ln in logs[0].splitlines() if ln.startswith("llamafactory-rocm: [error] NODES_MISSING")]
    assert "node 1 never arrived within 20 s" in line
    assert f"exitcode  : {EXIT_NODES_DISAGREE}" in logs[0] and codes[0] == 1  # torchrun's summary, then the CLI's 1
    assert time.perf_counter() - started < 300
    assert not list((tmp_path / "node0" / "out").glob("checkpoint-*"))


@pytest.mark.torchrun
@pytest.mark.trainer
def test_nodes_that_differ_in_config_stop_before_step_1_naming_them(tiny_model, tmp_path):
    other = node_config(tiny_model, tmp_path, 1, learning_rate=1e-2, lora_rank=8)
    configs = (node_config(tiny_model, tmp_path, 0), other)
    # Both nodes are this host: the machines' facts are equal here; a node with other devices is the gloo
    # test's (test_two_gloo_ranks_with_different_recorded_archs_stop_together).
    codes, logs, _ = two_nodes(tmp_path, configs)
    for log in logs:
        (line,) = [ln for ln in log.splitlines() if ln.startswith("llamafactory-rocm: [error] NODES_DISAGREE")]
        assert "learning_rate: 0.02 on node 0" in line and "0.01 on node 1" in line
        assert "lora_rank: 16 on node 0" in line and "8 on node 1" in line
        assert f"exitcode  : {EXIT_NODES_DISAGREE}" in log  # every rank's own exit code, in torchrun's summary
    assert codes == [1, 1]  # llamafactory-cli itself: LLaMA-Factory's launcher ends with CalledProcessError
    for rank in (0, 1):
        out = tmp_path / f"node{rank}" / "out"
        assert not list(out.glob("checkpoint-*")) and not (out / "adapter_model.safetensors").exists()
        assert not (out / "trainer_state.json").exists()


# ---------------------------------------------------------------- check plans the world


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    from llamafactory_rocm.cli.main import main

    code = main(["check", *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.fixture
def clean_world(monkeypatch: pytest.MonkeyPatch) -> None:
    from llamafactory_rocm.machine.snapshot import WORLD_ENV_VARS

    for name in (*WORLD_ENV_VARS, "WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def test_check_plans_the_two_node_preset_clean(capsys, clean_world, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out = check(capsys, str(presets.path(PRESET)), "--nodes", "2", "--gpus-per-node", "8")
    assert code == EXIT_OK, out
    assert "[error]" not in out and "[warning]" not in out
    assert "per_device_train_batch_size 8 x gradient_accumulation_steps 1 x world 16 (2 nodes x 8) = 128" in out
    assert "ZeRO-2 shards the trainable state over world 16" in out
    assert "missing: NCCL_MIN_NCHANNELS" in out  # RCCL advice for the nodes, as information when planning


def test_check_refuses_a_global_batch_the_deepspeed_json_does_not_make(capsys, clean_world, tmp_path):
    written = presets.copy(PRESET, tmp_path / "run.yaml")
    ds = tmp_path / "deepspeed" / "ds_z2_config.json"
    ds.write_text(json.dumps({**json.loads(ds.read_text()), "train_batch_size": 128}))
    code, out = check(capsys, str(written[0]), "per_device_train_batch_size=16", "--nodes", "2", "--gpus-per-node", "8")
    assert code == EXIT_FINDINGS
    (line,) = [ln for ln in out.splitlines() if "GLOBAL_BATCH_MISMATCH" in ln and "[error]" in ln]
    assert "ds train_batch_size=128 vs hf train_batch_size (calculated)=256" in line  # transformers' words
    assert "16 x gradient_accumulation_steps 1 x world 16 (2 nodes x 8) = 256" in line


def test_check_refuses_memory_that_does_not_fit_with_the_arithmetic(capsys, clean_world, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = (str(presets.path(PRESET)), "per_device_train_batch_size=64", "--nodes", "2", "--gpus-per-node", "8")
    code, out = check(capsys, *args)
    assert code == EXIT_FINDINGS
    (line,) = [ln for ln in out.splitlines() if "MEMORY_OVER_DEVICE" in ln and "[error]" in ln]
    assert "weights 15.0 + optimizer state" in line and "ZeRO-2 shards the trainable state over world 16" in line
    assert "per_device_train_batch_size 64 x gradient_accumulation_steps 1 x world 16 (2 nodes x 8) = 1024" in out


def test_world_options_refuse_what_is_not_a_count(capsys, clean_world, tmp_path):
    from llamafactory_rocm.cli.main import main

    with pytest.raises(SystemExit) as stop:
        main(["check", str(presets.path(PRESET)), "--nodes", "0"])
    assert stop.value.code == EXIT_USAGE
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--nodes" in line and "at least 1" in line


def test_the_slurm_script_starts_the_preset_on_every_node_from_slurms_variables():
    script = (Path(__file__).parents[1] / "presets" / "slurm" / "mi300x_2node.sbatch").read_text()
    for needed in ("NNODES=$SLURM_NNODES", "NODE_RANK=$SLURM_NODEID", "scontrol show hostnames",
                   "FORCE_TORCHRUN=1", "llamafactory-cli train", PRESET, "--ntasks-per-node=1", "srun"):  # fmt: skip
        assert needed in script, needed
    result = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_train_accept_reaches_every_rank_and_the_node_agreement(tiny_model, tmp_path, monkeypatch):
    """`llamafactory-rocm train --accept NODES_DISAGREE` is read once, in the request, and exported: the ranks'
    hook and the node agreement read LLAMAFACTORY_ROCM_ACCEPT (train/agreement.py _accepted)."""
    import os

    from llamafactory_rocm.findings import ACCEPT_ENV
    from llamafactory_rocm.train import agreement, launch

    monkeypatch.delenv(ACCEPT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    seen = {}

    def handed_over(resolved):  # where LLaMA-Factory's launcher would start the ranks with this environment
        seen.update(accept=os.environ.get(ACCEPT_ENV), agreement=agreement._accepted())
        return EXIT_OK

    monkeypatch.setattr(launch, "hand_over", handed_over)
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(tiny_train_config(tiny_model, tmp_path / "out", max_steps=1)))
    assert launch.train([str(path)], accept="NODES_DISAGREE") == EXIT_OK
    assert seen == {"accept": "NODES_DISAGREE", "agreement": True}
