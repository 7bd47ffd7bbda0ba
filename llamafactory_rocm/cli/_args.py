"""Arguments shared by the subcommands that take a LLaMA-Factory config."""

from __future__ import annotations

import argparse


def add_config_arguments(p: argparse.ArgumentParser, gpu_help: str, arch_help: str) -> None:
    p.add_argument("config", help="LLaMA-Factory YAML/JSON config")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--gpu", help=gpu_help)
    target.add_argument("--arch", help=arch_help)
