"""``llamafactory-rocm check CONFIG [key=value ...] | --key value ...  [--for COMMAND] [--gpu NAME] [--json]``.

``--for`` names the LLaMA-Factory command the config is for (train, export, chat, api, webchat, eval); without
it the command is read from the config's keys (``lf.commands.infer_command``), and a config whose keys do not
say is checked for train. The report says which, and how it was chosen.
"""

from __future__ import annotations

import argparse
import json
from contextlib import nullcontext
from pathlib import Path

from ..check.render import report_text
from ..check.request import from_launch_args
from ..check.run import run_check
from ..errors import EXIT_FINDINGS, EXIT_OK, UsageError, one_line
from ..forecast.flops import requested
from ..lf.commands import COMMANDS
from ..machine.snapshot import Snapshot
from ._args import add_config_arguments, add_world_arguments, world_env


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser(
        "check",
        help="dry run: findings and the resolved config, nothing launched",
        description="Check a LLaMA-Factory config against this machine (or a GPU you plan to rent) without "
        "launching anything: every rule, then LLaMA-Factory's own argument check. Takes what "
        "`llamafactory-cli train` takes. --for checks it for another llamafactory-cli command (export, chat, "
        "api, webchat, eval): that command's own parser and rules; without --for the keys decide "
        "(export_dir: export; infer_backend or an adapter without training keys: chat). "
        "Exit 0: ready to launch; 1: refused (each finding says the fix).",
        epilog="examples:\n"
        "  llamafactory-rocm check my_run.yaml\n"
        "  llamafactory-rocm check my_run.yaml learning_rate=2e-4 --gpu rx7900xtx --json\n"
        "  llamafactory-rocm check --stage sft --model_name_or_path meta-llama/Meta-Llama-3-8B-Instruct \\\n"
        "      --dataset amd_finetune_qa --template llama3 --do_train --fp16 --output_dir saves/run1\n"
        "  llamafactory-rocm check my_run.yaml --measure 5       # time 5 real steps here, forecast the run\n"
        "  llamafactory-rocm check my_run.yaml --cards           # the run on every catalogue card, cheapest first\n"
        "  llamafactory-rocm check other.yaml --rate-from m.json # time on the machine m.json's --measure timed\n"
        "  llamafactory-rocm check merge.yaml --for export\n"
        "  llamafactory-rocm check serve.yaml --for api --gpu mi300x",
    )
    add_config_arguments(
        p,
        gpu_help="check for this GPU (e.g. mi300x, rx7900xtx) instead of the one here",
        arch_help="check for this arch (e.g. gfx942)",
    )
    add_world_arguments(p)
    p.add_argument(
        "--for",
        dest="for_command",
        choices=COMMANDS,
        metavar="COMMAND",
        help=f"the llamafactory-cli command the config is for ({', '.join(COMMANDS)}); default: read from its keys, "
        "else train",
    )
    p.add_argument("--snapshot", help="check against a recorded machine snapshot (JSON) instead of this one")
    p.add_argument("--json", action="store_true", help="print {ok, findings, config, ...} as JSON (for scripts)")
    p.add_argument(
        "--forecast",
        action="store_true",
        help="forecast the run: optimizer steps, tokens with padding, FLOPs, time and cost on the card "
        "(docs/forecast.md); counts the FLOPs on the built model, which adds to the check's time",
    )
    p.add_argument(
        "--price",
        type=float,
        metavar="USD",
        help="price per GPU-hour for the forecast's cost (implies --forecast); default: the dated table",
    )
    p.add_argument(
        "--cards",
        action="store_true",
        help="forecast the run on every catalogue card: fits or not (the memory estimate), time, cost, cheapest "
        "first (implies --forecast)",
    )
    p.add_argument(
        "--measure",
        type=_measured_steps,
        metavar="N",
        help="run N optimizer steps (at least 2) of LLaMA-Factory's trainer on this machine in a throwaway folder, "
        "time the steps after the first and forecast the whole run from them (implies --forecast; your "
        "output_dir is not touched)",
    )
    p.add_argument(
        "--rate-from",
        metavar="FILE",
        help="forecast this run's time on the machine another config's measure timed: FILE is the output of "
        "`check OTHER.yaml --measure 5 --json` there (its FLOP rate and overheads; implies --forecast)",
    )
    p.set_defaults(run=run)


def _rate_from(path: str) -> tuple[str, object]:
    """(FILE, the measure it holds) for --rate-from; a UsageError, one line, where it holds none that carries."""
    from ..forecast.measure import fit_in

    try:
        said = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(
            f"--rate-from {path}: no such file (write one with check OTHER.yaml --measure 5 --json)"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(
            f"--rate-from {path} is not the JSON check --measure N --json writes: {one_line(exc)}"
        ) from None
    try:
        return path, fit_in(said if isinstance(said, dict) else {}, path)
    except ValueError as exc:
        raise UsageError(f"--rate-from {exc}") from None


def _measured_steps(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 2:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of steps: give a whole number of at least 2 (the first step "
            "is warm-up and is not timed), e.g. --measure 5"
        )
    return int(text)


def run(args: argparse.Namespace) -> int:
    if args.price is not None and not 0 < args.price < float("inf"):
        raise UsageError(f"--price {args.price} is not a price: give USD per GPU-hour above 0, e.g. --price 1.99")
    if args.measure is not None and (args.gpu or args.arch or args.snapshot):
        raise UsageError(
            "--measure times this machine's device, not a planned one: drop --gpu/--arch/--snapshot to measure "
            "here, or keep them and use --forecast alone"
        )
    rate_from = _rate_from(args.rate_from) if args.rate_from else None
    snapshot = load_snapshot(args.snapshot) if args.snapshot else None
    request = from_launch_args(
        args.launch_args,
        origin="llamafactory-rocm check",
        gpu=args.gpu,
        arch=args.arch,
        snapshot=snapshot,
        accept=args.accept,
        planned_world=world_env(args.nodes, args.gpus_per_node),
        command=args.for_command,  # None: the config's keys say (lf/commands.py chosen_entry)
    )
    asked = args.forecast or args.price is not None or args.measure is not None or args.cards or rate_from
    forecast = requested(args.price, cards=args.cards, measure=args.measure, rate_from=rate_from)
    with forecast if asked else nullcontext():
        report = run_check(request)
    entry = report.entry
    if args.json:
        said = {"command": entry.name, "command_from": report.command_from, **report.as_json()}
        print(json.dumps(said, indent=2, default=str))
    else:
        built = "" if entry.dry else f"; {entry.built_dry}"  # eval: its parser and rules only
        print(f"checked for: {entry.name} ({report.command_from}){built}")
        print(report_text(report))
    return EXIT_OK if report.ok else EXIT_FINDINGS


def load_snapshot(path: str) -> Snapshot:
    from pydantic import ValidationError

    if Path(path).exists() and not Path(path).is_file():  # a folder, or a FIFO that would block the read
        raise UsageError(f"snapshot {path} is not a regular file: give the JSON file `doctor --save-snapshot` wrote.")
    try:
        return Snapshot.load(path)
    except FileNotFoundError:
        raise UsageError(f"snapshot {path} not found.") from None
    except (ValueError, ValidationError) as exc:
        raise UsageError(
            f"snapshot {path} is not a llamafactory-rocm snapshot: {one_line(exc, first_line=True)}"
        ) from None
