"""One check request, built once from what the user gave, used by ``check``, ``train`` and the hook alike.

What a check needs is read here and only here: the config (a file with overrides, flags or a dict, read
as LLaMA-Factory reads it), its path, the target GPU, the machine (probed once, planned or recorded),
the environment the rules see, the accepted codes and how deep to check. ``check/run.py`` turns a
request into a report; the rule context is built from the request there.

The environment: the rules see every variable they read, the world's included (``MASTER_ADDR`` too, so
``MASTER_ADDR_LOOPBACK`` judges the real value); records keep privacy on their own (the snapshot's
``env`` never holds ``MASTER_ADDR``, a host name).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..findings import ACCEPT_ENV, parse_accept
from ..machine.snapshot import Snapshot


class Depth(str, Enum):
    """How much of the check a process runs."""

    FULL = "full"  # rules, the data pass, LLaMA-Factory's parser and its launch run dry
    RULES = "rules"  # the pure rules only: a rank whose node's first rank runs the full check


@dataclass(frozen=True)
class CheckRequest:
    config: dict[str, Any]
    config_path: str | None = None
    origin: str = "check_config"
    command: str | None = "train"  # None: the command its keys say (lf/commands.py chosen_entry)
    gpu: str | None = None
    arch: str | None = None
    snapshot: Snapshot | None = None  # None: probe this machine (once, in run_check)
    env: dict[str, str] | None = None  # None: this process's, as rule_env() reads it
    accept: frozenset[str] = frozenset()
    # A named target on a machine without its GPU: planned (check) or an error (train, the hook).
    plan: bool = True
    depth: Depth = Depth.FULL
    extra_findings: tuple[Any, ...] = field(default_factory=tuple)


def rule_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every variable a rule reads, from this process: the machine's (probe) and the world's (rules/world.py)."""
    from ..machine.probe import relevant_env
    from ..machine.snapshot import WORLD_ENV_VARS

    environ = os.environ if environ is None else environ
    return {**relevant_env(environ), **{k: environ[k] for k in WORLD_ENV_VARS if k in environ}}


def accepted_codes(value: Any, environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """``--accept`` when given, else ``LLAMAFACTORY_ROCM_ACCEPT``: one reading for check, train and the hook."""
    if value is not None and not isinstance(value, str):
        return parse_accept(",".join(value))  # codes already split: the same refusals apply
    if value is None:
        value = (os.environ if environ is None else environ).get(ACCEPT_ENV)
    return parse_accept(value)


def from_launch_args(
    tokens: list[str] | tuple[str, ...] | str | Path,
    *,
    origin: str,
    gpu: str | None = None,
    arch: str | None = None,
    snapshot: Snapshot | None = None,
    accept: str | None = None,
    planned_world: Mapping[str, str] | None = None,
    plan: bool = True,
    command: str | None = "train",
) -> CheckRequest:
    """What ``llamafactory-cli train`` takes (``cfg.yaml key=value ...`` or ``--key value ...``) as a request."""
    from .config_io import load_launch_args

    if isinstance(tokens, (str, Path)):
        tokens = [str(tokens)]
    config, config_path = load_launch_args(tokens)
    env = {**(snapshot.env if snapshot is not None else rule_env()), **(planned_world or {})}
    return CheckRequest(
        config=config,
        config_path=config_path,
        origin=origin,
        command=command,
        gpu=gpu,
        arch=arch,
        snapshot=snapshot,
        env=env,
        accept=accepted_codes(accept),
        plan=plan,
    )


def from_run_exp(args: dict[str, Any] | list[str] | None) -> CheckRequest | None:
    """What ``run_exp(args)`` receives, read by LLaMA-Factory's own ``read_args`` exactly as the rank reads
    it (a YAML path and overrides in argv, a flag list, or a dict); None for ``--help``."""
    from ..lf.library import read_args

    raw = read_args(args)
    if isinstance(raw, list) and ("-h" in raw or "--help" in raw):
        return None  # LLaMA-Factory prints its own help
    config_path = None
    if args is None and isinstance(raw, dict):
        origin = "llamafactory-cli train (hook)"
        import sys

        config_path = sys.argv[1]  # read_args read this very file (it chose it by its suffix)
    elif isinstance(raw, list):
        origin = "LLaMA-Factory flags (hook)"
    else:
        origin = "run_exp (hook)"
    if isinstance(raw, list):
        from ..lf.schema import load_schema

        raw = load_schema().flags_to_config(raw)
    if not isinstance(raw, dict):
        raise UsageError("LLaMA-Factory was given a config that is not a mapping of keys.")
    return CheckRequest(
        config=dict(raw),
        config_path=config_path,
        origin=origin,
        env=rule_env(),
        accept=accepted_codes(None),
        plan=False,
    )
