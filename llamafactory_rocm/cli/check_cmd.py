"""``llamafactory-rocm check CONFIG [key=value ...] | --key value ...  [--gpu NAME | --arch gfxNNN] [--json]``."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ..check.config_io import load_launch_args
from ..check.render import report_text
from ..check.run import check_config
from ..errors import EXIT_FINDINGS, EXIT_OK
from ..machine.snapshot import Snapshot
from ._args import add_config_arguments, add_world_arguments, world_env


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser(
        "check",
        help="dry run: findings and the resolved config, nothing launched",
        description="Check a LLaMA-Factory config against this machine (or a GPU you plan to rent) without "
        "launching anything: every rule, then LLaMA-Factory's own argument check. Takes what "
        "`llamafactory-cli train` takes. Exit 0: ready to launch; 1: refused (each finding says the fix).",
        epilog="examples:\n"
        "  llamafactory-rocm check my_run.yaml\n"
        "  llamafactory-rocm check my_run.yaml learning_rate=2e-4 --gpu rx7900xtx --json\n"
        "  llamafactory-rocm check --stage sft --model_name_or_path meta-llama/Meta-Llama-3-8B-Instruct \\\n"
        "      --dataset amd_finetune_qa --template llama3 --do_train --fp16 --output_dir saves/run1",
    )
    add_config_arguments(
        p,
        gpu_help="check for this GPU (e.g. mi300x, rx7900xtx) instead of the one here",
        arch_help="check for this arch (e.g. gfx942)",
    )
    add_world_arguments(p)
    p.add_argument("--snapshot", help="check against a recorded machine snapshot (JSON) instead of this one")
    p.add_argument("--json", action="store_true", help="print {ok, findings, config, ...} as JSON (for scripts)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config, config_path = load_launch_args(args.launch_args)
    snapshot = load_snapshot(args.snapshot) if args.snapshot else None
    report = check_config(
        config,
        snapshot=snapshot,
        gpu=args.gpu,
        arch=args.arch,
        config_path=config_path,
        accept=args.accept,
        env=check_env(snapshot, world_env(args.nodes, args.gpus_per_node)),
    )
    if args.json:
        print(json.dumps(report.as_json(), indent=2, default=str))
    else:
        print(report_text(report))
    return EXIT_OK if report.ok else EXIT_FINDINGS


def check_env(snapshot: Snapshot | None, planned_world: dict[str, str]) -> dict[str, str]:
    """The environment the rules read: the recorded snapshot's, else this shell's relevant variables and
    the world/RCCL/Ray ones (``rules.world``); ``--nodes``/``--gpus-per-node`` on top."""
    if snapshot is not None:
        return {**snapshot.env, **planned_world}
    from ..machine.probe import relevant_env
    from ..rules.world import WORLD_ENV_VARS

    here = {name: os.environ[name] for name in WORLD_ENV_VARS if name in os.environ}
    return {**relevant_env(), **here, **planned_world}


def load_snapshot(path: str) -> Snapshot:
    from pydantic import ValidationError

    from ..errors import UsageError

    if Path(path).exists() and not Path(path).is_file():  # a folder, or a FIFO that would block the read
        raise UsageError(f"snapshot {path} is not a regular file: give the JSON file `doctor --save-snapshot` wrote.")
    try:
        return Snapshot.load(path)
    except FileNotFoundError:
        raise UsageError(f"snapshot {path} not found.") from None
    except (ValueError, ValidationError) as exc:
        raise UsageError(f"snapshot {path} is not a llamafactory-rocm snapshot: {str(exc).splitlines()[0]}") from None
