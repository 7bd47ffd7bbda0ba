"""``llamafactory-rocm explain CODE``: what a finding code means, why, the fix and its source."""

from __future__ import annotations

import argparse
import sys

from ..errors import EXIT_OK, EXIT_USAGE


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser(
        "explain",
        help="explain a finding code: what it means, why, the fix and its source (like `ruff rule`)",
        description="Explain a finding code printed by check, train, doctor or the hook.",
        epilog="examples:\n  llamafactory-rocm explain PRECISION_FP16_TO_BF16\n  llamafactory-rocm explain --list",
    )
    p.add_argument("code", nargs="?", help="a finding code, e.g. ROCM_ARCH_MISSES_DEVICE (any case)")
    p.add_argument("--list", action="store_true", help="list every code with its level and one line")
    p.add_argument("--markdown", action="store_true", help="print the code table as docs/troubleshooting.md has it")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..findings.registry import load_codes

    registry = load_codes()
    if args.markdown:
        print(registry.markdown_table())
        return EXIT_OK
    if args.list or not args.code:
        if not args.list:  # bare `explain`: say how to use it, then the list
            print("usage: llamafactory-rocm explain CODE   (every code below)\n")
        width = max(map(len, registry.codes))
        for code, entry in registry.codes.items():
            print(f"{code:{width}}  {entry.level.split(' ')[0]:7}  {entry.summary.replace('`', '')}")
        return EXIT_OK
    if registry.get(args.code) is None:
        near = registry.nearest(args.code)
        hint = f" Nearest: {', '.join(near)}." if near else ""
        print(
            f"llamafactory-rocm explain: unknown code {args.code!r}.{hint} "
            "`llamafactory-rocm explain --list` lists them.",
            file=sys.stderr,
        )
        return EXIT_USAGE
    print(registry.explain(args.code.strip().upper()))
    return EXIT_OK
