"""``run_exp`` wrapped: the pre-launch check inside stock LLaMA-Factory, on every rank.

Resolution apart from side effects:

- every rank builds the same request (LLaMA-Factory's own ``read_args`` on the same argv or dict) and
  resolves it with the same pure rules, so every rank trains the same resolved config;
- under torchrun the costly parts (the data pass, LLaMA-Factory's parser and its launch run dry) run on
  each node's first rank only (``LOCAL_RANK`` 0); the other ranks run the rules alone. A refusal there
  stops that rank, and torchrun stops the rest;
- when ``llamafactory-rocm train`` checked and recorded the config already, the ranks verify its digest
  and this machine's facts and check nothing again;
- side effects come after, on the world's rank 0 only: the launch record. One that cannot be written is
  a warning, never a reason to train something else;
- the check makes the run's forecast (forecast/run.py, as ``check --forecast``): it goes in the launch record,
  LlamaBoard's log and, beside what the run measured, the closing summary (train/summary.py);
- if the check itself fails (a bug), every rank takes the same decision: it stops, in one line that names
  the off switch. No rank trains a config another rank did not.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..console import say
from ..errors import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_USAGE, UsageError
from ..lf.commands import record_folder

CHECKED_ENV = "LLAMAFACTORY_ROCM_CHECKED"
# The LLaMA-Factory releases the test-suite runs against (docs/install.md, "Tested range").
TESTED_LLAMAFACTORY = ("0.9.5", "0.9.6.dev0")


def config_digest(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


# Set by the launcher and torchrun for the ranks, and checked by `train` before: not machine facts.
_LAUNCH_ENV = frozenset({"FORCE_TORCHRUN", "NPROC_PER_NODE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"})


def machine_digest(snapshot: Any) -> str:
    """The lasting machine facts the rules read: torch build, devices, KFD targets, packages, environment
    (not what changes from one second to the next, such as free memory)."""
    facts = snapshot.model_dump(mode="json", include={"torch", "kfd_nodes", "packages", "env"})
    facts["devices"] = [(d.index, d.name, d.arch_name, d.total_memory_bytes) for d in snapshot.devices]
    facts["env"] = {k: v for k, v in facts.get("env", {}).items() if k not in _LAUNCH_ENV}
    return config_digest(facts)


EXIT_DIR_ENV = "LLAMAFACTORY_ROCM_EXIT_DIR"  # set by `train`: each rank notes why it stopped


def note_exit(code: object) -> None:
    """torchrun turns every failed rank into exit 1; `train` reads the rank's own code from here."""
    folder = os.environ.get(EXIT_DIR_ENV)
    if folder and isinstance(code, int) and code:
        with contextlib.suppress(OSError):
            Path(folder, f"rank{os.environ.get('RANK', '0')}").write_text(str(code), encoding="utf-8")


def checked_token(config: dict[str, Any], snapshot: Any) -> str:
    """What ``train`` hands to the ranks: the resolved config's digest and the machine's."""
    return f"{config_digest(config)}:{machine_digest(snapshot)}"


def is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def wrap_run_exp(original: Callable[..., Any], command: str = "train") -> Callable[..., Any]:
    """``run_exp`` checked (the hook of ``command``'s entry in lf/commands.py, which is train)."""
    params = list(inspect.signature(original).parameters)
    if params[:2] != ["args", "callbacks"]:
        raise RuntimeError(f"run_exp{inspect.signature(original)} is not run_exp(args, callbacks)")
    from ..lf.keys import installed_llamafactory_version

    version = installed_llamafactory_version()
    if version not in TESTED_LLAMAFACTORY:
        say(f"llamafactory {version} is outside the tested range ({', '.join(TESTED_LLAMAFACTORY)}); checking anyway.")

    @functools.wraps(original)
    def run_exp(args: dict[str, Any] | None = None, callbacks: list[Any] | None = None) -> Any:
        from .verbosity import quiet_by_default

        quiet_by_default()  # LLaMA-Factory is imported by now: lowers its loggers, one-line data example
        try:
            return checked_run(args, callbacks)
        except SystemExit as stop:
            note_exit(stop.code)
            raise

    def checked_run(args: dict[str, Any] | None, callbacks: list[Any] | None) -> Any:
        try:
            prepared = prepare(args)
        except SystemExit:
            raise
        except UsageError as err:  # bad flags or a bad LLAMAFACTORY_ROCM_ACCEPT: the user's to fix
            say(str(err))
            raise SystemExit(EXIT_USAGE) from None
        except Exception as exc:  # the check itself failed: the same decision on every rank
            if os.environ.get("LLAMAFACTORY_ROCM_DEBUG"):
                raise
            say(
                f"the pre-launch check failed ({type(exc).__name__}: {exc}), so nothing was trained. Set "
                "LLAMAFACTORY_ROCM=0 to train without the check, or LLAMAFACTORY_ROCM_DEBUG=1 for the traceback, "
                "and please report it."
            )
            raise SystemExit(EXIT_INTERNAL) from None
        if prepared is None:
            return original(args, callbacks)
        return prepared.run(original, callbacks)

    run_exp.__llamafactory_rocm__ = True  # type: ignore[attr-defined]
    return run_exp


