"""The pre-launch check as a Python API: config + machine (or a planned GPU) -> resolved config.

``check_config`` is what ``llamafactory-rocm check``, ``train`` and the hook inside stock
``llamafactory-cli train`` all call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..dataset import config_dataset_findings
from ..errors import UsageError
from ..findings import Finding, Level, has_errors, parse_accept
from ..lf.schema import load_schema
from ..lf.verdict import DeviceAnswers, parser_verdict
from ..machine.catalogue import Catalogue, base_arch, load_catalogue
from ..machine.probe import installed_distributions
from ..machine.snapshot import Device, KfdNode, Snapshot, TorchBuild
from ..memory import model_config_for
from ..rules import Context, Resolution, Target, resolve
from ..rules.packages import missing_packages

# Names LLaMA-Factory treats as final weights in output_dir (hparams/parser.py CHECKPOINT_NAMES).
_WEIGHT_FILES = (
    "adapter_model.safetensors",
    "adapter_model.bin",
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


@dataclass(frozen=True)
class Report:
    input_config: dict[str, Any]
    resolution: Resolution
    snapshot: Snapshot
    target: Target | None
    config_path: str | None = None
    env_before: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.resolution.ok

    @property
    def config(self) -> dict[str, Any]:
        return self.resolution.config

    @property
    def findings(self) -> list[Finding]:
        return self.resolution.findings

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "findings": [
                {"code": f.code, "level": f.level.value, "message": f.message, "fix": f.fix} for f in self.findings
            ],
            "config": self.config,
            "env_changes": self.resolution.env_changes,
            "target": None if self.target is None else self.target.__dict__,
            "snapshot_source": self.snapshot.source,
        }


# A preset's first line, kept by `presets copy`: `# llamafactory-rocm: target gpu=mi300x arch=gfx942 gpus=1`.
TARGET_HEADER = "# llamafactory-rocm: target"


def header_target(config_path: str | Path) -> dict[str, str]:
    """The ``key=value`` pairs of a config file's target header, or {} (also for unreadable files)."""
    try:
        with open(config_path, encoding="utf-8") as handle:
            head = [handle.readline() for _ in range(5)]
    except (OSError, UnicodeDecodeError):
        return {}
    for line in head:
        if line.startswith(TARGET_HEADER):
            pairs = (item.partition("=") for item in line[len(TARGET_HEADER) :].split())
            return {key: value for key, eq, value in pairs if eq}
    return {}


def resolve_target(
    gpu: str | None = None,
    arch: str | None = None,
    config_path: str | Path | None = None,
    catalogue: Catalogue | None = None,
) -> Target | None:
    """The GPU the user means: ``--gpu``/``--arch``, else the config's target header, else a
    preset-style file name (a guess: a copied preset keeps its header, not always its name)."""
    catalogue = catalogue or load_catalogue()
    if gpu and arch:
        raise UsageError("give --gpu or --arch, not both.")
    if gpu:
        return _gpu_target(gpu, "--gpu", catalogue)
    if arch:
        if catalogue.arch(arch) is None:
            near = catalogue.nearest_target(arch)
            hint = f" Did you mean {near}?" if near else ""
            raise UsageError(f"unknown arch {arch!r}.{hint} Known: {', '.join(sorted(catalogue.archs))}.")
        return Target(arch=base_arch(arch), alias=None, named_by="--arch")
    if config_path is None:
        return None
    header = header_target(config_path)
    name = Path(config_path).name
    if header.get("gpu"):
        return _gpu_target(header["gpu"], f"the target line of {name}", catalogue)
    if header.get("arch") and catalogue.arch(header["arch"]) is not None:
        return Target(arch=base_arch(header["arch"]), alias=None, named_by=f"the target line of {name}")
    stem = Path(config_path).stem
    found = catalogue.gpu(stem.split("_")[0]) if "_" in stem else None
    if found is not None:
        product, info = found
        return Target(arch=info.target, alias=product.alias, named_by=f"file name {name}")
    return None


def _gpu_target(gpu: str, named_by: str, catalogue: Catalogue) -> Target:
    found = catalogue.gpu(gpu)
    if found is None:
        near = ", ".join(catalogue.nearest_aliases(gpu)) or ", ".join(catalogue.aliases()[:6])
        raise UsageError(
            f"unknown GPU {gpu!r} ({named_by}); nearest known: {near}. See `llamafactory-rocm presets list`."
        )
    product, info = found
    return Target(arch=info.target, alias=product.alias, named_by=named_by)


