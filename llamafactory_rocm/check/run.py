"""The pre-launch check: a request -> a report. ``check``, ``train`` and the hook all come through here.

Order: the deepspeed path and the dataset folder are resolved, the data is read with datasets' loader
and LLaMA-Factory's converter (the data pass), the rules run on the machine or the planned target,
LLaMA-Factory's own ``get_train_args`` judges the result as a rank of the world its launcher starts
(check/rank.py), and LLaMA-Factory's launch runs dry up to step 1 (lf/dry_run.py). The plan rules (world,
memory: the entry's ``plan`` chain, ``rules.plan_for``) run once, last, on what the dry run found. A request at
``Depth.RULES`` (a rank whose node's first rank checks fully) runs the pure rules only: the resolved
config is the same on every rank because resolution is deterministic; only the costly parts are skipped.

``request.command`` routes the check by its entry in lf/commands.py's ``REGISTRY``: ``train`` (its ``dry``
builder: lf/dry_run.py ``dry_launch``) as above; ``export``, ``chat``, ``api``, ``webchat`` and ``eval`` run
the rule chain their entry holds (``rules_for``) and LLaMA-Factory's own parser for that command
(``command_verdict``: ``export_model`` up to its first load, ``get_infer_args``, ``get_eval_args``); no data
pass, no dry launch; those with a ``dry`` builder (lf/dry_load.py ``dry_load``) are then built dry (eval is
not; docs/after-training.md#t8).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..findings import Finding, Level, has_errors
from ..findings.registry import fix_text
from ..lf.causes import cause_of
from ..lf.commands import COMMANDS, checked_entry, command_keys, command_verdict
from ..lf.memory import model_config_for
from ..lf.outputs import existing_outputs, resume_checkpoint
from ..lf.schema import load_schema, output_dir_of
from ..lf.verdict import DeviceAnswers
from ..machine.catalogue import load_catalogue
from ..machine.probe import installed_distributions
from ..machine.snapshot import Snapshot
from ..rules import Context, Resolution, plan_for, resolve, rules_for
from ..rules.memory_fit import estimate_numbers
from .rank import judged_as, launched_world, rank_finding
from .report import Report
from .request import CheckRequest, Depth, accepted_codes
from .target import planned_snapshot, resolve_target, target_install

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


def device_answers(snapshot: Snapshot) -> DeviceAnswers | None:
    """The target's device answers for LLaMA-Factory's parser; None when the snapshot is this machine."""
    if snapshot.source == "probe":
        return None
    rocm = snapshot.is_rocm
    label = snapshot.source.removeprefix("planned: ").removesuffix(" from the catalogue")
    return DeviceAnswers(label=label, bf16=rocm or snapshot.torch.kind == "cuda", tf32=snapshot.torch.kind == "cuda")


def llamafactory_verdict(config: Mapping[str, Any], ctx: Context, command: str = "train") -> tuple[list[Finding], Any]:
    """LLaMA-Factory's own parser for ``command`` on the resolved config (get_train_args for train), as one
    finding when it refuses; and what it parsed when it accepts (handed to the dry launch: parsed once)."""
    answers = device_answers(ctx.snapshot)
    parsed = dict(config)
    notes: list[Finding] = []
    if answers is not None:
        notes.append(
            Finding(
                code="PARSER_PLANNED",
                message=answers.describe() + ".",
            )
        )
    verdict = command_verdict(parsed, command, answers, load=False)  # the dry load reports in its own codes
    if verdict.accepted:
        return notes, verdict.parsed
    trains = checked_entry(command).trains
    which = "" if trains else f" for `llamafactory-cli {command}`"
    cause = cause_of("LLAMAFACTORY_REFUSED", verdict.message, config, trains=trains)
    return [
        *notes,
        Finding(
            code="LLAMAFACTORY_REFUSED",
            key=cause.key,
            old=verdict.error_type,
            message=f"LLaMA-Factory's own argument check{which} refuses this config: {verdict.message}",
            fix_as=cause.case,
            fix_with={"command": command, **cause.values},
            remedy=cause.remedy,
        ),
    ], None


def accept_findings(findings: list[Finding], accepted: frozenset[str]) -> list[Finding]:
    """Errors the user accepted knowingly become warnings, marked as accepted (shown and recorded)."""
    out = []
    for finding in findings:
        if finding.code in accepted and finding.level is Level.ERROR:
            finding = finding.model_copy(update={"level": Level.WARNING, "message": f"(accepted) {finding.message}"})
        out.append(finding)
    taken = sorted({f.code for f in findings if f.code in accepted})
    if taken:
        out.append(
            Finding(
                code="FINDING_ACCEPTED",
                # not the entry's info: the run goes ahead past an error the user accepted, which a warning says
                level=Level.WARNING,
                new=taken,
                message=f"Accepted knowingly: {', '.join(taken)}; the run goes ahead despite them.",
            )
        )
    return out


# Dry-run refusals that depend on this machine's files and packages: planning for another machine,
# they are requirements for that machine, not errors here.
_TARGET_DEPENDENT = frozenset(
    {
        "MODEL_NOT_FOUND",
        "OPTIMIZER_UNAVAILABLE",
        "REPORTER_UNAVAILABLE",
        "STAGE_PACKAGE_VERSION",
        "QUANTIZATION_PACKAGE_MISSING",
        "OUTPUT_DIR_NOT_CREATABLE",  # the target's file system, not this one
        "DATASET_NOT_IN_CACHE_OFFLINE",  # the target's Hugging Face cache
    }
)
# Of those, the ones that name a package to install (``new``): the fix becomes the target's install line.
_TARGET_INSTALLS = frozenset({"QUANTIZATION_PACKAGE_MISSING"})


def dry_launch_findings(
    config: Mapping[str, Any], snapshot: Snapshot, parsed: Any = None, command: str = "train"
) -> tuple[list[Finding], Any]:
    """LLaMA-Factory's launch run dry on the resolved config (``command``'s dry builder: lf/dry_run.py
    ``dry_launch``), as findings; ``parsed``: what LLaMA-Factory's parser returned for it in this check."""
    from ..lf.verdict import device_answers_patched

    dry_launch = checked_entry(command).dry.load()  # lf/dry_run.py dry_launch, the training entry's builder

    answers = device_answers(snapshot)
    args = dict(config)
    planned_deepspeed = answers is not None and bool(args.pop("deepspeed", None))  # its JSON needs DeepSpeed
    with device_answers_patched(answers):  # a planned target answers where LLaMA-Factory asks the device
        # a ZeRO checkpoint resumes as DeepSpeed's; the target's Hub cache is its own
        dry = dry_launch(args, deepspeed_elsewhere=planned_deepspeed, planned=answers is not None, parsed=parsed)
    findings = []
    for finding in dry.findings:
        if answers is not None and finding.level is Level.ERROR and finding.code in _TARGET_DEPENDENT:
            update: dict[str, Any] = {"level": Level.WARNING, "message": f"(on the target) {finding.message}"}
            if finding.code in _TARGET_INSTALLS and finding.new:  # the package is the target's, not this machine's
                update["message"] = f"(missing on this machine; the plan is checked without it) {finding.message}"
                update["fix"] = fix_text(finding.code, {"install": target_install(finding.new, snapshot)}, "target")
            finding = finding.model_copy(update=update)
        findings.append(finding)
    return findings, dry


