"""``llamafactory-rocm presets list|show|copy|path``: the built-in presets, torchtune-style."""

from __future__ import annotations

import argparse
import json

from .. import presets
from ..forecast.render import table_lines


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser(
        "presets",
        help="list, show, copy the per-GPU LoRA presets",
        description="LoRA presets per AMD GPU, plain LLaMA-Factory YAML that stock llamafactory-cli runs.",
        epilog="examples:\n  llamafactory-rocm presets list --gpu w7900\n"
        "  llamafactory-rocm presets list --gpu mi300x --forecast\n"
        "  llamafactory-rocm presets show rx7900xtx_llama3_lora\n"
        "  llamafactory-rocm presets copy mi300x_llama3_lora ./my_run.yaml\n"
        "  llamafactory-rocm presets copy mi300x_llama3_lora ./my_run.yaml --with-after\n"
        "  llamafactory-rocm presets path mi250_llama3_lora",
    )
    verbs = p.add_subparsers(dest="verb", required=True, parser_class=type(p))
    ls = verbs.add_parser("list", help="every preset with its GPU, arch, model, method and memory estimate")
    ls.add_argument("--gpu", help="only presets for this GPU's arch (e.g. w7900 lists the gfx1100 ones)")
    ls.add_argument("--json", action="store_true", help="print a JSON list (for scripts)")
    ls.add_argument(
        "--forecast",
        action="store_true",
        help="also forecast each preset's run on its own dataset and target card (check --forecast for each: "
        "LLaMA-Factory's dry run, seconds a preset; a model not in the Hugging Face cache here gets no forecast, "
        "and says why)",
    )
    ls.set_defaults(run=run_list)
    show = verbs.add_parser(
        "show", help="print a preset's YAML with its target and memory need, and the export and chat configs after it"
    )
    show.add_argument("name", help="a preset name from `presets list`, e.g. rx7900xtx_llama3_lora")
    show.set_defaults(run=run_show)
    cp = verbs.add_parser("copy", help="copy a preset to edit it (never overwrites without --force)")
    cp.add_argument("name", help="a preset name from `presets list`")
    cp.add_argument("dest", help="a file name or an existing folder")
    cp.add_argument("--force", action="store_true", help="overwrite an existing file")
    cp.add_argument(
        "--with-after",
        action="store_true",
        help="also write the export and chat configs that follow it beside the copy (DEST_export.yaml, DEST_chat.yaml)",
    )
    cp.set_defaults(run=run_copy)
    where = verbs.add_parser("path", help="print the installed file's path")
    where.add_argument("name", help="a preset name from `presets list`")
    where.set_defaults(run=run_path)


def run_list(args: argparse.Namespace) -> int:
    infos = presets.list_presets(args.gpu)
    # made only when asked: a dry run of each preset (its model, tokenizer and dataset) takes seconds
    forecasts = {i.entry.name: preset_forecast(i.entry) for i in infos} if args.forecast else {}
    if args.json:
        print(
            json.dumps(
                [i.as_dict() | ({"forecast": forecasts[i.entry.name]} if forecasts else {}) for i in infos], indent=2
            )
        )
        return 0
    if forecasts:
        forecast_table(infos, forecasts)
        return 0
    print(f"{'NAME':28} {'GPU':10} {'ARCH':8} {'MODEL':10} {'METHOD':7} {'EST. PEAK':>14}  DESCRIPTION")
    for i in infos:
        d = i.as_dict()
        peak = f"{d['estimated_peak_gib']}/{d['vram_gib']:g} GiB" if d["estimated_peak_gib"] else "-"
        gpus = f"{d['gpus']}x{d['gpu']}" if d["gpus"] > 1 else d["gpu"]
        print(f"{d['name']:28} {gpus:10} {d['arch']:8} {d['model']:10} {d['method']:7} {peak:>14}  {d['description']}")
    print("\nNext: llamafactory-rocm presets show NAME, or presets copy NAME ./my_run.yaml")
    return 0


def forecast_table(infos: list[presets.PresetInfo], forecasts: dict[str, dict]) -> None:
    """Each preset's answer in a table (forecast/render.py ``table_lines``)."""
    print("\n".join(table_lines([(i.entry.name, forecasts[i.entry.name]) for i in infos])))


def preset_forecast(preset: presets.PresetEntry) -> dict:
    """``check --forecast`` of the preset on its target card and world (its GPUs as nodes of up to 8), as JSON;
    without step 1 on the twin, whose findings the list does not show (``check PRESET`` runs it)."""
    from ..check.run import check_config
    from ..forecast.flops import requested
    from ..lf.dry_step import forecast_only
    from ..rules.memory_fit import NODE_GPUS

    nodes = -(-preset.gpus // NODE_GPUS)
    world = {"NNODES": str(nodes), "NPROC_PER_NODE": str(preset.gpus // nodes)}
    with requested(), forecast_only():  # the list shows the forecast only: step 1 on the twin is not run
        report = check_config(presets.load(preset.name), gpu=preset.gpu, env=world)
    if report.forecast is None:
        errors = [f.line() for f in report.findings if f.level.value == "error"]
        return {"made": False, "why": "the check stopped before LLaMA-Factory's dry run: " + "; ".join(errors[:1])}
    return report.forecast.as_json()


def run_show(args: argparse.Namespace) -> int:
    d = presets.info(args.name).as_dict()
    peak = f"{d['estimated_peak_gib']} GiB estimated peak per device" if d["estimated_peak_gib"] else "unknown"
    print(f"# {d['name']}: {d['gpus']} x {d['gpu']} ({d['arch']}, {d['vram_gib']:g} GiB), {peak}")
    print(f"# file: {d['path']}\n")
    print(presets.path(args.name).read_text(encoding="utf-8"), end="")
    after = presets.after_paths(args.name)
    if not after:
        print("\n# After training: this preset ships no export or chat config (docs/after-training.md)")
        return 0
    print("\n# After training (train -> export -> chat; `presets copy NAME DEST --with-after` writes them):")
    for command, file in after.items():
        print(f"#   {command}: llamafactory-cli {command} {file}")
    return 0


def run_copy(args: argparse.Namespace) -> int:
    for written in presets.copy(args.name, args.dest, force=args.force, with_after=args.with_after):
        print(f"wrote {written}")
    target = presets.copy_target(args.name, args.dest)
    print(f"Next: edit it, then `llamafactory-rocm check {target}`")
    if args.with_after:
        after = presets.after_copy_names(args.name, args.dest)
        print(
            f"After training: `llamafactory-cli export {after['export']}`, then "
            f"`llamafactory-cli chat {after['chat']}` (if you change output_dir, change adapter_name_or_path in the "
            "export config to match)"
        )
    return 0


def run_path(args: argparse.Namespace) -> int:
    print(presets.path(args.name))
    return 0