def planned_snapshot(target: Target, env: Mapping[str, str], catalogue: Catalogue | None = None) -> Snapshot:
    """A snapshot of the machine the user plans to rent: one device of the target, official wheel."""
    catalogue = catalogue or load_catalogue()
    info = catalogue.archs[target.arch]
    product = next((p for p in info.products if p.alias == target.alias), info.products[0] if info.products else None)
    memory = int((product.vram_gib if product else 0) * 2**30)
    return Snapshot(
        source=f"planned: {target.alias or target.arch} from the catalogue",
        torch=TorchBuild(version="planned+rocm", hip="planned", arch_list=list(catalogue.official_torch_wheel_archs)),
        devices=[Device(index=0, name=product.name if product else target.arch, arch_name=target.arch,
                        total_memory_bytes=memory)],
        kfd_nodes=[KfdNode(node=1, gfx_target_version=info.gfx_target_version or 0)],
        env=dict(env),
    )  # fmt: skip


def existing_outputs(output_dir: str | Path) -> tuple[str, ...]:
    """checkpoint-* folders and final weight files already in output_dir (what a run could clobber)."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return ()
    names = sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name.startswith("checkpoint-"))
    names += [n for n in _WEIGHT_FILES if (folder / n).is_file()]
    return tuple(names)


# What transformers' Trainer loads a checkpoint from (trainer.py _load_from_checkpoint): one of these
# files, an adapter in a sub-folder, or an FSDP state.
_CHECKPOINT_WEIGHTS = (*_WEIGHT_FILES, "pytorch_model_fsdp.bin")


def resume_checkpoint(output_dir: str | Path) -> tuple[str, bool] | None:
    """(name, loadable) of the checkpoint LLaMA-Factory would resume from: transformers' own choice."""
    if not Path(output_dir).is_dir():
        return None
    from transformers.trainer_utils import get_last_checkpoint

    last = get_last_checkpoint(str(output_dir))
    if last is None:
        return None
    folder = Path(last)
    loadable = any((folder / name).is_file() for name in _CHECKPOINT_WEIGHTS) or any(
        sub.is_dir() and (sub.name.startswith("pytorch_model_fsdp") or any((sub / n).is_file() for n in _WEIGHT_FILES))
        for sub in folder.iterdir()
    )
    return folder.name, loadable


def resolve_deepspeed_path(
    config: Mapping[str, Any], config_path: str | Path | None, cwd: Path
) -> tuple[dict[str, Any], list[Finding]]:
    """A relative ``deepspeed:`` file that is not under the working directory but beside the config
    (presets ship theirs in presets/deepspeed/) is made absolute, so the run works from anywhere."""
    ds = config.get("deepspeed")
    if not ds or config_path is None or Path(str(ds)).is_absolute() or (cwd / str(ds)).is_file():
        return dict(config), []
    beside = (Path(config_path).resolve().parent / str(ds)).resolve()
    if not beside.is_file():
        return dict(config), []
    return {**config, "deepspeed": str(beside)}, [
        Finding(
            code="DEEPSPEED_PATH_RESOLVED",
            level=Level.CHANGE,
            key="deepspeed",
            old=ds,
            new=str(beside),
            message=f"deepspeed: {ds} is not under the working directory {cwd}, but is beside the config.",
            fix=f"Using {beside}.",
        )
    ]


def device_answers(snapshot: Snapshot) -> DeviceAnswers | None:
    """The target's device answers for LLaMA-Factory's parser; None when the snapshot is this machine."""
    if snapshot.source == "probe":
        return None
    rocm = snapshot.is_rocm
    label = snapshot.source.removeprefix("planned: ").removesuffix(" from the catalogue")
    return DeviceAnswers(label=label, bf16=rocm or snapshot.torch.kind == "cuda", tf32=snapshot.torch.kind == "cuda")


