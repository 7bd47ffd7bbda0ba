"""``llamafactory-rocm demo [--dir DIR]``: a LoRA fine-tune on CPU, no GPU and no hub needed."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import EXIT_FINDINGS


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("demo", help="fine-tune a tiny local model on the bundled dataset (CPU, ~1 min)")
    p.add_argument("--dir", default="llamafactory_rocm_demo", help="work folder (default: %(default)s)")
    p.add_argument("--max-steps", type=int, default=60)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    result = run_demo(Path(args.dir), max_steps=args.max_steps)
    if result.exit_code != 0:
        return result.exit_code
    if result.adapter is None or result.first_loss is None:
        print(f"demo: training ended but no adapter/loss was found in {result.output_dir}")
        return EXIT_FINDINGS
    print(
        f"demo: done. loss {result.first_loss:.3f} -> {result.last_loss:.3f}; "
        f"adapter: {result.adapter}; launch record: {result.output_dir / 'rocm_launch.json'}"
    )
    return 0
