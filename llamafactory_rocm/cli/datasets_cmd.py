"""``llamafactory-rocm datasets list | validate | register``: dataset definitions, checked before launch."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..dataset import CheckOptions, DatasetReport, add_dataset, load_dataset_info, validate_dataset, validate_entry
from ..dataset.entry import FORMATTINGS
from ..dataset.rows import DEFAULT_MAX_ROWS_SHOWN
from ..dataset.validate import DEFAULT_MAX_DROPPED, parse_share, rows
from ..errors import EXIT_FINDINGS, EXIT_OK, UsageError
from ..resources import datasets_dir


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser(
        "datasets",
        help="list, validate and register datasets (dataset_info.json)",
        description="The datasets a config can name: list them, check them with datasets' loader and "
        "LLaMA-Factory's converter, register your own file.",
        epilog="examples:\n  llamafactory-rocm datasets list\n"
        "  llamafactory-rocm datasets validate my_custom_data --dataset-dir ./data\n"
        "  llamafactory-rocm datasets register rows.jsonl --name my_domain --dataset-dir ./data",
    )
    actions = p.add_subparsers(dest="action", required=True, parser_class=type(p))

    ls = actions.add_parser("list", help="the datasets of a dataset_dir (default: the bundled ones)")
    ls.add_argument("--dataset-dir", help="folder with dataset_info.json (default: the bundled datasets)")
    ls.add_argument("--json", action="store_true", help="print a JSON list")
    ls.set_defaults(run=run_list)

    val = actions.add_parser("validate", help="load and convert every row: exit 0 usable, 1 defects, 2 bad input")
    val.add_argument(
        "dataset", metavar="NAME_OR_FILE", help="a name in dataset_info.json, a .json/.jsonl file or a folder (./parts)"
    )
    val.add_argument("--dataset-dir", help="folder with dataset_info.json (default: the bundled datasets)")
    val.add_argument("--formatting", choices=FORMATTINGS, help="read the rows as this formatting")
    val.add_argument("--stage", default="sft", choices=("pt", "sft", "rm", "ppo", "kto"), help="default: sft")
    val.add_argument(
        "--max-errors",
        type=_count,
        default=DEFAULT_MAX_ROWS_SHOWN,
        metavar="N",
        help="bad rows shown (default: %(default)s)",
    )
    val.add_argument(
        "--max-dropped",
        type=parse_share,
        default=DEFAULT_MAX_DROPPED,
        metavar="SHARE",
        help=f"an error when LLaMA-Factory drops more than this share of the rows (default {DEFAULT_MAX_DROPPED})",
    )
    val.add_argument(
        "--preprocessing-num-workers", type=_count, metavar="N", help="a folder's files load in N processes"
    )
    val.add_argument("--max-samples", type=_count, metavar="N", help="convert the first N rows only (max_samples)")
    val.add_argument("--json", action="store_true", help="print the report as JSON")
    val.set_defaults(run=run_validate)

    reg = actions.add_parser("register", help="validate a file, then add it to dataset_info.json")
    reg.add_argument("file", metavar="FILE", help=".json or .jsonl data file")
    reg.add_argument("--name", required=True, help="the name to use as `dataset:` in the config")
    reg.add_argument("--formatting", choices=FORMATTINGS, default="alpaca", help="the rows' layout (default: alpaca)")
    reg.add_argument("--dataset-dir", default="data", help="folder of dataset_info.json (default: ./data)")
    reg.add_argument("--force", action="store_true", help="replace an existing entry of that name")
    reg.set_defaults(run=run_register)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 0:
        raise argparse.ArgumentTypeError("give 0 or more")
    return value


def run_list(args: argparse.Namespace) -> int:
    folder = Path(args.dataset_dir) if args.dataset_dir else datasets_dir()
    info = load_dataset_info(folder)
    if info is None:
        raise UsageError(f"{folder} has no dataset_info.json.")
    rows = [_list_row(name, entry, folder) for name, entry in info.items()]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{folder}/dataset_info.json")
        print(_table(rows))
    return EXIT_OK


def _list_row(name: str, entry: Any, folder: Path) -> dict[str, Any]:
    report = validate_entry(name, entry, folder, CheckOptions(progress=False))
    if report.remote:
        status = "remote, not checked"
    elif not report.ok:
        status = f"{report.failed} bad rows" if report.failed else "invalid"
    else:
        status = f"ok, {report.dropped} dropped" if report.dropped else "ok"
    return {
        "name": name,
        "formatting": report.formatting,
        "file": report.source,
        "rows": None if report.remote else report.rows,
        "status": status,
    }


def _table(rows: list[dict[str, Any]]) -> str:
    headers = ("name", "formatting", "file", "rows", "status")
    cells = [headers] + [tuple("-" if r[h] is None else str(r[h]) for h in headers) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def run_validate(args: argparse.Namespace) -> int:
    options = CheckOptions(
        max_errors=args.max_errors,
        num_proc=args.preprocessing_num_workers,
        stage=args.stage,
        max_dropped=args.max_dropped,
        max_rows=args.max_samples,
    )
    report = validate_dataset(args.dataset, args.dataset_dir, formatting=args.formatting, options=options)
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        print(report_text(report))
    return EXIT_OK if report.ok else EXIT_FINDINGS


def report_text(report: DatasetReport) -> str:
    """The validate output: a header line, then one line per problem."""
    head = f"{report.label} ({report.formatting}): "
    if report.remote:
        lines = [head + f"{report.source} is not local, not checked"]
    else:
        verdict = "ok" if report.ok else "not usable"
        lines = [head + f"{rows(report.rows)}, {report.kept} kept, {report.dropped} dropped: {verdict}"]
    lines += [f"  error: {e}" for e in report.errors]
    lines += [f"  {r.text()}" for r in report.bad_rows + report.dropped_rows]
    shown = len(report.bad_rows) + len(report.dropped_rows)
    if report.failed + report.dropped > shown:
        lines.append(f"  ... and {report.failed + report.dropped - shown} more rows (--max-errors N shows more)")
    lines += [f"  warning: {w}" for w in report.warnings]
    return "\n".join(lines)


def run_register(args: argparse.Namespace) -> int:
    done = add_dataset(args.file, args.name, args.formatting, args.dataset_dir, force=args.force)
    print(f"registered {args.name} ({rows(done.report.rows)}, {args.formatting}) in {done.info_path}")
    if done.backup is not None:
        print(f"previous dataset_info.json kept as {done.backup}")
    print(f"use it with: dataset: {args.name}, dataset_dir: {done.info_path.parent}")
    return EXIT_OK
