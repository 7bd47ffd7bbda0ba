"""Arguments shared by the subcommands that take a LLaMA-Factory config.

They take what ``llamafactory-cli train`` takes (``cfg.yaml key=value ...`` or ``--key value ...``):
everything that is not one of our own options below is LLaMA-Factory's, so our option names must
never be LLaMA-Factory keys (``tests/test_check_cli.py`` holds them apart).
"""

from __future__ import annotations

import argparse

LAUNCH_ARGS_USAGE = "CONFIG.yaml [key=value ...] | --key value ..."
OWN_OPTIONS = ("gpu", "arch", "accept")


def add_config_arguments(p: argparse.ArgumentParser, gpu_help: str, arch_help: str) -> None:
    p.usage = f"%(prog)s {LAUNCH_ARGS_USAGE} [options]"
    target = p.add_mutually_exclusive_group()
    target.add_argument("--gpu", help=gpu_help)
    target.add_argument("--arch", help=arch_help)
    p.add_argument(
        "--accept",
        metavar="CODE[,CODE]",
        help="go ahead despite these error findings, knowingly (e.g. MEMORY_OVER_DEVICE); they are shown and "
        "recorded. For llamafactory-cli: LLAMAFACTORY_ROCM_ACCEPT=CODE,...",
    )
    # Everything else on the line is LLaMA-Factory's (main.py hands it over as args.launch_args).
    p.set_defaults(takes_launch_args=True)


def add_world_arguments(p: argparse.ArgumentParser) -> None:
    """``--nodes N --gpus-per-node M``: the world to plan for, as torchrun's NNODES and NPROC_PER_NODE."""
    p.add_argument("--nodes", type=_positive, metavar="N", help="plan for N nodes (sets NNODES for the check)")
    p.add_argument(
        "--gpus-per-node",
        type=_positive,
        metavar="M",
        help="plan for M GPUs (ranks) per node (sets NPROC_PER_NODE for the check)",
    )


def world_env(nodes: int | None, gpus_per_node: int | None) -> dict[str, str]:
    """The torchrun variables the options stand for; {} when neither is given."""
    env = {}
    if nodes is not None:
        env["NNODES"] = str(nodes)
    if gpus_per_node is not None:
        env["NPROC_PER_NODE"] = str(gpus_per_node)
    return env


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)