@dataclass
class Prepared:
    """The resolved config and the callbacks that watch it train."""

    config: dict[str, Any]
    snapshot: Any
    report: Any = None  # None: `llamafactory-rocm train` checked and recorded it
    report_lines: list[str] = field(default_factory=list)
    record: Path | None = None

    def run(self, original: Callable[..., Any], callbacks: list[Any] | None) -> Any:
        from .agreement import NodeAgreement, wait_for_every_node
        from .board import board_callback
        from .guard import DivergenceGuard
        from .summary import SummaryCallback

        wait_for_every_node()  # a node whose ranks died before this point does not hold the others for days
        summary = SummaryCallback(*self.forecast_and_record())
        # Every node agrees before step 1 (world size > 1); the world's rank 0 adds every node's facts to
        # its record, and a node that cannot see that record (no shared output_dir) writes its own.
        agreement = NodeAgreement(self.config, self.snapshot, record=self.record, node_record=self.node_record)
        board = board_callback(self.report_lines)  # LlamaBoard's run log gets the findings too
        guard = DivergenceGuard(self.snapshot)
        result = original(self.config, [*(callbacks or []), guard, agreement, summary, board])
        summary.report()  # after run_exp: LLaMA-Factory saves the model and the loss plot after the last callback
        return result

    def forecast_and_record(self) -> tuple[dict[str, Any] | None, Path | None]:
        """The pre-launch check's forecast (as JSON) and its launch record, for the summary: this hook's check, or
        where ``llamafactory-rocm train`` checked (no report here), the record it wrote for this config."""
        if self.report is not None:
            forecast = self.report.forecast
            return (None if forecast is None else forecast.as_json()), self.record
        if not is_rank0():
            return None, None
        from ..check.record import record_of

        folder = record_folder(self.config, "train") or "."
        found = record_of(folder, self.config)
        if found is None:  # train could not write it (a warning then): the summary says so, not "none made"
            return {"made": False, "why": f"train's launch record of this config is not in {folder}"}, None
        return found[1].get("forecast"), found[0]

    def node_record(self, node: int) -> Path | None:
        """This node's own record, where it does not share rank 0's output_dir; None without a report."""
        if self.report is None:
            return None
        return write_record(self.report, node=node)


def write_record(report: Any, node: int | None = None) -> Path | None:
    """The launch record, in the folder train's entry names (lf/commands.py: ``output_dir``); one that cannot
    be written is a warning (the resolved config trains regardless)."""
    from ..check.record import write_launch_files

    output_dir = Path(record_folder(report.config, "train") or ".")
    try:
        _, record = write_launch_files(report, output_dir, report.origin, node=node)
    except OSError as exc:
        say(f"warning: the launch record could not be written in {output_dir} ({exc}); training goes on unchanged.")
        return None
    return record


NOT_FIRST_WAIT_S = 120.0


def _let_the_node_first_rank_say_why() -> None:
    """A rank other than its node's first refuses with the rules alone (Depth.RULES), in a fraction of the first
    rank's full check; exiting at once made torchrun's agent end the whole group, the first rank included,
    before it printed the reason (a two-rank node refused with no line: tests/test_rank_view.py, said once).
    It waits instead: the first rank runs the same rules at full depth, refuses, prints and exits, and torchrun
    ends this rank then. The wait is bounded, for a first rank that never comes to its verdict."""
    import time

    time.sleep(NOT_FIRST_WAIT_S)


def prepare(args: dict[str, Any] | list[str] | None) -> Prepared | None:
    """Check and rewrite; return what to train and how to watch it, or None to step aside (``--help``)."""
    from ..check.render import report_text
    from ..check.request import Depth, from_run_exp
    from ..check.run import run_check
    from ..forecast.flops import requested
    from ..machine.probe import take_snapshot

    request = from_run_exp(args)
    if request is None:
        return None
    snapshot = take_snapshot()
    if os.environ.get(CHECKED_ENV) == checked_token(request.config, snapshot):
        # `llamafactory-rocm train` checked and recorded this very config on this machine: trust it.
        return Prepared(request.config, snapshot)
    depth = Depth.FULL if os.environ.get("LOCAL_RANK", "0") == "0" else Depth.RULES
    from dataclasses import replace

    with requested():  # the run's forecast, for the record, LlamaBoard's log and the closing summary
        report = run_check(replace(request, snapshot=snapshot, depth=depth))
    os.environ.update(report.resolution.env_changes)
    text = report_text(report)
    node_first = os.environ.get("LOCAL_RANK", "0") == "0"
    if (is_rank0() and report.findings) or (node_first and not report.ok):  # a refusal: in every node's log
        print(text, file=sys.stderr, flush=True)
    if not report.ok:
        if not node_first:
            _let_the_node_first_rank_say_why()
        raise SystemExit(EXIT_FINDINGS)
    record = write_record(report) if is_rank0() else None
    if record is not None and report.findings:
        say(f"launch record written to {record}")
    # LlamaBoard's log gets the whole report, the forecast block included (train/board.py)
    return Prepared(
        report.config, snapshot, report, ["llamafactory-rocm: pre-launch check", *text.splitlines()], record
    )
