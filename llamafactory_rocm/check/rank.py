"""LLaMA-Factory's parser and dry run judge the config as one rank of the world its launcher starts.

Where ``llamafactory-cli train`` starts torchrun (FORCE_TORCHRUN, more than one visible device, ...:
rules/world.py ``starts_torchrun``, pinned to the launcher of both LLaMA-Factory lines), each rank
runs ``run_exp`` with torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, ...) and one device:
transformers' ``TrainingArguments`` then has ``n_gpu`` 1 and ``parallel_mode`` DISTRIBUTED, and
LLaMA-Factory's parser accepts a node of 8 GPUs. Judged in one plain process instead, the same node
has ``n_gpu`` 8 and ``parallel_mode`` NOT_DISTRIBUTED, and the parser refuses every 8-GPU run
("Please launch distributed training with `llamafactory-cli` or `torchrun`").

So the check takes a rank's view: torchrun's variables for this node's first rank of that world (rank
NODE_RANK x NPROC_PER_NODE, the one that runs the full check under the hook; or the rank's own, under
torchrun), and torch's fake process group (``torch.testing._internal.distributed.fake_pg``:
collectives that complete at once, no peer, no network) already initialised, so that accelerate's
``PartialState`` and LLaMA-Factory's ``main_process_first`` barriers use it instead of joining or
pairing anything with the real ranks. Afterwards the group is destroyed, accelerate's shared state
reset and the environment restored, so the real launch starts from a clean process.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..findings import Finding, Level, has_errors
from ..findings.registry import fix_text
from ..lf.causes import cause_of
from ..lf.commands import Command, command_verdict
from ..lf.patching import Patches
from ..lf.verdict import DeviceAnswers, device_answers_patched
from ..machine.snapshot import Snapshot
from ..rules import accept_findings
from .target import target_install

# What torchrun gives each rank (torch/distributed/run.py, elastic agent): set for the rank's view,
# removed for a plain process, restored after either.
DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
                   "GROUP_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")  # fmt: skip


@dataclass(frozen=True)
class RankWorld:
    """One rank of a torchrun world: the numbers torchrun hands it."""

    size: int  # WORLD_SIZE: nodes x ranks per node
    local_size: int  # LOCAL_WORLD_SIZE: NPROC_PER_NODE
    rank: int = 0
    local_rank: int = 0
    source: str = ""

    def environ(self, env: Mapping[str, str]) -> dict[str, str]:
        nodes = max(1, self.size // max(1, self.local_size))
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.size),
            "LOCAL_WORLD_SIZE": str(self.local_size),
            "GROUP_RANK": str(self.rank // max(1, self.local_size)),
            "GROUP_WORLD_SIZE": str(nodes),
            "ROLE_RANK": str(self.rank),
            "ROLE_WORLD_SIZE": str(self.size),
            # LLaMA-Factory's launcher passes --master_addr/--master_port (default 127.0.0.1 and a free port)
            "MASTER_ADDR": env.get("MASTER_ADDR") or "127.0.0.1",
            "MASTER_PORT": env.get("MASTER_PORT") or "29500",
        }

    def describe(self) -> str:
        return (
            f"rank {self.rank} of a torchrun world of {self.size} ({self.local_size} per node"
            + (f"; {self.source}" if self.source else "")
            + ")"
        )


def _int(value: str | None) -> int | None:
    value = (value or "").strip()
    return int(value) if value.isdigit() else None


def running_rank(environ: Mapping[str, str] | None = None) -> RankWorld | None:
    """This process's own rank when torchrun started it (the hook on every rank), else None."""
    environ = os.environ if environ is None else environ
    size, local_rank = _int(environ.get("WORLD_SIZE")), _int(environ.get("LOCAL_RANK"))
    if size is None or local_rank is None or size < 1:
        return None
    local_size = _int(environ.get("LOCAL_WORLD_SIZE")) or size
    rank = _int(environ.get("RANK")) or 0
    return RankWorld(size=size, local_size=local_size, rank=rank, local_rank=local_rank, source="this rank")


