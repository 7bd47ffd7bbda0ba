"""What every rule receives and returns.

A rule is a pure function ``(config, env, ctx) -> Step``: it reads the config (a plain dict as
LLaMA-Factory would parse it), the environment variables it cares about and the machine snapshot,
and returns a new config/env plus its findings. It never touches the machine or the input dicts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..findings import Finding
from ..lf.commands import EXPORT, Chain
from ..machine.catalogue import ArchInfo, Catalogue
from ..machine.snapshot import Device, Snapshot

if TYPE_CHECKING:
    from ..lf.memory import ModelMemory

Config = dict[str, Any]
Env = dict[str, str]


@dataclass(frozen=True)
class Target:
    """The GPU a config is meant for: from ``--gpu``/``--arch`` or a preset's file name."""

    arch: str
    alias: str | None
    named_by: str  # "--gpu", "--arch" or "file name <x>"


@dataclass(frozen=True)
class Context:
    snapshot: Snapshot
    catalogue: Catalogue
    known_keys: frozenset[str]
    target: Target | None = None
    # checkpoint-* folders and final weight files already in output_dir (read by the caller)
    existing_outputs: tuple[str, ...] = ()
    # the checkpoint LLaMA-Factory would resume from (transformers' get_last_checkpoint); None when
    # output_dir has none
    resume_checkpoint: str | None = None
    # the model's config.json (local folder or shipped copy), for the memory estimate
    model_config: Mapping[str, Any] | None = None
    # findings computed outside the rule chain (dataset validation)
    extra_findings: tuple[Finding, ...] = field(default_factory=tuple)
    # LLaMA-Factory's argument schema (lf_schema.Schema): value types and choices; None: keys only
    schema: Any = None
    # distribution names installed here (lowercase, "-" for "_"); None when not read
    installed: frozenset[str] | None = None
    # examples LLaMA-Factory will train on, after its own processing and val_size split (the dry run's
    # count); None when the data could not be run
    train_rows: int | None = None
    # integrated devices (an iGPU beside a discrete card) that Snapshot.training_view() set aside: the
    # snapshot above is then the view, and rules/visibility.py says how to hide them (docs/rocm-facts.md#n10)
    integrated_devices: tuple[Device, ...] = ()
    # the parameters of the model LLaMA-Factory built in the dry run (lf/dry_model.py, DryRun.built, a
    # memory.ModelMemory): the memory estimate counts them; None before the dry run or where it built none
    built_model: ModelMemory | None = None

    @property
    def planned(self) -> bool:
        """The snapshot is not this machine (planned target or recorded file)."""
        return self.snapshot.source != "probe"

    @property
    def rocm(self) -> bool:
        return self.snapshot.is_rocm

    @property
    def cpu_only(self) -> bool:
        return self.snapshot.torch.kind == "cpu" and not self.snapshot.devices

    def arch_infos(self) -> list[tuple[str, ArchInfo | None]]:
        """(base arch, catalogue entry) for each distinct visible device arch."""
        return [(arch, self.catalogue.arch(arch)) for arch in self.snapshot.gpu_base_archs]


@dataclass
class Step:
    config: Config
    env: Env
    findings: list[Finding] = field(default_factory=list)


Rule = Callable[[Mapping[str, Any], Mapping[str, str], Context], Step]


@dataclass(frozen=True)
class OnlyWhere:
    """A chain a rule joins only where ``applies(config)``: elsewhere it leaves the config as it is."""

    chain: Chain
    applies: Callable[[Mapping[str, Any]], bool]

    def gated(self, rule: Rule) -> Rule:
        @functools.wraps(rule)
        def gated(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
            if not self.applies(config):
                return unchanged(config, env)
            return rule(config, env, ctx)

        return gated


def _export_loads_on_the_gpus(config: Mapping[str, Any]) -> bool:
    """``export_device: auto`` (docs/after-training.md#t2); LLaMA-Factory's default ``cpu`` uses no GPU."""
    return str(lf_value(config, "export_device", "cpu")).strip().lower() == "auto"


# The device rules in the export chain: only where the export loads onto the GPUs.
EXPORT_ON_GPU = OnlyWhere(EXPORT, _export_loads_on_the_gpus)

RULE_CHAINS = "__rule_chains__"  # the attribute ``rule`` sets: the chains a rule declared


def rule(*chains: Chain | OnlyWhere) -> Callable[[Rule], Rule]:
    """Declare the function below a rule of ``chains`` (lf/commands.py's ``Chain`` objects, which the commands'
    entries hold). rules/__init__.py lists each chain's rules in the order of its module list, and within a
    module in the order they are written; the function itself is returned unchanged."""

    def declare(function: Rule) -> Rule:
        setattr(function, RULE_CHAINS, chains)
        return function

    return declare


def unchanged(config: Mapping[str, Any], env: Mapping[str, str], *findings: Finding) -> Step:
    return Step(dict(config), dict(env), list(findings))


def truthy(value: Any) -> bool:
    """LLaMA-Factory gets booleans from YAML, but dict/CLI users also write "true"/"1"."""
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "on"}
    return bool(value)


def env_enabled(env: Mapping[str, str], name: str, default: str = "0") -> bool:
    """LLaMA-Factory's reading of a switch variable (``extras/misc.py`` ``is_env_enabled``: "true", "y" or
    "1", any case), on the mapping the rules see rather than this process's environment.
    tests/test_rules_world.py pins it to the function."""
    return env.get(name, default).lower() in ("true", "y", "1")


def lf_value(config: Mapping[str, Any], key: str, fallback: Any) -> Any:
    """The config's value for ``key``, else the default LLaMA-Factory's argument dataclasses give it (an
    enum's value: ``flash_attn`` "auto"). ``fallback`` serves only where LLaMA-Factory cannot be imported."""
    if key in config:
        return config[key]
    try:
        from ..lf.schema import field_default

        return field_default(key)
    except (ImportError, KeyError):
        return fallback
