"""The training dry run's resume step (lf/dry_run.py): the checkpoint LLaMA-Factory resumes from
(``training_args.resume_from_checkpoint`` as ``get_train_args`` set it), checked by the files transformers'
or DeepSpeed's loader needs, and against the meta model's adapter by tensor shapes only (safetensors
metadata; docs/llamafactory-launch.md#d6). Nothing is loaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import one_line
from ..findings import Level
from .causes import free_folder
from .dry_parts import Launch, Resume

TRAINER_STATE_NAME = "trainer_state.json"  # transformers/trainer.py: TRAINER_STATE_NAME (pinned by a test)
FSDP_MODEL_NAME = "pytorch_model_fsdp"  # transformers/trainer.py: FSDP_MODEL_NAME (pinned by a test)
DEEPSPEED_LATEST = "latest"  # DeepSpeedEngine.load_checkpoint(tag=None) reads the tag from this file


def check_resume(launch: Launch) -> None:
    checkpoint = launch.training_args.resume_from_checkpoint
    if not checkpoint or not launch.training_args.do_train:
        return
    checkpoint = str(checkpoint)
    deepspeed = bool(launch.training_args.deepspeed) or launch.deepspeed_elsewhere
    resume = Resume(checkpoint=checkpoint)
    launch.run.resume = resume
    if not os.path.isdir(checkpoint) or not checkpoint_loadable(checkpoint, deepspeed=deepspeed):
        needs = (
            "a global_step* folder named by a 'latest' file (DeepSpeed)"
            if deepspeed
            else "model or adapter weights (model.safetensors, adapter_model.safetensors, ...)"
        )
        launch.run.error(
            code="CHECKPOINT_NOT_LOADABLE",
            message=f"resume_from_checkpoint {checkpoint} cannot be resumed: the trainer needs "
            f"{TRAINER_STATE_NAME} "
            f"and {needs} there ('Can't find a valid checkpoint at {checkpoint}').",
            key="resume_from_checkpoint",
            # named in the config: start over without it; found in output_dir by LLaMA-Factory: a new output_dir
            remedy={"resume_from_checkpoint": None}
            if "resume_from_checkpoint" in launch.config
            else {"output_dir": free_folder(str(launch.training_args.output_dir))},
        )
        return
    if not _trainer_state_loads(launch, Path(checkpoint)):
        return
    state = _read_json(Path(checkpoint) / TRAINER_STATE_NAME)
    resume.global_step = _int_or_none(state.get("global_step"))
    if launch.training_args.max_steps and launch.training_args.max_steps > 0:
        resume.total_steps = int(launch.training_args.max_steps)
    else:
        resume.total_steps = _int_or_none(state.get("max_steps"))
    if resume.total_steps is not None and resume.global_step is not None:
        resume.steps_left = max(resume.total_steps - resume.global_step, 0)
    left = f"{resume.steps_left} of {resume.total_steps} steps left" if resume.steps_left is not None else ""
    launch.run.add(
        code="RESUMES_FROM_CHECKPOINT",
        level=Level.INFO,
        message=f"The run resumes from {checkpoint} (global step {resume.global_step})"
        + (f": {left}." if left else "."),
        key="resume_from_checkpoint",
    )
    if not deepspeed:
        _check_checkpoint_matches(launch, Path(checkpoint))


def _trainer_state_loads(launch: Launch, checkpoint: Path) -> bool:
    """The checkpoint's trainer_state.json read as the installed transformers reads it on resume
    (trainer.py ``_init_training_state``): ``TrainerState.load_from_json`` (a field another version added:
    TypeError), ``compare_trainer_and_checkpoint_args`` (a train_batch_size it lacks: TypeError), and the
    first checkpoint save after it (``_save_checkpoint``), which looks up each exportable callback's entry in
    ``stateful_callbacks`` (a version that did not write them: KeyError 'TrainerControl')."""
    from transformers import TrainerControl, TrainerState
    from transformers.trainer_utils import compare_trainer_and_checkpoint_args

    args = launch.training_args
    try:
        state = TrainerState.load_from_json(str(checkpoint / TRAINER_STATE_NAME))
        compare_trainer_and_checkpoint_args(args, state)
        if str(getattr(args.save_strategy, "value", args.save_strategy)) != "no":
            # the trainer's own control is the exportable state it always has ([self.control])
            state.stateful_callbacks[TrainerControl.__name__]
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        # get_train_args resumes on its own from output_dir's last checkpoint; one elsewhere was named
        explicit = os.path.realpath(checkpoint.parent) != os.path.realpath(str(args.output_dir))
        launch.run.error(
            code="CHECKPOINT_STATE_INCOMPATIBLE",
            message=f"{checkpoint / TRAINER_STATE_NAME} was written by another transformers version: the installed "
            f"one, resuming, raises {type(exc).__name__}: {one_line(exc)}",
            fix_as="explicit" if explicit else "output_dir",
            fix_with={"value": os.path.join(os.path.dirname(str(args.output_dir).rstrip("/")) or ".", "new-run")},
            key="resume_from_checkpoint" if explicit else "output_dir",
            remedy={"resume_from_checkpoint": None} if explicit else {"output_dir": free_folder(str(args.output_dir))},
        )
        return False
    return True


def _check_checkpoint_matches(launch: Launch, checkpoint: Path) -> None:
    from transformers.utils import ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME

    has_adapter = any((checkpoint / name).is_file() for name in (ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME))
    peft_run = launch.model is not None and _is_peft(launch.model)
    ftype = launch.finetuning_args.finetuning_type
    if launch.model is not None and has_adapter != peft_run:
        what = "an adapter only" if has_adapter else "full model weights, no adapter"
        launch.run.error(
            code="CHECKPOINT_MISMATCH",
            message=f"{checkpoint} holds {what}, but this run's finetuning_type is {ftype}: transformers' "
            "Trainer._load_from_checkpoint cannot load it into this model.",
            fix_as="finetuning_type",
            key="finetuning_type",
        )
        return
    if not (has_adapter and peft_run):
        return
    saved = _saved_shapes(checkpoint)
    if saved is None:
        launch.run.skip("the checkpoint's adapter shapes", f"{checkpoint} has no adapter_model.safetensors")
        return
    from peft import get_peft_model_state_dict

    peft_model = launch.model.pretrained_model if hasattr(launch.model, "v_head") else launch.model
    expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(peft_model).items()}
    differ = sorted(k for k in saved.keys() & expected.keys() if saved[k] != expected[k])
    only_saved = sorted(saved.keys() - expected.keys())
    only_run = sorted(expected.keys() - saved.keys())
    config = _read_json(checkpoint / "adapter_config.json")
    if differ or only_saved or only_run:
        parts = []
        if differ:
            k = differ[0]
            parts.append(f"{len(differ)} tensors differ in shape (e.g. {k}: {saved[k]} saved, {expected[k]} now)")
        if only_saved or only_run:
            parts.append(
                f"{len(only_saved)} saved tensors are not in this run and {len(only_run)} of this run's are "
                f"not saved (e.g. {(only_saved or only_run)[0]})"
            )
        remedy = _checkpoint_adapter(config, peft_model.peft_config.get(peft_model.active_adapter))
        launch.run.error(
            code="CHECKPOINT_MISMATCH",
            message=f"{checkpoint} was trained with another adapter (r={config.get('r')}, "
            f"target_modules={config.get('target_modules')}): {'; '.join(parts)}. Resuming dies in "
            "load_state_dict (size mismatch) or in the optimizer's load_state_dict.",
            fix_as="adapter",
            fix_with={
                "adapter": ", ".join(f"{k}: {v}" for k, v in remedy.items()) if remedy else "lora_rank/lora_target"
            },
            key="lora_rank" if differ else "lora_target",
            remedy=remedy,
        )
    base = config.get("base_model_name_or_path")
    if base and not _same_model(base, launch.model_args.model_name_or_path):
        launch.run.add(
            code="CHECKPOINT_BASE_DIFFERS",
            level=Level.WARNING,
            message=f"{checkpoint}'s adapter was trained on {base}, and this run's model is "
            f"{launch.model_args.model_name_or_path}.",
            key="model_name_or_path",
        )


def checkpoint_loadable(folder: str | os.PathLike[str], *, deepspeed: bool | None = None) -> bool:
    """Whether transformers' Trainer can resume from ``folder`` (file checks only; nothing is loaded).

    ``deepspeed``: True for a DeepSpeed run (``deepspeed_load_checkpoint``), False for the others
    (``Trainer._load_from_checkpoint``), None for either.
    """
    from transformers.utils import (
        ADAPTER_SAFE_WEIGHTS_NAME,
        ADAPTER_WEIGHTS_NAME,
        SAFE_WEIGHTS_INDEX_NAME,
        SAFE_WEIGHTS_NAME,
        WEIGHTS_INDEX_NAME,
        WEIGHTS_NAME,
    )

    root = Path(folder)
    # trainer.py Trainer.train: TrainerState.load_from_json(os.path.join(resume_from_checkpoint,
    # TRAINER_STATE_NAME)) runs for every resume, DeepSpeed or not.
    if not root.is_dir() or not (root / TRAINER_STATE_NAME).is_file():
        return False
    # trainer.py Trainer._load_from_checkpoint: "Can't find a valid checkpoint" unless one of these
    # files, an FSDP checkpoint, or an adapter sub-folder is there.
    names = (
        WEIGHTS_NAME,
        SAFE_WEIGHTS_NAME,
        WEIGHTS_INDEX_NAME,
        SAFE_WEIGHTS_INDEX_NAME,
        ADAPTER_WEIGHTS_NAME,
        ADAPTER_SAFE_WEIGHTS_NAME,
    )
    subdirs = [p for p in root.iterdir() if p.is_dir()]
    transformers_ok = (
        any((root / name).is_file() for name in names)
        or any(FSDP_MODEL_NAME in p.name for p in subdirs)
        or (root / f"{FSDP_MODEL_NAME}.bin").is_file()
        or any((p / ADAPTER_WEIGHTS_NAME).is_file() or (p / ADAPTER_SAFE_WEIGHTS_NAME).is_file() for p in subdirs)
    )
    # integrations/deepspeed.py deepspeed_load_checkpoint: glob(f"{checkpoint_path}/global_step*") must
    # match, then DeepSpeedEngine.load_checkpoint(checkpoint_path) with tag=None reads the tag from the
    # 'latest' file (without it: a warning and (None, None), which transformers turns into
    # "[deepspeed] failed to resume from checkpoint"). No gathered weights are needed.
    latest = root / DEEPSPEED_LATEST
    tag = latest.read_text(encoding="utf-8").strip() if latest.is_file() else ""
    deepspeed_ok = bool(list(root.glob("global_step*"))) and bool(tag) and (root / tag).is_dir()
    if deepspeed is None:
        return transformers_ok or deepspeed_ok
    return deepspeed_ok if deepspeed else transformers_ok


def _saved_shapes(checkpoint: Path) -> dict[str, tuple[int, ...]] | None:
    from safetensors import safe_open
    from transformers.utils import ADAPTER_SAFE_WEIGHTS_NAME

    path = checkpoint / ADAPTER_SAFE_WEIGHTS_NAME
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as f:  # reads the header only
        return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}  # noqa: SIM118 (safe_open is no dict)


def _checkpoint_adapter(saved: dict, now: Any) -> dict[str, Any] | None:
    """The LLaMA-Factory keys that rebuild the checkpoint's adapter: its adapter_config.json's ``r`` and
    ``target_modules`` where they differ from this run's LoraConfig (LLaMA-Factory's model/adapter.py builds
    LoraConfig(r=lora_rank, target_modules=lora_target split on commas)). None where neither differs or the
    saved value is not one a key can say (a regex target_modules)."""
    remedy: dict[str, Any] = {}
    rank, targets = saved.get("r"), saved.get("target_modules")
    if isinstance(rank, int) and rank != getattr(now, "r", None):
        remedy["lora_rank"] = rank
    if isinstance(targets, list) and set(targets) != set(getattr(now, "target_modules", None) or ()):
        remedy["lora_target"] = ",".join(sorted(targets))
    return remedy or None


def _is_peft(model: Any) -> bool:
    from peft import PeftModel

    inner = getattr(model, "pretrained_model", model)  # trl's value-head wrapper
    return isinstance(inner, PeftModel)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _same_model(a: str, b: str) -> bool:
    if os.path.exists(a) and os.path.exists(b):
        return os.path.realpath(a) == os.path.realpath(b)
    return a.rstrip("/") == b.rstrip("/")
