"""``llamafactory-rocm datasets list | validate | register``: dataset definitions, checked before launch."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..dataset_check import (
    DEFAULT_MAX_ERRORS,
    DatasetReport,
    add_dataset,
    load_dataset_info,
    validate_entry,
)
from ..dataset_check import validate_dataset as check_dataset
from ..dataset_entry import FORMATTINGS, resolve_mapping, source_of
from ..errors import EXIT_FINDINGS, EXIT_OK, UsageError
from ..resources import datasets_dir


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("datasets", help="list, validate and register datasets (dataset_info.json)")
    actions = p.add_subparsers(dest="action", required=True, parser_class=type(p))

    ls = actions.add_parser("list", help="the datasets of a dataset_dir (default: the bundled ones)")
    ls.add_argument("--dataset-dir", help="folder with dataset_info.json (default: the bundled datasets)")
    ls.add_argument("--json", action="store_true", help="print a JSON list")
    ls.set_defaults(run=run_list)

    val = actions.add_parser("validate", help="check every row: exit 0 clean, 1 defects, 2 bad input")
    val.add_argument(
        "dataset", metavar="NAME_OR_FILE", help="a name in dataset_info.json, a .json/.jsonl file or a folder (./parts)"
    )
    val.add_argument("--dataset-dir", help="folder with dataset_info.json (default: the bundled datasets)")
    val.add_argument("--formatting", choices=FORMATTINGS, help="read the rows as this formatting")
    val.add_argument("--tokenizer", metavar="PATH", help="local tokenizer folder: also print token-length percentiles")
    val.add_argument("--max-errors", type=_count, default=DEFAULT_MAX_ERRORS, metavar="N", help="bad rows shown")
    val.add_argument("--jobs", type=_count, default=0, metavar="N", help="processes for big JSON lines (0: auto)")
    val.add_argument(
        "--preprocessing-num-workers",
        type=_count,
        metavar="N",
        help="a folder's files load in N processes, as preprocessing_num_workers in the config (default: unknown: "
        "checked for 1 process and for one a file, not the runs of files in between)",
    )
    val.add_argument("--json", action="store_true", help="print the report as JSON")
    val.set_defaults(run=run_validate)

    reg = actions.add_parser("register", help="validate a file, then add it to dataset_info.json")
    reg.add_argument("file", metavar="FILE", help=".json or .jsonl data file")
    reg.add_argument("--name", required=True, help="the name to use as `dataset:` in the config")
    reg.add_argument("--formatting", choices=FORMATTINGS, default="alpaca")
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


# -- list -----------------------------------------------------------------------------------------


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
    report = validate_entry(name, entry, folder)
    source = source_of(entry) if isinstance(entry, dict) else None
    formatting = resolve_mapping(entry).formatting if isinstance(entry, dict) else "?"
    return {
        "name": name,
        "formatting": formatting,
        "file": "?" if source is None else str(source[1]),
        "rows": None if report.remote else report.rows,
        "status": _status(report),
    }


def _status(report: DatasetReport) -> str:
    if report.remote:
        return "remote, not checked"
    if report.ok:
        return "ok"
    if report.bad_row_count:
        return f"{report.bad_row_count} bad rows"
    return "invalid entry"


def _table(rows: list[dict[str, Any]]) -> str:
    headers = ("name", "formatting", "file", "rows", "status")
    cells = [headers] + [tuple("-" if r[h] is None else str(r[h]) for h in headers) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


# -- validate -------------------------------------------------------------------------------------


def run_validate(args: argparse.Namespace) -> int:
    report = check_dataset(
        args.dataset,
        args.dataset_dir,
        formatting=args.formatting,
        tokenizer=args.tokenizer,
        max_errors=args.max_errors,
        jobs=args.jobs,
        loader_processes=args.preprocessing_num_workers,
    )
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        print(report_text(report, args.max_errors))
        if len(report.files) > 2 and args.preprocessing_num_workers is None:
            print(_RUNS_NOTE.format(files=len(report.files)))
    return EXIT_OK if report.ok else EXIT_FINDINGS


# A folder of more than two files loads in runs that depend on the config's processes.
_RUNS_NOTE = (
    "  note: its {files} files were checked as 1 process and as {files} processes load them; give "
    "--preprocessing-num-workers N (the config's) to check the runs of files your config loads"
)


def report_text(report: DatasetReport, max_errors: int = DEFAULT_MAX_ERRORS) -> str:
    """The validate output: a header line, then one line per problem."""
    layout = f", {report.layout}" if report.layout else ""
    head = f"{report.label} ({report.formatting}{layout}): "
    if report.remote:
        lines = [head + f"{report.source} is not local, not checked"]
    else:
        bad = f", {report.bad_row_count} bad" if report.bad_row_count else ""
        lines = [head + f"{report.rows} rows{bad}" + ("" if not report.ok else ", ok")]
    lines += [f"  error: {e}" for e in report.errors]
    lines += [f"  {b.text()}" for b in report.bad_rows]
    hidden = report.bad_row_count - len(report.bad_rows)
    if hidden > 0:
        lines.append(f"  ... and {hidden} more bad rows (--max-errors N shows more than {max_errors})")
    lines += [f"  warning: {w}" for w in report.warnings]
    if report.tokens:
        t = report.tokens
        lines.append(
            f"  tokens per row (content only, before the chat template): p50 {t['p50']}, p90 {t['p90']}, "
            f"p99 {t['p99']}, max {t['max']}"
        )
    return "\n".join(lines)


# -- register -------------------------------------------------------------------------------------


def run_register(args: argparse.Namespace) -> int:
    done = add_dataset(args.file, args.name, args.formatting, args.dataset_dir, force=args.force)
    print(f"registered {args.name} ({done.report.rows} rows, {args.formatting}) in {done.info_path}")
    if done.backup is not None:
        print(f"previous dataset_info.json kept as {done.backup}")
    print(f"use it with: dataset: {args.name}, dataset_dir: {done.info_path.parent}")
    return EXIT_OK
