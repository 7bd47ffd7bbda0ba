"""LLaMA-Factory's parser and dry run judge the config as one rank of the world its launcher starts.

Where ``llamafactory-cli train`` starts torchrun (FORCE_TORCHRUN, more than one visible device, ...:
rules/world.py ``starts_torchrun``, pinned to the launcher of both LLaMA-Factory lines), each rank
runs ``run_exp`` with torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, ...) and one device:
transformers' ``TrainingArguments`` then has ``n_gpu`` 1 and ``parallel_mode`` DISTRIBUTED, and
LLaMA-Factory's parser accepts a node of 8 GPUs. Judged in one plain process instead, the same node
has ``n_gpu`` 8 and ``parallel_mode`` NOT_DISTRIBUTED, and the parser refuses every 8-GPU run
("Please launch distributed training with `llamafactory-cli` or `torchrun`").

So the check takes a rank's view: torchrun's variables for this node's first rank of that world (rank
NODE_RANK x NPROC_PER_NODE, the one that runs the full check under the hook; or the rank's own, under
torchrun), and torch's fake process group (``torch.testing._internal.distributed.fake_pg``:
collectives that complete at once, no peer, no network) already initialised, so that accelerate's
``PartialState`` and LLaMA-Factory's ``main_process_first`` barriers use it instead of joining or
pairing anything with the real ranks. Afterwards the group is destroyed, accelerate's shared state
reset and the environment restored, so the real launch starts from a clean process.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# What torchrun gives each rank (torch/distributed/run.py, elastic agent): set for the rank's view,
# removed for a plain process, restored after either.
DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
                   "GROUP_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")  # fmt: skip


@dataclass(frozen=True)
class RankWorld:
    """One rank of a torchrun world: the numbers torchrun hands it."""

    size: int  # WORLD_SIZE: nodes x ranks per node
    local_size: int  # LOCAL_WORLD_SIZE: NPROC_PER_NODE
    rank: int = 0
    local_rank: int = 0
    source: str = ""

    def environ(self, env: Mapping[str, str]) -> dict[str, str]:
        nodes = max(1, self.size // max(1, self.local_size))
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.size),
            "LOCAL_WORLD_SIZE": str(self.local_size),
            "GROUP_RANK": str(self.rank // max(1, self.local_size)),
            "GROUP_WORLD_SIZE": str(nodes),
            "ROLE_RANK": str(self.rank),
            "ROLE_WORLD_SIZE": str(self.size),
            # LLaMA-Factory's launcher passes --master_addr/--master_port (default 127.0.0.1 and a free port)
            "MASTER_ADDR": env.get("MASTER_ADDR") or "127.0.0.1",
            "MASTER_PORT": env.get("MASTER_PORT") or "29500",
        }

    def describe(self) -> str:
        return (
            f"rank {self.rank} of a torchrun world of {self.size} ({self.local_size} per node"
            + (f"; {self.source}" if self.source else "")
            + ")"
        )


def _int(value: str | None) -> int | None:
    value = (value or "").strip()
    return int(value) if value.isdigit() else None


def running_rank(environ: Mapping[str, str] | None = None) -> RankWorld | None:
    """This process's own rank when torchrun started it (the hook on every rank), else None."""
    environ = os.environ if environ is None else environ
    size, local_rank = _int(environ.get("WORLD_SIZE")), _int(environ.get("LOCAL_RANK"))
    if size is None or local_rank is None or size < 1:
        return None
    local_size = _int(environ.get("LOCAL_WORLD_SIZE")) or size
    rank = _int(environ.get("RANK")) or 0
    return RankWorld(size=size, local_size=local_size, rank=rank, local_rank=local_rank, source="this rank")


@contextlib.contextmanager
def judged_as(world: RankWorld | None) -> Iterator[Callable[[Mapping[str, Any]], dict[str, Any]]]:
    """LLaMA-Factory's parser and dry run as ``world``'s rank (a fake process group), or as one plain
    process when ``world`` is None (no process group, no barrier). Yields how the config is judged."""
    saved = {k: os.environ.pop(k) for k in DISTRIBUTED_ENV if k in os.environ}
    if world is None:
        try:
            yield dict
        finally:
            os.environ.update(saved)
        return
    os.environ.update(world.environ(saved))
    import torch

    threads = torch.get_num_threads()  # accelerate's CPU ranks set it (PartialState, OMP_NUM_THREADS unset)
    started = _fake_process_group(world)
    try:
        yield dict
    finally:
        _end_process_group(started)
        torch.set_num_threads(threads)
        for name in DISTRIBUTED_ENV:
            os.environ.pop(name, None)
        os.environ.update(saved)


def _fake_process_group(world: RankWorld) -> bool:
    """torch's fake process group for this rank; False where one is already up (not ours to end)."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        return False
    # Importing it registers the "fake" backend (dist.Backend.register_backend), nothing else.
    from torch.testing._internal.distributed.fake_pg import FakeStore

    _reset_accelerate()
    dist.init_process_group("fake", store=FakeStore(), rank=world.rank, world_size=world.size)
    return True


def _end_process_group(started: bool) -> None:
    import torch.distributed as dist

    if started and dist.is_initialized():
        dist.destroy_process_group()
    if started:
        _reset_accelerate()


def _reset_accelerate() -> None:
    """accelerate keeps one PartialState per process: the dry run's must not become the real run's."""
    with contextlib.suppress(ImportError):
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)


def launched_world(config: Mapping[str, Any], env: Mapping[str, str], ctx: Any) -> RankWorld | None:
    """The rank whose view judges the config: this process's own under torchrun; else this node's first rank
    of the world LLaMA-Factory's launcher starts for ``env`` on ``ctx``'s node (rules/world.py, the launcher's line);
    None for one plain process, and when planning without a GPU count (the world is not known)."""
    own = running_rank()
    if own is not None:
        return own
    from ..rules.base import env_enabled
    from ..rules.world import read_world, starts_torchrun

    world, problems = read_world(config, env, ctx)
    if problems:  # the world rule refuses it in its own words
        return None
    ray = env_enabled(env, "USE_RAY")
    if not ray and not starts_torchrun(env, ctx):
        return None
    if ctx.snapshot.source.startswith("planned") and _int(env.get("NPROC_PER_NODE")) is None and not ray:
        return None
    local = 1 if ray else world.per_node  # a Ray worker holds one GPU (LLaMA-Factory's placement bundle)
    # The launcher's static rendezvous (torchrun --node_rank NODE_RANK) numbers node n's ranks from n x ranks
    # per node: on node 1 no rank 0 runs. Under RDZV_ID (c10d, no --node_rank) the rendezvous picks the order.
    static = not ray and env.get("RDZV_ID") is None
    first = (_int(env.get("NODE_RANK")) or 0) * local if static else 0
    return RankWorld(size=world.size, local_size=local, rank=first, source=world.source)


def rank_finding(world: RankWorld) -> Any:
    from ..findings import Finding

    return Finding(
        code="JUDGED_AS_RANK",
        new=world.size,
        message=f"LLaMA-Factory's parser and launch ran dry as {world.describe()}: what each rank of "
        "that world runs (one device each); no collective was joined.",
    )