@contextlib.contextmanager
def judged_as(world: RankWorld | None) -> Iterator[Callable[[Mapping[str, Any]], dict[str, Any]]]:
    """LLaMA-Factory's parser and dry run as ``world``'s rank (a fake process group), or as one plain
    process when ``world`` is None (no process group, no barrier). Yields how the config is judged. Undone on
    one stack (lf/patching.py ``Patches``), last first: the group ended, torch's threads and the environment
    put back (torchrun's variables removed again, whoever set them in between)."""
    with Patches() as patches:
        saved = {k: os.environ[k] for k in DISTRIBUTED_ENV if k in os.environ}
        for name in DISTRIBUTED_ENV:
            patches.delenv(name)
        if world is not None:
            for name, value in world.environ(saved).items():
                patches.setenv(name, value)
            import torch

            # accelerate's CPU ranks set it (PartialState, OMP_NUM_THREADS unset)
            patches.callback(torch.set_num_threads, torch.get_num_threads())
            patches.callback(_end_process_group, _fake_process_group(world))
        yield dict


def _fake_process_group(world: RankWorld) -> bool:
    """torch's fake process group for this rank; False where one is already up (not ours to end)."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        return False
    # Importing it registers the "fake" backend (dist.Backend.register_backend), nothing else.
    from torch.testing._internal.distributed.fake_pg import FakeStore

    _reset_accelerate()
    dist.init_process_group("fake", store=FakeStore(), rank=world.rank, world_size=world.size)
    return True


def _end_process_group(started: bool) -> None:
    import torch.distributed as dist

    if started and dist.is_initialized():
        dist.destroy_process_group()
    if started:
        _reset_accelerate()


def _reset_accelerate() -> None:
    """accelerate keeps one PartialState per process: the dry run's must not become the real run's."""
    with contextlib.suppress(ImportError):
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)


def launched_world(config: Mapping[str, Any], env: Mapping[str, str], ctx: Any) -> RankWorld | None:
    """The rank whose view judges the config: this process's own under torchrun; else this node's first rank
    of the world LLaMA-Factory's launcher starts for ``env`` on ``ctx``'s node (rules/world.py, the launcher's line);
    None for one plain process, and when planning without a GPU count (the world is not known)."""
    own = running_rank()
    if own is not None:
        return own
    from ..rules.base import env_enabled
    from ..rules.world import read_world, starts_torchrun

    world, problems = read_world(config, env, ctx)
    if problems:  # the world rule refuses it in its own words
        return None
    ray = env_enabled(env, "USE_RAY")
    if not ray and not starts_torchrun(env, ctx):
        return None
    if ctx.snapshot.source.startswith("planned") and _int(env.get("NPROC_PER_NODE")) is None and not ray:
        return None
    local = 1 if ray else world.per_node  # a Ray worker holds one GPU (LLaMA-Factory's placement bundle)
    # The launcher's static rendezvous (torchrun --node_rank NODE_RANK) numbers node n's ranks from n x ranks
    # per node: on node 1 no rank 0 runs. Under RDZV_ID (c10d, no --node_rank) the rendezvous picks the order.
    static = not ray and env.get("RDZV_ID") is None
    first = (_int(env.get("NODE_RANK")) or 0) * local if static else 0
    return RankWorld(size=world.size, local_size=local, rank=first, source=world.source)


def judged(
    config: Mapping[str, Any],
    env: Mapping[str, str],
    ctx: Any,
    entry: Command,
    findings: list[Finding],
    accepted: frozenset[str],
) -> tuple[list[Finding], Any]:
    """LLaMA-Factory's own parser for ``entry`` on the resolved config, judged as the rank of the world its
    launcher starts, then the entry's dry builder where nothing refused: ``findings`` (the rules') with theirs
    added, and the training launch's dry run (lf/dry_parts.py DryRun; None for the other commands)."""
    answers = device_answers(ctx.snapshot)
    rank = launched_world(config, env, ctx) if entry.trains else None
    if rank is not None:  # a new list: the caller's (the rules' resolution) is left as it was
        findings = [
            *findings,
            Finding(
                code="JUDGED_AS_RANK",
                new=rank.size,
                message=f"LLaMA-Factory's parser and launch ran dry as {rank.describe()}: what each rank of "
                "that world runs (one device each); no collective was joined.",
            ),
        ]
    dry = None
    with judged_as(rank):
        verdict, parsed = llamafactory_verdict(config, answers, entry)
        # LLaMA-Factory's parser runs before its data, model and packages are loaded: its refusal is the
        # one the run stops on, so it comes first (the rules' package or data errors after it).
        refused, findings = one_finding_a_package([f for f in verdict if f.level is Level.ERROR], findings)
        findings = refused + findings + [f for f in verdict if f.level is not Level.ERROR]
        if not has_errors(findings) and entry.dry is not None:  # then its dry build (eval has none)
            if entry.trains:  # LLaMA-Factory's training launch, dry
                built, dry = dry_launch_findings(config, ctx.snapshot, answers, parsed, entry)
            else:  # export, chat, api, webchat: the model on meta
                built = entry.dry.load()(config, entry.name, planned=answers is not None).findings
            findings += accept_findings(built, accepted)
    return findings, dry


