"""LLaMA-Factory's own launch, run dry: every step up to the first training step, with no weights and no GPU.

After ``get_train_args`` (lf/verdict.py), LLaMA-Factory 0.9.5's workflows (``train/sft/workflow.py``
``run_sft`` and its siblings) go on with ``load_tokenizer``, ``get_template_and_fix_tokenizer``,
``get_dataset(..., stage=<the workflow's data stage>)``, ``load_model`` (config, model, ``init_adapter``),
then transformers' ``Trainer`` (optimizer, scheduler, reporting callbacks, dataloader, resume). Each of
these refuses configs ``get_train_args`` accepts. Here they run as LLaMA-Factory runs them, in its order,
each step in its module (lf/dry_model.py, dry_data.py, dry_resume.py, dry_trainer.py; each says what it
changes, docs/llamafactory-launch.md#d4 to #d7) so that nothing heavy is loaded and nothing is written where
the user looks. Here: the stage's workflow and its trainer's version pins, and ``output_dir``; the Hub is
offline for the whole call (lf/patching.py ``llamafactory_call``): a model or tokenizer that is neither a
folder nor in the Hugging Face cache is "not checked", never downloaded (lf/dry_parts.py ``reachable``).

The steps share one ``Launch`` (lf/dry_parts.py): the parsed arguments and what each step hands on.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import one_line
from .causes import free_folder
from .dry_activations import trace_step
from .dry_data import load_data
from .dry_model import build_model, build_workflow_models, tokenizer_and_template
from .dry_parts import DryRun, Launch
from .dry_resume import check_resume
from .dry_step import first_step
from .dry_trainer import trainer_setup
from .model_files import model_files
from .patching import llamafactory_call, progress_bars_off
from .stages import NoWorkflow, UnknownStage, conflicting_requirement, data_stage, trainer_requirements
from .text_only import text_only_llamafactory


def dry_launch(
    config: Mapping[str, Any],
    *,
    rows_cap: int = 256,
    deepspeed_elsewhere: bool = False,
    planned: bool = False,
    parsed: Any = None,
) -> DryRun:
    """Run LLaMA-Factory's launch on ``config`` (a dict as ``run_exp(args=...)`` receives it), dry.
    ``deepspeed_elsewhere``: the run is a DeepSpeed one on the target, though its ``deepspeed:`` key was left
    out here (planning: DeepSpeed and torchrun are the target's); a checkpoint is then judged as DeepSpeed
    resumes it. ``planned``: the run is for another machine, whose Hugging Face cache and offline setting are
    its own (a Hub id not cached here is "not checked", never refused). ``parsed``: what ``get_train_args``
    returned for this config already (check/rank.py's verdict), so LLaMA-Factory's parser runs once a check."""
    run = DryRun()
    with text_only_llamafactory():
        import llamafactory.data
        import llamafactory.model  # noqa: F401
        from llamafactory.hparams import get_train_args
    with tempfile.TemporaryDirectory(prefix="lfrocm-dry-") as folder, llamafactory_call() as patches:
        tmp = Path(folder)
        progress_bars_off(patches)
        # LLaMA-Factory prints a training example (loader.py _get_preprocessed_dataset, print_data_example)
        patches.enter_context(contextlib.redirect_stdout(io.StringIO()))
        start = time.perf_counter()
        try:
            args = parsed if parsed is not None else get_train_args(dict(config))
        except (Exception, SystemExit) as exc:
            run.timings["parse"] = time.perf_counter() - start
            refused = f"get_train_args refused the config: {one_line(exc)}"
            run.skip("LLaMA-Factory's launch after get_train_args", refused)
            return run
        run.timings["parse"] = time.perf_counter() - start
        launch = Launch(
            run,
            tmp,
            rows_cap,
            *args[:4],
            deepspeed_elsewhere=deepspeed_elsewhere,
            config=dict(config),
            planned=planned,
            patches=patches,
        )
        try:
            _go(launch)
        except (TypeError, AttributeError) as exc:
            if not _stopped_by_unconverted_values(run, config, launch.step, exc):
                raise  # no value of another type to blame: a bug of ours, said as one (exit 4)
    return run


def _stopped_by_unconverted_values(run: DryRun, config: Mapping[str, Any], step: str, exc: Exception) -> bool:
    """A launch step stopped with a type error while the config hands a string field another type
    (``cache_dir: true``: huggingface_hub's ``Path(cache_dir)``; ``optim_args: 7``: transformers'
    ``_parse_optim_args``); stock LLaMA-Factory stops there with the same traceback. Said as an error naming
    those keys; False where the config has none (then the error is not the config's)."""
    from .schema import field_defaults, load_schema

    suspects = load_schema().unconverted_values(config)
    if not suspects:
        # `key: null` where the field has a value by default (gradient_accumulation_steps: null): parse_dict
        # hands None on, and the step that computes with it stops (int(None), None * 2)
        defaults = field_defaults()
        nulls = [k for k, v in config.items() if v is None and defaults.get(k) is not None]
        if not nulls:
            return False
        run.error(
            code="VALUE_TYPE_STOPS_LAUNCH",
            message=f"{', '.join(f'{k}: null' for k in nulls[:3])} where LLaMA-Factory's field has a value "
            f"(default {getattr(defaults[nulls[0]], 'value', defaults[nulls[0]])!r}); its parser hands null on, and "
            f"the launch stops at its {step} step with {type(exc).__name__}: {one_line(exc)}",
            fix_as="null",
            fix_with={"key": nulls[0]},
            key=nulls[0],
            remedy={nulls[0]: None},
        )
        return True
    named = ", ".join(f"{s.key}: {s.value!r} (type {type(s.value).__name__})" for s in suspects[:3])
    run.error(
        code="VALUE_TYPE_STOPS_LAUNCH",
        message=f"{named} where LLaMA-Factory's field takes a string; its parser hands YAML values on "
        f"unconverted, and the launch stops at its {step} step with {type(exc).__name__}: {one_line(exc)}",
        fix_as="string",
        fix_with={"key": suspects[0].key},
        key=suspects[0].key,
        remedy={suspects[0].key: None},
    )
    return True


def _timed(launch: Launch, name: str, step: Callable[[Launch], None]) -> None:
    launch.step = name
    start = time.perf_counter()
    try:
        step(launch)
    finally:
        launch.run.timings[name] = time.perf_counter() - start


def _go(launch: Launch) -> None:
    """The steps in LLaMA-Factory's order, each timed; a step runs where the ones before it left what it needs."""
    run = launch.run
    run.stage = launch.finetuning_args.stage
    try:
        run.data_stage = data_stage(run.stage)
    except NoWorkflow:
        run.error(
            code="STAGE_UNKNOWN",
            message=f"LLaMA-Factory has no workflow for stage {run.stage!r}: run_exp stops with "
            f'"Unknown task: {run.stage}." (train/tuner.py)',
            key="stage",
            remedy={"stage": "sft"},
        )
        return
    except UnknownStage as exc:
        run.skip("the data pipeline", str(exc))
    _check_stage_requirements(launch)
    _timed(launch, "output_dir", _check_output_dir)
    launch.step = "model lookup"
    # local, in the cache, fetched (config and tokenizer, no weights), or a bundled shape with a stand-in
    # tokenizer (lf/model_files.py); or, the user offline on this machine and not planning, refused
    found = model_files(launch)
    if found:
        _timed(launch, "tokenizer", tokenizer_and_template)
    if launch.template is not None and run.data_stage is not None:
        _timed(launch, "data", load_data)
    if found:
        _timed(launch, "model", build_model)
        _timed(launch, "activations", trace_step)
    if found and launch.tokenizer_module is not None:  # dpo/kto's reference, ppo's reward model
        _timed(launch, "workflow models", build_workflow_models)
    _timed(launch, "resume", check_resume)
    _timed(launch, "trainer", trainer_setup)
    _timed(launch, "first step", first_step)  # the workflow itself, to its first optimizer step, on a twin


def _check_stage_requirements(launch: Launch) -> None:
    """The versions the stage's trainer requires when it is built (ppo: trl), with transformers' own
    ``require_version``, the call the trainer makes (lf/stages.py reads the requirement from it)."""
    from transformers.utils.versions import require_version

    stage = launch.run.stage
    for requirement in trainer_requirements(stage):
        try:
            require_version(requirement)
        except ImportError as exc:
            own = conflicting_requirement(requirement)
            launch.run.error(
                code="STAGE_PACKAGE_VERSION",
                message=f"LLaMA-Factory's {stage} trainer requires {requirement} (train/{stage}/trainer.py "
                f"require_version), checked when it is built after the model is loaded: {one_line(exc)}"
                + (f"; LLaMA-Factory itself requires {own} at start-up, so no version serves both" if own else ""),
                fix_as="conflict" if own else "install",
                fix_with={"requirement": requirement, "own": own, "stage": stage},
                key="stage",
            )


def _check_output_dir(launch: Launch) -> None:
    out = launch.training_args.output_dir
    if not out:
        return
    # transformers' Trainer.save_model/_save: os.makedirs(output_dir, exist_ok=True) raises
    # FileExistsError on a file, at the first save (after the first save_steps of training).
    if os.path.exists(out) and not os.path.isdir(out):
        launch.run.error(
            code="OUTPUT_DIR_NOT_A_FOLDER",
            message=f"output_dir {out} is a file: the trainer's first save "
            "(os.makedirs(output_dir, exist_ok=True)) "
            "raises FileExistsError after the first save_steps.",
            key="output_dir",
            remedy={"output_dir": free_folder(out)},
        )
        return
    # The trainer creates output_dir (os.makedirs) and writes into it. Asked of the file system itself: a
    # folder made and removed at once in output_dir, or where os.makedirs would make its first folder (a
    # parent that is a file: NotADirectoryError; read-only or /proc: OSError, as the real makedirs).
    base = os.path.abspath(out)
    while not os.path.lexists(base):
        base = os.path.dirname(base)
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".lfrocm-probe-", dir=base))
    except OSError as exc:
        launch.run.error(
            code="OUTPUT_DIR_NOT_CREATABLE",
            message=f"output_dir {out} cannot be created or written: at {base}, {type(exc).__name__}: {one_line(exc)}",
            fix_with={"value": os.path.join("saves", os.path.basename(os.path.normpath(out)) or "run")},
            key="output_dir",
            remedy={"output_dir": os.path.join("saves", os.path.basename(os.path.normpath(out)) or "run")},
        )
