"""Every node agrees before step 1: one small collective compares what each rank is about to run.

A multi-node launch is N independent ``llamafactory-cli train`` commands, one per node, each reading
its own copy of the config and its own software. When one node's copy differs (a learning rate, a
LoRA rank, a LLaMA-Factory version, a GPU arch), the run trains anyway and diverges, or hangs in a
collective. ``NodeAgreement`` is a trainer callback: at the end of the Trainer's construction (the
process group LLaMA-Factory set up is live, the model is not yet wrapped for DDP, no optimizer step
has run and nothing is saved) every rank hashes what matters and all ranks exchange the hashes with
``torch.distributed.all_gather_object``. Equal: training goes on, at the cost of one collective of a
16-character string. Different: a second collective brings the facts themselves, every rank names
the same differences in one line and every rank raises ``NodesDisagree`` (exit code 5) together.

Compared: the resolved config minus keys that are legitimately per node (paths on each node's own
disk, CPU worker counts, hub tokens); the DeepSpeed JSON and a local model by content, not by path;
llamafactory-rocm, LLaMA-Factory, transformers, peft, accelerate, DeepSpeed and Python versions;
the torch and HIP versions, device arch and device count from the machine snapshot.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import sys
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ..errors import EXIT_NODES_DISAGREE
from ..findings import ACCEPT_ENV, Finding, Level, parse_accept
from ..lf.schema import output_dir_of
from ..machine.snapshot import Snapshot

CODE = "NODES_DISAGREE"

# Keys that differ between healthy nodes: each node's own disk, its CPU count, its credentials.
PER_NODE_KEYS = frozenset(
    {
        "output_dir",
        "logging_dir",
        "cache_dir",
        "dataset_dir",
        "media_dir",
        "tokenized_path",
        "preprocessing_num_workers",
        "dataloader_num_workers",
    }
)
# Keys naming a file or folder whose content must agree wherever it lives on each node.
CONTENT_KEYS = ("deepspeed", "model_name_or_path")
PACKAGES = ("llamafactory-rocm", "llamafactory", "transformers", "peft", "accelerate", "deepspeed")
MAX_SHOWN = 6  # differing facts named in the line; the rest are counted


def _per_node(key: str) -> bool:
    return key in PER_NODE_KEYS or key.endswith("_token")  # hf_hub_token & co: secrets, never exchanged


def _content(value: Any) -> Any:
    """A local file or model folder by what it holds (its config.json), else the value itself."""
    path = Path(str(value)).expanduser()
    target = path / "config.json" if path.is_dir() else path
    try:
        if target.is_file():
            digest = hashlib.sha256(target.read_bytes()).hexdigest()[:12]
            return f"{'config.json' if target is not path else 'file'} sha256:{digest}"  # where it lives may differ
    except OSError:
        pass
    return value


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def node_facts(config: Mapping[str, Any], snapshot: Snapshot) -> dict[str, Any]:
    """What must be equal on every rank, as a flat ``{label: value}`` map (labels are shown to the user)."""
    facts: dict[str, Any] = {}
    for key in sorted(config):
        if _per_node(key):
            continue
        value = config[key]
        facts[key] = _content(value) if key in CONTENT_KEYS and value else value
    for name in PACKAGES:
        facts[f"{name} version"] = _version(name)
    facts["python version"] = ".".join(map(str, sys.version_info[:3]))
    facts["torch version"] = snapshot.torch.version
    facts["HIP version"] = snapshot.torch.hip
    facts["device arch"] = sorted({d.arch_name for d in snapshot.devices}) or ["cpu"]
    facts["device count"] = len(snapshot.devices)
    return facts


def facts_digest(facts: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 48 else text[:45] + "..."


def _where(ranks: list[int], peers: list[dict[str, Any]]) -> str:
    """'node 1 (host-b)' when the ranks are whole nodes, else 'rank 3 (node 0)'."""
    by_node: dict[int, list[int]] = {}
    for rank in ranks:
        by_node.setdefault(peers[rank]["node"], []).append(rank)
    parts = []
    for node, members in sorted(by_node.items()):
        whole = len(members) == sum(1 for p in peers if p["node"] == node)
        host = peers[members[0]]["host"]
        if whole:
            parts.append(f"node {node} ({host})")
        else:
            parts.extend(f"rank {r} (node {node}, {host})" for r in members)
    return ", ".join(parts)


def differences(peers: list[dict[str, Any]]) -> list[str]:
    """One phrase per differing fact: ``learning_rate: 0.0002 on node 0 (a), 0.0001 on node 1 (b)``."""
    labels = list(dict.fromkeys(label for peer in peers for label in peer["facts"]))
    missing = object()
    phrases = []
    for label in labels:
        groups: dict[str, list[int]] = {}
        for rank, peer in enumerate(peers):
            value = peer["facts"].get(label, missing)
            shown = "(not set)" if value is missing else _short(value)
            groups.setdefault(shown, []).append(rank)
        if len(groups) > 1:
            # rank 0's value first: it reads as "expected X, found Y"
            ordered = sorted(groups.items(), key=lambda item: min(item[1]))
            phrases.append(f"{label}: " + ", ".join(f"{value} on {_where(r, peers)}" for value, r in ordered))
    return phrases


def disagreement(peers: list[dict[str, Any]], accepted: bool = False) -> Finding:
    """The finding every rank states when the nodes differ: an error, or, accepted, a warning (training goes on)."""
    phrases = differences(peers)
    shown = "; ".join(phrases[:MAX_SHOWN])
    if len(phrases) > MAX_SHOWN:
        shown += f"; and {len(phrases) - MAX_SHOWN} more"
    count = len({p["node"] for p in peers})
    nodes = f"{count} node{'s' if count != 1 else ''}"
    if accepted:  # as rules/__init__.py accept_findings marks an accepted error
        return Finding(
            code=CODE,
            level=Level.WARNING,
            message=f"(accepted) the {nodes} ({len(peers)} ranks) disagree: {shown}. Training goes on because "
            f"{ACCEPT_ENV} names {CODE}.",
        )
    return Finding(
        code=CODE,
        message=f"the {nodes} ({len(peers)} ranks) disagree, so every rank stopped before step 1 (no optimizer "
        f"step, nothing saved): {shown}.",
    )


def log_line(finding: Finding) -> str:
    """The one line a rank prints in its node's log."""
    return f"llamafactory-rocm: {finding.line()}"


