"""What each process's LLaMA-Factory parser ran as: the world numbers torchrun gave it and what torch and
accelerate reported, written where ``get_train_args`` returns (or refuses), one JSON file per call.

The oracle of the rank view (tests/test_rank_view.py): a stock ``llamafactory-cli train`` (hook off) records
in every rank through tests/simnode/sitecustomize.py when ``RANKS_ENV`` names a folder; the check, run in
the test process, records the same way while it judges the config (``recording``). The two are compared
field by field, so a check that judges a rank with another world than the rank really gets fails.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import itertools
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

RANKS_ENV = "LLAMAFACTORY_ROCM_TEST_RANKS"  # a folder; every process that parses a training config records there
# torchrun's numbers for a rank (torch/distributed/run.py, elastic agent)
TORCHRUN_VARS = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE")
_calls = itertools.count()


def rank_view(training_args: Any = None) -> dict[str, Any]:
    """The world as this process sees it now: torchrun's variables, transformers' TrainingArguments (as
    LLaMA-Factory's parser built them), torch.distributed's group and accelerate's PartialState."""
    view: dict[str, Any] = {"env": {name: os.environ.get(name) for name in TORCHRUN_VARS}}
    if training_args is not None:
        view["training_args"] = {
            "world_size": training_args.world_size,
            "process_index": training_args.process_index,
            "local_process_index": training_args.local_process_index,
            "parallel_mode": str(training_args.parallel_mode.value),
        }
    import torch.distributed as dist

    group = dist.is_available() and dist.is_initialized()
    view["torch.distributed"] = {"world_size": dist.get_world_size(), "rank": dist.get_rank()} if group else None
    view["accelerate"] = None
    with contextlib.suppress(ImportError):
        from accelerate.state import PartialState

        # Read, never made here: the parser made it (TrainingArguments._setup_devices), or began to where it refused.
        state = PartialState._shared_state
        if state:
            view["accelerate"] = {k: state.get(k) for k in ("num_processes", "process_index", "local_process_index")}
    return view


def _write(folder: Path, record: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{os.getpid()}-{next(_calls)}.json"
    (folder / name).write_text(json.dumps(record, sort_keys=True), encoding="utf-8")


def recorded_parser(parse: Callable[..., Any], folder: Path, pid: int | None = None) -> Callable[..., Any]:
    """``get_train_args`` that also records the world it ran in: its TrainingArguments when it returns,
    the environment and process group when it refuses. ``pid``: only in that process (the check's, not the
    child it forks to run step 1 on a twin as one plain process: lf/dry_step.py)."""

    def get_train_args(*args: Any, **kwargs: Any) -> Any:
        mine = pid is None or os.getpid() == pid
        try:
            parsed = parse(*args, **kwargs)
        except BaseException as exc:
            if mine:
                _write(folder, {**rank_view(), "refused": f"{type(exc).__name__}: {exc}"[:500]})
            raise
        if mine:
            _write(folder, rank_view(parsed[2]))
        return parsed

    get_train_args.__wrapped__ = parse  # type: ignore[attr-defined]
    return get_train_args


def load(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))]


@contextlib.contextmanager
def recording(folder: Path) -> Iterator[None]:
    """In this process (the check): LLaMA-Factory's ``get_train_args`` records while the block runs, under both
    names the check calls it by when it runs: the parser module's (its verdict, lf/commands.py) and the
    package's (its dry launch, lf/dry_run.py)."""
    from llamafactory_rocm.lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        import llamafactory.hparams as hparams
        import llamafactory.hparams.parser as parser
    owners = (hparams, parser)
    saved = [owner.get_train_args for owner in owners]
    for owner, parse in zip(owners, saved, strict=True):
        owner.get_train_args = recorded_parser(parse, folder, os.getpid())
    try:
        yield
    finally:
        for owner, parse in zip(owners, saved, strict=True):
            owner.get_train_args = parse


class _WrapAfterImport(importlib.abc.MetaPathFinder):
    """For a stock process (sitecustomize): ``get_train_args`` is wrapped in its module,
    ``llamafactory.hparams.parser``, as soon as that has run, before anything binds the name: the package
    (``from .parser import get_train_args``), whence LLaMA-Factory's tuner, and the hook's check (both names)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "llamafactory.hparams.parser":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, folder = spec.loader, self.folder
        run_module = loader.exec_module

        def exec_module(module: Any) -> None:
            run_module(module)
            module.get_train_args = recorded_parser(module.get_train_args, folder)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


STARTED = "started"  # a subfolder: each torchrun rank's variables, written as its interpreter starts


def install(folder: str) -> None:
    sys.meta_path.insert(0, _WrapAfterImport(Path(folder)))
    if "RANK" in os.environ:
        # A rank the launcher stops (another rank refused first: torchrun's agent ends the group) may never reach
        # its parser; what torchrun gave it is known from the start (one CI run lost rank 0's record so).
        _write(Path(folder) / STARTED, {"env": {name: os.environ.get(name) for name in TORCHRUN_VARS}})
