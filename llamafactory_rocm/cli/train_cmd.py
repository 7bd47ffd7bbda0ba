"""``llamafactory-rocm train CONFIG [key=value ...] | --key value ...``: check, refuse, launch LLaMA-Factory."""

from __future__ import annotations

import argparse

from ._args import add_config_arguments


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("train", help="check, then run LLaMA-Factory's own trainer on the resolved config")
    add_config_arguments(
        p, gpu_help="refuse unless this GPU is the one present", arch_help="refuse unless this arch is the one present"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..launch import train

    return train(args.launch_args, gpu=args.gpu, arch=args.arch, accept=args.accept)
