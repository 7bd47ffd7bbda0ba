"""``llamafactory-rocm train CONFIG [key=value ...]``: check, refuse on errors, launch LLaMA-Factory."""

from __future__ import annotations

import argparse


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("train", help="check, then run LLaMA-Factory's own trainer on the resolved config")
    p.add_argument("config", help="LLaMA-Factory YAML/JSON config")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--gpu", help="refuse unless this GPU is the one present")
    target.add_argument("--arch", help="refuse unless this arch is the one present")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..launch import train

    return train(args.config, args.overrides, gpu=args.gpu, arch=args.arch)
