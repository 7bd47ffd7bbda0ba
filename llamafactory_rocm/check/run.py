"""The pre-launch check: a request -> a report. ``check``, ``train`` and the hook all come through here.

The request flows down once, in the steps docs/architecture.md#one-check-top-to-bottom lists (eval is not
built, docs/after-training.md#t8). A request at ``Depth.RULES`` (a rank whose node's first rank checks fully)
runs the pure rules only: the resolved config is the same on every rank because resolution is deterministic;
only the costly parts are skipped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..findings import Finding, Level
from ..lf.commands import chosen_entry, command_keys
from ..lf.memory import model_config_for
from ..lf.outputs import existing_outputs, resume_checkpoint
from ..lf.schema import load_schema, output_dir_of
from ..machine.catalogue import load_catalogue
from ..machine.probe import installed_distributions
from ..machine.snapshot import Snapshot
from ..rules import Context, Resolution, chain_rules, resolve
from ..rules.memory_fit import estimate_numbers
from .rank import judged
from .report import Report
from .request import CheckRequest, Depth, accepted_codes
from .target import machine_for

__all__ = ["CheckRequest", "Depth", "Report", "check_config", "run_check"]


def resolve_deepspeed_path(
    config: Mapping[str, Any], config_path: str | Path | None, cwd: Path
) -> tuple[dict[str, Any], list[Finding]]:
    """A relative ``deepspeed:`` file that is not under the working directory but beside the config
    (presets ship theirs in presets/deepspeed/) is made absolute, so the run works from anywhere."""
    ds = config.get("deepspeed")
    try:
        if not ds or config_path is None or Path(str(ds)).is_absolute() or (cwd / str(ds)).is_file():
            return dict(config), []
        beside = (Path(config_path).resolve().parent / str(ds)).resolve()
        found = beside.is_file()
    except (OSError, ValueError):  # a NUL byte or an over-long name: LLaMA-Factory's parser says why
        return dict(config), []
    if not found:
        return dict(config), []
    return {**config, "deepspeed": str(beside)}, [
        Finding(
            code="DEEPSPEED_PATH_RESOLVED",
            key="deepspeed",
            old=ds,
            new=str(beside),
            message=f"deepspeed: {ds} is not under the working directory {cwd}, but is beside the config.",
            fix_with={"beside": beside},
        )
    ]


def run_check(request: CheckRequest) -> Report:
    """Every rule for ``request.command`` (None: the command the config's keys say), then LLaMA-Factory's own
    argument check for it, and for train its launch run dry and the forecast, on ``request``. The command's
    registry entry is looked up once, here, and handed on."""
    input_config = dict(request.config)
    config, path_findings = resolve_deepspeed_path(input_config, request.config_path, Path.cwd())
    entry, command_from = chosen_entry(request.config, request.command)
    known_keys = None if entry.trains else command_keys(entry.name)
    train = entry.trains  # the data pass, the output folder, the world and the launch run dry
    catalogue = load_catalogue()
    target, snapshot, view, env = machine_for(request, catalogue)
    full = request.depth is Depth.FULL
    from ..dataset import config_dataset_findings

    if train:  # Datasets are checked here, before any model is loaded: a broken row fails now, not on the GPU.
        config, dataset_findings = config_dataset_findings(config, Path.cwd(), read_rows=full)
        path_findings += dataset_findings
    schema = load_schema()
    output_dir = output_dir_of(config)
    ctx = Context(
        snapshot=view,
        integrated_devices=tuple(view.set_aside),
        catalogue=catalogue,
        known_keys=schema.keys if known_keys is None else known_keys,
        target=target,
        existing_outputs=existing_outputs(output_dir) if train else (),
        resume_checkpoint=resume_checkpoint(output_dir) if train else None,
        model_config=model_config_for(str(config.get("model_name_or_path", ""))),
        extra_findings=(*request.extra_findings, *path_findings),
        schema=schema if schema.parser is not None else None,
        installed=installed_distributions(),
    )
    # The plan rules (the world's batch arithmetic, memory) run once, after LLaMA-Factory's launch ran dry,
    # on what it found (the rows it trains on); the other rules before, on the config as given.
    resolution = resolve(config, env, ctx, rules=chain_rules(entry.rules), accept=request.accept)
    findings = resolution.findings
    dry = None
    estimate = None
    # LLaMA-Factory's own parser judges the config even when a rule refused it, so that its first refusal is
    # said too; not where a rule found keys or values the parser cannot take at all (it would only repeat it).
    blocked = any(f.level is Level.ERROR and f.code in _PARSER_CANNOT_READ for f in findings)
    if full and not blocked and schema.parser is not None:
        findings, dry = judged(resolution.config, resolution.env, ctx, entry, findings, request.accept)
    if entry.plan is not None:
        found = dict(extra_findings=())  # said once, by the first pass
        if dry is not None and dry.rows and dry.rows.get("train") is not None:
            found["train_rows"] = dry.rows["train"]
        if dry is not None and dry.built is not None:  # the parameters of the model LLaMA-Factory built
            found["built_model"] = dry.built
        plan_ctx = dataclasses.replace(ctx, **found)
        plan_rules = chain_rules(entry.plan)
        plan = resolve(resolution.config, resolution.env, plan_ctx, rules=plan_rules, accept=request.accept)
        findings += plan.findings
        estimate = estimate_numbers(plan.config, plan.env, plan_ctx) if train else None
        resolution = Resolution(plan.config, plan.env, {**resolution.env_changes, **plan.env_changes}, [])
    resolution = Resolution(resolution.config, resolution.env, resolution.env_changes, findings)
    forecast = None
    if train and dry is not None:  # check --forecast: the run's steps, tokens, FLOPs, time, cost (forecast/)
        from ..forecast.run import forecast_for
        from ..rules.world import world_size

        alias = target.alias if target is not None else None
        world = world_size(resolution.config, resolution.env, ctx)
        peak = estimate["peak_gib"] if estimate else None  # the memory rule's: --cards judges the cards by it
        forecast = forecast_for(dry, resolution, ctx, alias, world, peak)
    return Report(
        input_config=input_config,
        resolution=resolution,
        snapshot=snapshot,
        target=target,
        config_path=request.config_path,
        origin=request.origin,
        depth=request.depth.value,
        train_rows=None if dry is None or not dry.rows else dry.rows.get("train"),
        accepted=request.accept,
        estimate=estimate,
        forecast=forecast,
        entry=entry,
        command_from=command_from,
    )


# Rule errors that leave LLaMA-Factory's parser nothing to judge: it would refuse the same key or value.
_PARSER_CANNOT_READ = frozenset({"UNKNOWN_KEY", "VALUE_INVALID", "COMPUTE_DTYPE_UNKNOWN", "BACKEND_UNKNOWN"})


def check_config(
    config: Mapping[str, Any],
    *,
    snapshot: Snapshot | None = None,
    gpu: str | None = None,
    arch: str | None = None,
    config_path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    plan_without_gpu: bool = True,
    extra_findings: tuple[Finding, ...] = (),
    accept: frozenset[str] | str | None = None,
    command: str = "train",
) -> Report:
    """The Python API: check ``config`` on this machine (probed), a recorded ``snapshot``, or a planned
    ``gpu``/``arch``. With no ``snapshot`` the machine is probed; on a machine without a GPU a named target
    is checked as planned (unless ``plan_without_gpu`` is False, as for training). ``accept``: error codes
    the user accepts knowingly (default: ``LLAMAFACTORY_ROCM_ACCEPT``)."""
    request = CheckRequest(
        config=dict(config),
        config_path=None if config_path is None else str(config_path),
        command=command,
        gpu=gpu,
        arch=arch,
        snapshot=snapshot,
        env=None if env is None else dict(env),
        accept=accepted_codes(accept),
        plan=plan_without_gpu,
        extra_findings=tuple(extra_findings),
    )
    return run_check(request)
