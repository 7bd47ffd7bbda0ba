"""``llamafactory-rocm prepare CONFIG [key=value ...] [--json] [--verbose]``: tokenize on CPU what training
will train on, and say it in one summary."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from ..check.config_io import load_launch_args
from ..errors import EXIT_FINDINGS, EXIT_OK

if TYPE_CHECKING:
    from ..dataset.prepare import PrepareResult


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser(
        "prepare",
        help="run LLaMA-Factory's dataset preprocessing on CPU and save it at tokenized_path",
        epilog="examples:\n  llamafactory-rocm prepare my_run.yaml\n"
        "  llamafactory-rocm prepare my_run.yaml tokenized_path=./tok --json",
    )
    p.usage = "%(prog)s CONFIG.yaml [key=value ...] [--json] [--force] [--world-size N] [--verbose]"
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    p.add_argument("--force", action="store_true", help="rebuild a tokenized_path that already holds data")
    p.add_argument("--world-size", type=int, default=1, metavar="N", help="GPUs training will use (steps per epoch)")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="LLaMA-Factory's own logs, progress bars and example print (on stderr)",
    )
    p.set_defaults(run=run, takes_launch_args=True)


def run(args: argparse.Namespace) -> int:
    from ..dataset.prepare import prepare
    from ..train.verbosity import quiet_by_default

    if not args.verbose:
        quiet_by_default()  # LLaMA-Factory and transformers at warning level unless the user chose
    config, path = load_launch_args(args.launch_args)
    result = prepare(config, Path.cwd(), force=args.force, world_size=max(1, args.world_size), verbose=args.verbose)
    if args.json:
        print(json.dumps(result.as_json(), indent=2, default=str))
        return EXIT_OK if result.ok else EXIT_FINDINGS
    for finding in result.findings:
        print(finding.line())
    if result.tokenized_path is None:
        print("not prepared: fix the errors above first")
        return EXIT_FINDINGS
    for line in summary(result, path):
        print(line)
    return EXIT_OK if result.ok else EXIT_FINDINGS


def summary(result: PrepareResult, path: str | None) -> list[str]:
    """The summary block: counts, lengths, steps, where it was saved and the command that trains on it."""
    truncated = "not counted" if result.truncated is None else f"{result.truncated} truncated"
    lengths = ", ".join(f"{k} {v}" for k, v in result.lengths.items()) or "-"
    packed = f" ({result.sequences} packed sequences)" if result.packing else ""
    lines = [
        f"prepared {result.examples} examples: {result.kept} kept, {result.dropped} dropped, "
        f"{truncated} by cutoff_len (at {result.cutoff_len} tokens)",
        f"  {result.tokens} tokens; lengths before cutoff {lengths}; {result.steps_per_epoch} steps per epoch{packed}",
    ]
    lines += [f"  warning: {warning}" for warning in result.warnings]
    lines.append(f"  saved at {result.tokenized_path}")
    if path is not None:
        command = f"llamafactory-rocm train {shlex.quote(path)} tokenized_path={shlex.quote(result.tokenized_path)}"
    else:
        command = f"add `tokenized_path: {result.tokenized_path}` to the training config"
    lines.append(f"next: {command}  (LLaMA-Factory loads it and ignores the dataset keys)")
    return lines
