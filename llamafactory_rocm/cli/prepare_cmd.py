"""``llamafactory-rocm prepare CONFIG [key=value ...] [--json]``: tokenize on CPU what training will train on."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..check.config_io import load_launch_args
from ..errors import EXIT_FINDINGS, EXIT_OK


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser(
        "prepare",
        help="run LLaMA-Factory's dataset preprocessing on CPU and save it at tokenized_path",
        epilog="examples:\n  llamafactory-rocm prepare my_run.yaml\n"
        "  llamafactory-rocm prepare my_run.yaml tokenized_path=./tok --json",
    )
    p.usage = "%(prog)s CONFIG.yaml [key=value ...] [--json] [--force] [--world-size N]"
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    p.add_argument("--force", action="store_true", help="rebuild a tokenized_path that already holds data")
    p.add_argument("--world-size", type=int, default=1, metavar="N", help="GPUs training will use (steps per epoch)")
    p.set_defaults(run=run, takes_launch_args=True)


def run(args: argparse.Namespace) -> int:
    from ..dataset.prepare import prepare

    config, _ = load_launch_args(args.launch_args)
    result = prepare(config, Path.cwd(), force=args.force, world_size=max(1, args.world_size))
    if args.json:
        print(json.dumps(result.as_json(), indent=2, default=str))
        return EXIT_OK if result.ok else EXIT_FINDINGS
    for finding in result.findings:
        print(finding.line())
    if result.tokenized_path is None:
        print("not prepared: fix the errors above first")
        return EXIT_FINDINGS
    lengths = ", ".join(f"{k} {v}" for k, v in result.lengths.items())
    print(
        f"{result.examples} examples: {result.kept} kept, {result.dropped} dropped, {result.truncated} truncated by "
        f"cutoff_len; {result.tokens} tokens; lengths {lengths or '-'}; {result.steps_per_epoch} steps per epoch"
    )
    for warning in result.warnings:
        print(f"warning: {warning}")
    print(f"saved at {result.tokenized_path}")
    print(f"train with it: add `tokenized_path: {result.tokenized_path}` to the config (LLaMA-Factory then skips")
    print("  loading and preprocessing, and ignores the dataset keys; copy the folder with the config)")
    return EXIT_OK if result.ok else EXIT_FINDINGS
