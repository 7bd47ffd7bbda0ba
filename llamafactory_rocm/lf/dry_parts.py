"""The parts of a dry launch that training's (lf/dry_run.py) and the after-training commands' (lf/dry_load.py)
share: the result, the meta device's limits, and whether the model is reachable without a download; and what
the training launch's steps hand on to each other (``Launch``). An exception's words: errors.py ``one_line``."""

from __future__ import annotations

import dis
import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import one_line
from ..findings import Finding, Level
from .causes import Cause
from .memory import ModelMemory


@dataclass
class Resume:
    """The checkpoint the run resumes from, as LLaMA-Factory's ``get_train_args`` set it."""

    checkpoint: str
    global_step: int | None = None  # trainer_state.json's global_step
    total_steps: int | None = None  # max_steps, or the checkpointed run's own max_steps
    steps_left: int | None = None


@dataclass
class DryRun:
    findings: list[Finding] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)  # "not checked: <what> (<why>)"
    rows: dict[str, int] | None = None  # {"train": n, "eval": m} after LLaMA-Factory's processing
    rows_estimated: bool = False  # True when the rows were capped and the counts scaled to the full data
    # (rows the pipeline made of the rows it read, those read, the full split's) where the train count is
    # scaled and not exact: packing, or rows the processors dropped; None where counted or exact
    train_rows_scaled: tuple[int, int, int] | None = None
    # the token count of each train row LLaMA-Factory's pipeline left (the capped rows: a sample where
    # rows_estimated), for the forecast's padded tokens (forecast/tokens.py); None where not read
    train_lengths: tuple[int, ...] | None = None
    # pairwise rows (the rm data stage: dpo, rm): each row is a chosen and a rejected sequence, padded together
    # (train_lengths holds the longer of the two); the tokens of both, not padded, of each row
    train_pair_tokens: tuple[int, ...] | None = None
    # kto rows: the length of each row's KL sequence (kl_input_ids), padded as a batch of its own
    train_kl_lengths: tuple[int, ...] | None = None
    # how many times each train row counts where several datasets were read in other shares than the run mixes
    # them (lf/dry_data.py _row_weights); None where the rows read stand each for as many of the run's
    train_row_weights: tuple[int, ...] | None = None
    forecast: dict[str, Any] = field(default_factory=dict)  # what the forecast's step hooks found (forecast/)
    resume: Resume | None = None
    stage: str | None = None
    data_stage: str | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds per step
    # the parameters of the model load_model + init_adapter built (memory.count_model), with the optimizer
    # state per trainable element once the trainer's optimizer class is known; None when not built
    built: ModelMemory | None = None
    # where the model's config and tokenizer came from when not local (lf/model_files.py ModelFiles.as_json):
    # fetched without weights, or a bundled shape with a stand-in tokenizer; None when local or cached
    model_files: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not any(f.level is Level.ERROR for f in self.findings)

    def skip(self, what: str, why: str, case: str = "unreachable") -> None:
        """``case``: "unreachable" (what this machine lacks, checked when the run starts) or "estimate" (a part
        the memory estimate leaves out)."""
        line = f"not checked: {what} ({why})"
        self.not_checked.append(line)
        self.findings.append(Finding(code="DRY_RUN_NOT_CHECKED", message=line + ".", fix_as=case))

    def error(self, *, code: str, message: str, key: str | None = None, **fix: Any) -> None:
        """An error; ``fix``: the registry template's ``fix_with`` values and ``fix_as`` case (findings/)."""
        self.add(code=code, level=Level.ERROR, message=message, key=key, **fix)

    def refused(self, *, code: str, message: str, cause: Cause, key: str | None = None, other: str = "other") -> None:
        """An error whose fix is the library's refusal's cause (lf/causes.py cause_of): its case, values, key and
        remedy; ``key``: the key where the cause names none; ``other``: the case said where no pattern matched."""
        case = other if cause.case == "other" else cause.case
        self.error(
            code=code, message=message, key=cause.key or key, fix_as=case, fix_with=cause.values, remedy=cause.remedy
        )

    def add(self, *, code: str, level: Level, message: str, key: str | None = None, **fix: Any) -> None:
        self.findings.append(Finding(code=code, level=level, message=message, key=key, **fix))