def run_check(request: CheckRequest) -> Report:
    """Every rule for ``request.command``, then LLaMA-Factory's own argument check for it, and for train its
    launch run dry, on ``request``."""
    command = request.command
    try:
        entry = checked_entry(command)  # the registry's entry, a command that reads a config
    except ValueError:
        from ..errors import UsageError

        raise UsageError(f"unknown command {command!r}: one of {', '.join(COMMANDS)}.") from None
    train = entry.trains  # the data pass, the output folder, the world and the launch run dry
    catalogue = load_catalogue()
    target = resolve_target(request.gpu, request.arch, request.config_path, catalogue)
    snapshot = request.snapshot
    if snapshot is None:
        from ..machine.probe import take_snapshot

        snapshot = take_snapshot()
    env = dict(snapshot.env if request.env is None else request.env)
    full = request.depth is Depth.FULL
    input_config = dict(request.config)
    config, path_findings = resolve_deepspeed_path(input_config, request.config_path, Path.cwd())
    from ..dataset import config_dataset_findings

    if train:  # Datasets are checked here, before any model is loaded: a broken row fails now, not on the GPU.
        config, dataset_findings = config_dataset_findings(config, Path.cwd(), read_rows=full)
        path_findings += dataset_findings
    if target is not None and not snapshot.devices and not snapshot.kfd_targets and request.plan:
        snapshot = planned_snapshot(target, env, catalogue)
    schema = load_schema()
    output_dir = output_dir_of(config)
    view = snapshot.training_view()  # an iGPU beside a discrete card is set aside (rules/visibility.py)
    ctx = Context(
        snapshot=view,
        integrated_devices=tuple(view.set_aside),
        catalogue=catalogue,
        known_keys=schema.keys if train else command_keys(command),
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
    resolution = resolve(config, env, ctx, rules=rules_for(command))
    findings = accept_findings(resolution.findings, request.accept)
    dry = None
    estimate = None
    # LLaMA-Factory's own parser judges the config even when a rule refused it, so that its first refusal is
    # said too; not where a rule found keys or values the parser cannot take at all (it would only repeat it).
    blocked = any(f.level is Level.ERROR and f.code in _PARSER_CANNOT_READ for f in findings)
    if full and not blocked and schema.parser is not None:
        rank = launched_world(resolution.config, resolution.env, ctx) if train else None
        if rank is not None:
            findings.append(rank_finding(rank))
        with judged_as(rank):
            verdict, parsed = llamafactory_verdict(resolution.config, ctx, command)
            # LLaMA-Factory's parser runs before its data, model and packages are loaded: its refusal is the
            # one the run stops on, so it comes first (the rules' package or data errors after it).
            refused = [f for f in verdict if f.level is Level.ERROR]
            findings = refused + findings + [f for f in verdict if f.level is not Level.ERROR]
            if not has_errors(findings) and entry.dry is not None and not train:  # export/chat/api/webchat
                planned = device_answers(ctx.snapshot) is not None
                loaded = entry.dry.load()(resolution.config, command, planned=planned).findings
                findings += accept_findings(loaded, request.accept)
            if not has_errors(findings) and train:  # LLaMA-Factory's training launch, dry
                dry_findings, dry = dry_launch_findings(resolution.config, ctx.snapshot, parsed, command)
                findings += accept_findings(dry_findings, request.accept)
    plan_rules = plan_for(command)
    if plan_rules:
        found = dict(extra_findings=())  # said once, by the first pass
        if dry is not None and dry.rows and dry.rows.get("train") is not None:
            found["train_rows"] = dry.rows["train"]
        if dry is not None and dry.built is not None:  # the parameters of the model LLaMA-Factory built
            found["built_model"] = dry.built
        plan_ctx = dataclasses.replace(ctx, **found)
        plan = resolve(resolution.config, resolution.env, plan_ctx, rules=plan_rules)
        findings += accept_findings(plan.findings, request.accept)
        estimate = estimate_numbers(plan.config, plan.env, plan_ctx) if train else None
        resolution = Resolution(plan.config, plan.env, {**resolution.env_changes, **plan.env_changes}, [])
    resolution = Resolution(resolution.config, resolution.env, resolution.env_changes, findings)
    forecast = None
    if train and dry is not None:  # check --forecast: the run's steps, tokens, FLOPs, time, cost (forecast/)
        from ..forecast.run import forecast_for
        from ..rules.world import world_size

        forecast = forecast_for(
            dry, resolution.config, world_size(resolution.config, resolution.env, ctx), catalogue,
            target.alias if target is not None else None, [d.name for d in ctx.snapshot.devices],
        )  # fmt: skip
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
