"""``llamafactory-rocm doctor [--json] [--snapshot FILE]``: is this machine ready to fine-tune?"""

from __future__ import annotations

import argparse
import json

from ..errors import EXIT_FINDINGS, EXIT_OK
from .check_cmd import load_snapshot


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser(
        "doctor",
        help="one screen: torch build, GPUs, archs, access, packages; pass/warn/fail",
        description="Is this machine ready to fine-tune? Each topic passes, warns or fails with the fix; "
        "exit 1 on a fail. The JSON holds no kernel command line, host name or home path.",
        epilog="examples:\n  llamafactory-rocm doctor\n"
        "  llamafactory-rocm doctor --json --save-snapshot my_machine.json",
    )
    p.add_argument("--json", action="store_true", help="print the report and the machine snapshot as JSON")
    p.add_argument("--snapshot", help="diagnose a recorded machine snapshot (JSON) instead of this machine")
    p.add_argument("--save-snapshot", metavar="FILE", help="also write this machine's snapshot to FILE")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..check.doctor import diagnose, has_fail
    from ..machine.probe import take_snapshot

    snap = load_snapshot(args.snapshot) if args.snapshot else take_snapshot()
    if args.save_snapshot:
        snap.save(args.save_snapshot, overwrite=False)
    lines = diagnose(snap)
    if args.json:
        print(json.dumps({"ok": not has_fail(lines), "lines": [ln.as_dict() for ln in lines],
                          "snapshot": snap.model_dump(mode="json")}, indent=2))  # fmt: skip
    else:
        print(f"llamafactory-rocm doctor ({snap.source})")
        for ln in lines:
            fix = f"  -> {ln.fix}" if ln.fix and ln.status != "pass" else ""
            print(f"  [{ln.status}] {ln.topic}: {ln.detail}{fix}")
        verdict = "not ready: fix the [fail] lines" if has_fail(lines) else "ready"
        print(f"\n{verdict}")
    return EXIT_FINDINGS if has_fail(lines) else EXIT_OK
