"""``run_exp`` wrapped: the pre-launch check inside stock LLaMA-Factory, on every rank.

Each rank resolves the same config with the same pure rules (deterministic); only rank 0 prints
and writes the launch record. When ``llamafactory-rocm train`` already checked and recorded the
config it launches, the ranks see its digest and stay quiet.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..console import say
from ..errors import EXIT_FINDINGS, EXIT_USAGE, UsageError

CHECKED_ENV = "LLAMAFACTORY_ROCM_CHECKED"
# The LLaMA-Factory releases the test-suite runs against (README, "Tested range").
TESTED_LLAMAFACTORY = ("0.9.5", "0.9.6.dev0")


def config_digest(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _origin(args: object, raw: object) -> tuple[str, str | None]:
    if args is None and isinstance(raw, list):
        return "LLaMA-Factory flags (hook)", None
    if args is None and len(sys.argv) > 1 and sys.argv[1].endswith((".yaml", ".yml", ".json")):
        return "llamafactory-cli train (hook)", sys.argv[1]
    return "run_exp (hook)", None


def wrap_run_exp(original: Callable[..., Any]) -> Callable[..., Any]:
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
            prepared = prepare(args)
        except SystemExit:
            raise
        except UsageError as err:  # bad flags or a bad LLAMAFACTORY_ROCM_ACCEPT: the user's to fix
            say(str(err))
            raise SystemExit(EXIT_USAGE) from None
        except Exception as exc:  # a bug or an unexpected LLaMA-Factory: never block training
            say(f"pre-launch check skipped ({type(exc).__name__}: {exc}); training continues unchecked.")
            return original(args, callbacks)
        if prepared is None:
            return original(args, callbacks)
        config, guard, report_lines = prepared
        from .board import board_callback
        from .summary import SummaryCallback

        summary = SummaryCallback()
        from .agreement import NodeAgreement

        agreement = NodeAgreement(config, guard.snapshot)  # every node agrees before step 1 (world size > 1)
        board = board_callback(report_lines)  # LlamaBoard's run log gets the findings too
        result = original(config, [*(callbacks or []), guard, agreement, summary, board])
        summary.report()  # after run_exp: LLaMA-Factory saves the model and the loss plot after the last callback
        return result

    run_exp.__llamafactory_rocm__ = True  # type: ignore[attr-defined]
    return run_exp


def prepare(args: dict[str, Any] | list[str] | None) -> tuple[dict[str, Any], Any, list[str]] | None:
    """Check and rewrite; return (resolved config, guard callback, report lines), or None to step aside."""
    from llamafactory.hparams import read_args

    raw = read_args(args)
    if isinstance(raw, list) and ("-h" in raw or "--help" in raw):
        return None  # help: LLaMA-Factory prints its own
    from ..check.record import write_launch_files
    from ..check.render import report_text
    from ..check.run import check_config
    from ..findings import ACCEPT_ENV
    from ..lf.schema import load_schema
    from .guard import DivergenceGuard

    origin, config_path = _origin(args, raw)
    # The --key value form, read by LLaMA-Factory's own parser; each rank reads the same argv.
    config = load_schema().flags_to_config(raw) if isinstance(raw, list) else raw
    if not isinstance(config, dict):
        return None
    already_checked = os.environ.get(CHECKED_ENV) == config_digest(config)
    report = check_config(config, config_path=config_path, plan_without_gpu=False, accept=os.environ.get(ACCEPT_ENV))
    os.environ.update(report.resolution.env_changes)
    text = report_text(report)
    if is_rank0() and not already_checked and (report.findings or not report.ok):
        print(text, file=sys.stderr, flush=True)
    if not report.ok:
        raise SystemExit(EXIT_FINDINGS)
    if os.environ.get("LOCAL_RANK", "0") == "0" and not already_checked:  # each node's own disk gets a record
        output_dir = Path(str(report.config.get("output_dir", "trainer_output")))
        _, record = write_launch_files(report, output_dir, origin)
        if report.findings:
            say(f"launch record written to {record}")
    return report.config, DivergenceGuard(report.snapshot), ["llamafactory-rocm: pre-launch check", *text.splitlines()]