# The rules' findings of a package this machine lacks, each with the package names in ``new``
# (rules/packages.py, rules/predict.py)
_PACKAGE_CODES = frozenset({"PACKAGE_MISSING", "EVAL_PACKAGES_MISSING"})


def _distribution(requirement: str) -> str:
    """The distribution a requirement names, as pip compares names (``rouge_chinese`` is ``rouge-chinese``)."""
    from packaging.utils import canonicalize_name

    from ..rules.packages import requirement_name

    return canonicalize_name(requirement_name(requirement))


def one_finding_a_package(refused: list[Finding], findings: list[Finding]) -> tuple[list[Finding], list[Finding]]:
    """LLaMA-Factory's parser refusing a package that a rule already finds missing is one cause, said once: the
    rule's finding (it names the key that needs the package and every package the key needs: the parser stops
    at the first) with the parser's words added, in the parser's place (first: the run stops there)."""
    named = {}
    for finding in findings:
        if finding.level is Level.ERROR and finding.code in _PACKAGE_CODES:
            for name in finding.new if isinstance(finding.new, list | tuple) else [finding.new]:
                if isinstance(name, str):
                    named.setdefault(_distribution(name), finding)
    first, folded = [], set()
    for finding in refused:
        rule = named.get(finding.new) if finding.code == "LLAMAFACTORY_REFUSED" else None
        if rule is None or id(rule) in folded:
            first.append(finding)
            continue
        folded.add(id(rule))
        words = finding.message.split(": ", 1)[-1]
        first.append(rule.model_copy(update={"message": f"{rule.message} LLaMA-Factory's parser refuses it: {words}"}))
    return first, [f for f in findings if id(f) not in folded]


def device_answers(snapshot: Snapshot) -> DeviceAnswers | None:
    """The target's device answers for LLaMA-Factory's parser; None when the snapshot is this machine."""
    if snapshot.source == "probe":
        return None
    rocm = snapshot.is_rocm
    label = snapshot.source.removeprefix("planned: ").removesuffix(" from the catalogue")
    return DeviceAnswers(label=label, bf16=rocm or snapshot.torch.kind == "cuda", tf32=snapshot.torch.kind == "cuda")


def llamafactory_verdict(
    config: Mapping[str, Any], answers: DeviceAnswers | None, entry: Command
) -> tuple[list[Finding], Any]:
    """LLaMA-Factory's own parser for ``entry`` on the resolved config (get_train_args for train), as one
    finding when it refuses; and what it parsed when it accepts (handed to the dry launch: parsed once)."""
    command = entry.name
    parsed = dict(config)
    notes = [] if answers is None else [Finding(code="PARSER_PLANNED", message=answers.describe() + ".")]
    verdict = command_verdict(parsed, entry, answers, load=False)  # the dry load reports in its own codes
    if verdict.accepted:
        return notes, verdict.parsed
    trains = entry.trains
    which = "" if trains else f" for `llamafactory-cli {command}`"
    cause = cause_of("LLAMAFACTORY_REFUSED", verdict.message, config, trains=trains)
    requirement = cause.values.get("requirement") if cause.case == "package missing" else None
    return [
        *notes,
        Finding(
            code="LLAMAFACTORY_REFUSED",
            key=cause.key,
            old=verdict.error_type,
            new=_distribution(requirement) if requirement else None,  # the package it refuses without
            message=f"LLaMA-Factory's own argument check{which} refuses this config: {verdict.message}",
            fix_as=cause.case,
            fix_with={"command": command, **cause.values},
            remedy=cause.remedy,
        ),
    ], None


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
    config: Mapping[str, Any], snapshot: Snapshot, answers: DeviceAnswers | None, parsed: Any, entry: Command
) -> tuple[list[Finding], Any]:
    """LLaMA-Factory's launch run dry on the resolved config (``entry``'s dry builder: lf/dry_run.py
    ``dry_launch``), as findings; ``parsed``: what LLaMA-Factory's parser returned for it in this check."""
    dry_launch = entry.dry.load()  # lf/dry_run.py dry_launch, the training entry's builder
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
