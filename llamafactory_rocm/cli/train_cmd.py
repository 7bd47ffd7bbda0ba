"""``llamafactory-rocm train CONFIG [key=value ...] | --key value ...``: check, refuse, launch LLaMA-Factory."""

from __future__ import annotations

import argparse

from ._args import add_config_arguments


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser(
        "train",
        help="check, then run LLaMA-Factory's own trainer on the resolved config",
        description="Check the config on this machine, refuse it if the run would fail, record what runs "
        "(rocm_launch.json, rocm_resolved.yaml in output_dir), then hand over to LLaMA-Factory's trainer.",
        epilog="examples:\n"
        "  llamafactory-rocm train my_run.yaml\n"
        "  llamafactory-rocm train presets/mi300x_llama3_lora.yaml model_name_or_path=/models/llama3\n"
        "  llamafactory-rocm train my_run.yaml --accept MEMORY_OVER_DEVICE",
    )
    add_config_arguments(
        p, gpu_help="refuse unless this GPU is the one present", arch_help="refuse unless this arch is the one present"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..train.launch import train

    return train(args.launch_args, gpu=args.gpu, arch=args.arch, accept=args.accept)