def llamafactory_verdict(config: Mapping[str, Any], ctx: Context) -> list[Finding]:
    """LLaMA-Factory's own get_train_args on the resolved config, as one finding when it refuses."""
    answers = device_answers(ctx.snapshot)
    parsed = dict(config)
    notes: list[Finding] = []
    if answers is not None:
        # Packages stated as requirements for the target are not asked of this machine's parser.
        for key in missing_packages(parsed, ctx.installed or frozenset()):
            parsed.pop(key, None)
        notes.append(
            Finding(
                code="PARSER_PLANNED",
                level=Level.INFO,
                message=answers.describe() + ".",
                fix="Run check again on the machine that trains: it then asks the real device.",
            )
        )
    verdict = parser_verdict(parsed, answers)
    if verdict.accepted:
        return notes
    return [
        *notes,
        Finding(
            code="LLAMAFACTORY_REFUSED",
            level=Level.ERROR,
            old=verdict.error_type,
            message=f"LLaMA-Factory's own argument check refuses this config: {verdict.message}",
            fix=refusal_fix(verdict.message),
        ),
    ]


# LLaMA-Factory's and transformers' refusals, by the words they use, and what to do.
_REFUSAL_FIXES = (
    ("model_name_or_path", "Add model_name_or_path: a Hugging Face id or a local model folder."),
    ("specify dataset", "Add dataset: a name from dataset_info.json (`llamafactory-rocm datasets list`)."),
    ("eval_dataset", "Add eval_dataset, or val_size: 0.1, or remove do_eval/do_predict."),
    ("predict_with_generate", "Remove predict_with_generate (SFT only), or add it where do_predict needs it."),
    ("overwrite_output_dir", "Use a new output_dir, or remove the final weights from this one."),
    ("fp16 and bf16", "Keep one of fp16 and bf16."),
    ("Quantization", "quantization_bit needs finetuning_type: lora (or oft)."),
    ("FORCE_TORCHRUN", "Set FORCE_TORCHRUN=1 in the environment to launch DeepSpeed through torchrun."),
    ("distribution was not found", "Install the package LLaMA-Factory names, or remove the key that needs it."),
)


def refusal_fix(message: str) -> str:
    for words, fix in _REFUSAL_FIXES:
        if words.lower() in message.lower():
            return fix
    return "Change the config as LLaMA-Factory's message says, then run check again."


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
                level=Level.WARNING,
                new=taken,
                message=f"Accepted knowingly: {', '.join(taken)}; the run goes ahead despite them.",
                fix="Nothing, if you meant it; remove them from --accept / LLAMAFACTORY_ROCM_ACCEPT otherwise.",
            )
        )
    return out


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
    run_parser: bool = True,
) -> Report:
    """Run every rule, then LLaMA-Factory's own argument check on the result. With no ``snapshot``
    the machine is probed; on a machine without a GPU a named target is checked as planned (unless
    ``plan_without_gpu`` is False, as for training). ``accept``: error codes the user accepts."""
    catalogue = load_catalogue()
    accepted = parse_accept(accept) if isinstance(accept, str) or accept is None else frozenset(accept)
    target = resolve_target(gpu, arch, config_path, catalogue)
    if snapshot is None:
        from ..machine.probe import take_snapshot

        snapshot = take_snapshot()
    env = dict(snapshot.env if env is None else env)
    input_config = dict(config)
    config, path_findings = resolve_deepspeed_path(config, config_path, Path.cwd())
    # Datasets are checked here, before any model is loaded: a broken row fails now, not on the GPU.
    config, dataset_findings = config_dataset_findings(config, Path.cwd())
    path_findings += dataset_findings
    if target is not None and not snapshot.devices and not snapshot.kfd_targets and plan_without_gpu:
        snapshot = planned_snapshot(target, env, catalogue)
    schema = load_schema()
    ctx = Context(
        snapshot=snapshot,
        catalogue=catalogue,
        known_keys=schema.keys,
        target=target,
        existing_outputs=existing_outputs(config.get("output_dir", "trainer_output")),
        resume_checkpoint=resume_checkpoint(str(config.get("output_dir", "trainer_output"))),
        model_config=model_config_for(str(config.get("model_name_or_path", ""))),
        extra_findings=(*extra_findings, *path_findings),
        schema=schema if schema.parser is not None else None,
        installed=installed_distributions(),
    )
    resolution = resolve(config, env, ctx)
    findings = accept_findings(resolution.findings, accepted)
    if run_parser and not has_errors(findings) and schema.parser is not None:
        findings += llamafactory_verdict(resolution.config, ctx)
    resolution = Resolution(resolution.config, resolution.env, resolution.env_changes, findings)
    return Report(
        input_config=input_config,
        resolution=resolution,
        snapshot=snapshot,
        target=target,
        config_path=None if config_path is None else str(config_path),
        env_before=env,
    )