class NodesDisagree(SystemExit):
    def __init__(self, message: str) -> None:
        super().__init__(EXIT_NODES_DISAGREE)
        self.message = message


def _node_index() -> int:
    """torchrun gives each worker its node's rank as GROUP_RANK; NODE_RANK is what LLaMA-Factory reads."""
    for name in ("GROUP_RANK", "NODE_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def _accepted() -> bool:
    """As for every finding: NODES_DISAGREE accepted -> said, and training goes on."""
    return CODE in parse_accept(os.environ.get(ACCEPT_ENV))


class NodeAgreement(TrainerCallback):
    """Compares every rank's ``node_facts`` once, before the first step; only when world size > 1.

    The same collective tells where the record is: the world's rank 0 adds every node's facts to its
    record (``record``), and each node's first rank that cannot see that file in its own output_dir (the
    nodes do not share it) writes that node's own record (``node_record(node)``).
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        snapshot: Snapshot,
        record: Path | None = None,
        node_record: Callable[[int], Path | None] | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.facts = node_facts(config, snapshot)
        self.output_dir = Path(output_dir_of(config))
        self.record = record
        self.node_record = node_record
        self.checked = False

    # The Trainer has just been built: the process group is live and the model is not yet wrapped
    # (DDP's own parameter check would otherwise stop a LoRA-rank mismatch first, with less to say).
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.agree()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.agree()  # where the group came up after __init__ (a launcher of its own): still before step 1

    def agree(self) -> None:
        if self.checked:
            return
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return
        self.checked = True
        world = dist.get_world_size()
        peers: list[Any] = [None] * world
        mine = {
            "node": _node_index(),
            "host": socket.gethostname(),  # named in the disagreement line only; never recorded
            "facts": self.facts,
            "record": None if self.record is None else self.record.name,
        }
        dist.all_gather_object(peers, mine)
        if len({facts_digest(p["facts"]) for p in peers}) == 1:
            self.place_records(peers)
            return
        accepted = _accepted()
        line = log_line(disagreement(peers, accepted))
        if os.environ.get("LOCAL_RANK", "0") == "0":  # one line in each node's log
            print(line, file=sys.stderr, flush=True)
        if accepted:
            self.place_records(peers)
            return
        # Every rank got the same answer: leave the group cleanly; a failed tear-down must not hide why.
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        raise NodesDisagree(line)

    def place_records(self, peers: list[dict[str, Any]]) -> None:
        """One record per run where the nodes share output_dir; a record per node where they do not."""
        from ..check.record import add_nodes

        if self.record is not None:  # the world's rank 0
            add_nodes(self.record, nodes_summary(peers))
        name = peers[0].get("record")
        if os.environ.get("LOCAL_RANK", "0") != "0" or os.environ.get("RANK", "0") == "0" or not name:
            return
        if not (self.output_dir / name).is_file() and self.node_record is not None:
            self.node_record(_node_index())


def nodes_summary(peers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each node's facts as they agreed, for the record: node index, ranks, versions and devices (no host)."""
    nodes: dict[int, dict[str, Any]] = {}
    for rank, peer in enumerate(peers):
        entry = nodes.setdefault(peer["node"], {"node": peer["node"], "ranks": [], "facts": {}})
        entry["ranks"].append(rank)
        entry["facts"] = {k: v for k, v in peer["facts"].items() if k.endswith(("version", "arch", "count"))}
    return [nodes[n] for n in sorted(nodes)]


# -- every node arrives, or the others stop -------------------------------------------------------------
TIMEOUT_ENV = "LLAMAFACTORY_ROCM_NODE_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
MISSING_CODE = "NODES_MISSING"


def arrival_timeout(environ: Mapping[str, str] | None = None) -> float:
    """Seconds a rank waits for the other nodes before step 1 (``LLAMAFACTORY_ROCM_NODE_TIMEOUT``)."""
    value = (os.environ if environ is None else environ).get(TIMEOUT_ENV, "")
    try:
        return float(value) if value.strip() else DEFAULT_TIMEOUT_S
    except ValueError:
        return DEFAULT_TIMEOUT_S


def wait_for_every_node(timeout_s: float | None = None) -> None:
    """Every rank of a torchrun world checks in before LLaMA-Factory builds anything; a rank still alone
    after ``timeout_s`` stops with one line naming the nodes that never arrived (exit 5).

    Without it, the ranks that did arrive wait in ``init_process_group`` for ``ddp_timeout``
    (LLaMA-Factory's examples set 180000000 s) when another node's ranks died before joining (its check
    refused, an import failed). The check-in goes through torchrun's own store (the agent hosts it at
    MASTER_ADDR:MASTER_PORT when TORCHELASTIC_USE_AGENT_STORE is True), under keys of this run and restart.
    A node whose agent never starts is torchrun's own rendezvous to wait for: no worker runs there yet.
    """
    environ = os.environ
    world = int(environ.get("WORLD_SIZE", "1") or 1)
    if world < 2 or environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    import time
    from datetime import timedelta

    from torch.distributed import TCPStore

    timeout_s = arrival_timeout() if timeout_s is None else timeout_s
    wait = timedelta(seconds=max(timeout_s, 1))
    store = TCPStore(environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), is_master=False, timeout=wait)
    run = environ.get("TORCHELASTIC_RUN_ID", "run")
    prefix = f"llamafactory_rocm/{run}/{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    node = _node_index()
    store.set(f"{prefix}/rank{environ.get('RANK', '0')}", str(node))
    store.add(f"{prefix}/arrived", 1)
    deadline = time.monotonic() + timeout_s
    while store.add(f"{prefix}/arrived", 0) < world:
        if time.monotonic() > deadline:
            line = log_line(_missing(store, prefix, world, timeout_s))
            if environ.get("LOCAL_RANK", "0") == "0":  # one line in each waiting node's log
                print(line, file=sys.stderr, flush=True)
            raise NodesDisagree(line)
        time.sleep(0.2)


def _missing(store: Any, prefix: str, world: int, timeout_s: float) -> Finding:
    arrived = {int(store.get(f"{prefix}/rank{r}")) for r in range(world) if store.check([f"{prefix}/rank{r}"])}
    nodes = int(os.environ.get("GROUP_WORLD_SIZE") or os.environ.get("NNODES") or 0) or len(arrived) + 1
    missing = [n for n in range(nodes) if n not in arrived] or ["(unknown)"]
    named = ", ".join(f"node {n}" for n in missing)
    return Finding(
        code=MISSING_CODE,
        message=f"{named} never arrived within {timeout_s:g} s (its ranks stopped or never started), so every rank "
        "that did stopped before step 1 instead of waiting for ddp_timeout.",
    )