@dataclass
class Launch:
    """What the training launch's dry steps share (lf/dry_run.py runs them in order): LLaMA-Factory's parsed
    arguments, the result, and what each step hands on to the next."""

    run: DryRun
    tmp: Path  # a temporary folder for the data step's caches and any tokenized_path it would save
    rows_cap: int
    model_args: Any
    data_args: Any
    training_args: Any
    finetuning_args: Any
    deepspeed_elsewhere: bool = False  # see lf/dry_run.py dry_launch
    config: dict[str, Any] = field(default_factory=dict)  # the config as given, for a refusal's cause (lf/causes.py)
    planned: bool = False  # for another machine: its Hub cache and offline setting are its own (lf/dry_run.py)
    tokenizer_module: dict[str, Any] | None = None  # load_tokenizer's (lf/dry_model.py)
    template: Any = None  # get_template_and_fix_tokenizer's (lf/dry_model.py)
    model: Any = None  # load_model's, on the meta device (lf/dry_model.py)
    train_rows: int | None = None  # the rows LLaMA-Factory trains on (lf/dry_data.py)
    user_max_samples: int | None = None  # the config's max_samples, before the dry run caps it (lf/dry_data.py)
    tokenized_max_id: int | None = None  # the largest id in a saved tokenized_path (lf/dry_data.py)
    tokenized_vocab: int = 0  # the tokenizer's length, when a tokenized_path is loaded (lf/dry_data.py)
    step: str = "workflow"  # the launch step running now, for a type error's message
    patches: Any = None  # the launch's undo stack (lf/patching.py Patches): what a step changes is put back after


def _meta_limitation(exc: BaseException) -> bool:
    """Whether ``exc`` is the meta device's limit rather than a refusal, told by its type and where it was
    raised, not its words: a NotImplementedError raised inside torch or by a native op (an op without a
    Meta kernel, ``.tolist()``), or a RuntimeError raised by a native op rather than a ``raise`` statement,
    or by torch's meta kernels themselves (``_meta_registrations``: ``Tensor.item() cannot be called on meta
    tensors``), not by their shape checks (``torch._check``, which fail on real weights too). A refusal by
    LLaMA-Factory, transformers, peft or the Hub (a missing adapter folder, a module name) is a ``raise`` in
    their own code."""
    if not isinstance(exc, RuntimeError):  # NotImplementedError is one
        return False
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    native = not any(i.offset == tb.tb_lasti and i.opname.startswith("RAISE") for i in dis.get_instructions(code))
    import torch

    where = os.path.abspath(code.co_filename)
    if isinstance(exc, NotImplementedError):  # a RuntimeError subclass: checked first
        return native or where.startswith(os.path.dirname(torch.__file__) + os.sep)
    # a shape check fails in torch/__init__.py (torch._check): a real refusal
    return native or where == os.path.abspath(inspect.getfile(torch._meta_registrations))


def reachable(run: DryRun, model_args: Any, *, offline_refuses: bool = False, quiet: bool = False) -> bool:
    """config.json local or in the Hugging Face cache, decided by transformers' own ``cached_file``.
    ``offline_refuses``: a Hub id not in the cache is an error where the user's environment is offline
    (the training launch, lf/dry_run.py); otherwise, and for the after-training commands, "not checked"
    (``quiet``: not said, the caller says what it did instead: lf/model_files.py)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id
    from transformers.utils import CONFIG_NAME, cached_file

    name = model_args.model_name_or_path
    if os.path.isdir(name):
        return True
    try:
        found = cached_file(
            name,
            CONFIG_NAME,
            cache_dir=model_args.cache_dir,
            revision=model_args.model_revision,
            local_files_only=True,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
        )
    except HFValidationError:
        found = None
    except OSError:
        found = None
    if found:
        return True
    try:
        validate_repo_id(name)
    except HFValidationError as exc:
        run.error(
            code="MODEL_NOT_FOUND",
            message=f"model_name_or_path {name} is not a folder here and not a Hugging Face repo id "
            f"(huggingface_hub: {one_line(exc)}).",
            fix_as="path",
            key="model_name_or_path",
        )
        return False
    if offline_refuses and user_offline("hub") and not _other_hub():
        run.error(
            code="MODEL_NOT_FOUND",
            message=f"model_name_or_path {name} is not a folder here and not in the Hugging Face cache, and "
            "HF_HUB_OFFLINE is set: the run cannot download it (LLaMA-Factory: 'Failed to load tokenizer.').",
            fix_as="offline",
            fix_with={"model": name},
            key="model_name_or_path",
        )
        return False
    if not quiet:
        run.skip(
            "tokenizer, template, data pipeline and model modules",
            f"{name} is not local and not in the Hugging Face cache",
        )
    return False


def user_offline(what: str) -> bool:
    """Whether the run, in this environment, may not download (the dry run itself never does: lf/patching.py
    ``hub_offline``). ``what``: "hub" (models: huggingface_hub's HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) or "datasets"
    (datasets' HF_DATASETS_OFFLINE, which defaults to the hub's). Read from the environment now, with the
    libraries' own parsing (huggingface_hub's constants and datasets' config modules read them at import)."""
    import huggingface_hub.constants as hub

    offline = hub._is_true(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))
    if what == "datasets":
        import datasets.config

        own = os.environ.get("HF_DATASETS_OFFLINE")
        return offline if own is None else own.upper() in datasets.config.ENV_VARS_TRUE_VALUES
    return offline


def _other_hub() -> bool:
    """LLaMA-Factory downloads from ModelScope or Modelers instead of the Hugging Face Hub
    (extras/misc.py use_modelscope / use_openmind): HF_HUB_OFFLINE does not stop those."""
    from llamafactory.extras.misc import use_modelscope, use_openmind

    return bool(use_modelscope() or use_openmind())
