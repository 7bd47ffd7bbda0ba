"""The training dry run's last step (lf/dry_run.py): LLaMA-Factory's own workflow, run for real to its first
optimizer step on a shrunk twin of the model (lf/twin.py) and the user's data, on the CPU.

What fails inside ``trainer.train()`` (the trainer's set-up, ``on_train_begin`` of every callback the workflow
adds, ``eval_on_start``, the first loss and backward, the optimizer and scheduler step, the first evaluation
and save where the config asks for one at step 1) is found by running it, not by building each part dry.
The workflow is ``llamafactory.train.tuner.run_exp`` itself, on the user's config with these changes: the
model (and a reference or reward model that is the same model) is the twin; output_dir, logging_dir, the
datasets cache and a tokenized_path it would save are in a throwaway folder; max_steps is the run's own total
(so the scheduler, the save and evaluation steps and the end of training are the run's) and the trainer stops
after step 1; the batch, the accumulation and cutoff_len are cut to what a step on the CPU holds (said); no
reporter; the Hub offline (a push_to_hub run that would create a repo is said as such where the user is not
offline). It runs in a forked child (os.fork: no import paid again, nothing it changes reaches the check), as
one process with torch on one thread (GNU OpenMP's pool does not survive a fork), with a time limit.

What the twin cannot tell (real kernels, real memory, the device's own errors, a world of several ranks)
stays with the meta build, the rules and the parser: the report's FIRST_STEP_RAN line says what ran where.
A failure before the trainer is built (the twin's own load) is "not checked", never a refusal.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import json
import os
import select
import signal
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import one_line
from ..findings import Finding
from .causes import cause_of
from .dry_parts import Launch, user_offline
from .patching import Patches
from .work import work_of

WHAT = "step 1 on a shrunk twin"
TIMEOUT_S = 240.0
# what one micro-batch of the twin holds on the CPU: its logits (tokens x vocabulary, float32) and tokens
LOGIT_ELEMENTS = 32 * 2**20
MAX_TOKENS = 1024
MAX_WORKERS = 2  # the dataloader workers step 1 starts at most (the run's own count is the GPU machine's)
MAX_ACCUMULATION = 2
GENERATED_TOKENS = 4  # predict_with_generate's evaluation at step 1: a few tokens show the generation runs
# the phases of the workflow, in order; a failure before the trainer is the twin's own load
PHASES = ("the workflow before its trainer", "the trainer's set-up", "train start", "step 1", "after step 1")
STOPPED = ("before its trainer", "in the trainer's set-up", "at train start", "in step 1", "after step 1")  # said
STAGES = ("pt", "sft", "rm", "dpo", "kto")
# torchrun's variables (the rank view sets them: check/rank.py), left behind by the twin's one process
DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")
DISTRIBUTED_ENV += ("ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")
# False where only the forecast is asked for (presets list --forecast): what step 1 finds is not shown there
_RUN_FIRST_STEP: contextvars.ContextVar[bool] = contextvars.ContextVar("run_first_step", default=True)
FORECAST_ONLY = "only the forecast was asked for (presets list --forecast)"


@contextlib.contextmanager
def forecast_only() -> Iterator[None]:
    """The checks made here give a forecast, not a verdict: step 1 on the twin is skipped (said as such)."""
    token = _RUN_FIRST_STEP.set(False)
    try:
        yield
    finally:
        _RUN_FIRST_STEP.reset(token)


@dataclass
class Plan:
    """The config run_exp gets on the twin, and what was changed to run it here (said in the report)."""

    args: dict[str, Any]
    changed: list[str] = field(default_factory=list)


def first_step(launch: Launch) -> None:
    """Run the stage's workflow to its first optimizer step on a twin; an error where it fails after its
    trainer is built (FIRST_STEP_REFUSED), an info line where it ran, "not checked" where it cannot run."""
    run = launch.run
    if launch.model is None or launch.tokenizer_module is None or launch.template is None:
        return  # the model or tokenizer was not built: the dry run said why
    if not launch.training_args.do_train or run.data_stage is None or run.rows is None:
        return
    if not run.ok:  # the run stops before step 1, on what the dry run said
        if launch.planned:
            run.skip(WHAT, "an earlier step stops the run here")
        return
    reason = _cannot_run(launch) if _RUN_FIRST_STEP.get() else FORECAST_ONLY
    if reason:
        run.skip(WHAT, reason)
        return
    plan = twin_plan(launch)
    # LLaMA-Factory's workflows (their import: ~0.5 s, matplotlib's most of it) once in this process, not in
    # every child: a process that checks many configs (presets list, LlamaBoard, the tests) pays it once
    from llamafactory.train import tuner  # noqa: F401

    start = time.perf_counter()
    result = _forked(lambda: _child(launch, plan), TIMEOUT_S)
    seconds = time.perf_counter() - start
    _said(launch, plan, result, seconds)


def _cannot_run(launch: Launch) -> str | None:
    """Why the twin's step cannot run here, or None."""
    model_args, finetuning_args, training_args = launch.model_args, launch.finetuning_args, launch.training_args
    config = launch.config
    if not hasattr(os, "fork"):
        return "this platform has no fork for the twin's run"
    if launch.run.stage not in STAGES:
        return f"stage {launch.run.stage}'s trainer is not run on a twin"
    if model_args.quantization_bit is not None:
        return f"quantization_bit {model_args.quantization_bit}: the quantized layers need the GPU's kernels"
    if training_args.deepspeed or launch.deepspeed_elsewhere:
        return "DeepSpeed runs on the target's GPUs"
    if training_args.fsdp:
        return "FSDP shards the model over the ranks"
    if model_args.adapter_name_or_path:
        return "adapter_name_or_path: the adapters' weights have the real model's shapes"
    for key in ("use_unsloth", "use_kt", "enable_liger_kernel"):
        if getattr(model_args, key, False):
            return f"{key}: its kernels need the GPU"
    for key in ("use_mca", "use_hyper_parallel"):
        if getattr(finetuning_args, key, False):
            return f"{key}: its trainer needs the GPU"
    if str(os.environ.get("USE_RAY", "")).lower() in ("1", "true", "y", "yes"):
        return "USE_RAY: Ray starts the workers"
    own = model_args.model_name_or_path
    for key in ("ref_model", "reward_model"):
        other = getattr(finetuning_args, key, None)
        if other and other != own and getattr(finetuning_args, "reward_model_type", "full") != "api":
            return f"{key} {other} is another model than model_name_or_path"
        if other and getattr(finetuning_args, f"{key}_adapters", None):
            return f"{key}_adapters: the adapters' weights have the real model's shapes"
    if config.get("resume_from_checkpoint") or launch.run.resume is not None:
        return "the run resumes a checkpoint of the real model (judged by the resume step)"
    return None


def twin_plan(launch: Launch) -> Plan:
    """The user's config with the twin's changes (see the module's docstring); each change the step's
    behaviour could see is listed."""
    args, training_args, data_args = dict(launch.config), launch.training_args, launch.data_args
    tmp = launch.tmp / "first-step"
    plan = Plan(args)
    own = launch.model_args.model_name_or_path
    twin = str(tmp / "twin")
    args["model_name_or_path"] = twin
    for key in ("ref_model", "reward_model"):
        if args.get(key) == own:
            args[key] = twin
    args.update(output_dir=str(tmp / "output"), overwrite_output_dir=True, report_to="none")
    args["cache_dir"] = str(tmp / "cache")
    args.pop("resume_from_checkpoint", None)
    if args.get("logging_dir"):
        args["logging_dir"] = str(tmp / "logs")
    from llamafactory.extras.misc import has_tokenized_data

    if data_args.tokenized_path is not None and not has_tokenized_data(data_args.tokenized_path):
        args["tokenized_path"] = str(tmp / "tokenized")  # it would be saved there: read-only otherwise
    if training_args.push_to_hub and (launch.planned or not user_offline("hub")):
        args["push_to_hub"] = False
        repo = training_args.hub_model_id or Path(str(training_args.output_dir)).name
        plan.changed.append(
            f"push_to_hub off: the run creates the Hub repo {repo} when its trainer is built and pushes to it at "
            "each save; the check writes nothing to the Hub"
        )
    if training_args.max_steps is None or training_args.max_steps <= 0:  # the run's own total: as the trainer counts
        args["max_steps"] = work_of(training_args, launch.train_rows or 1).steps
    vocab = len(launch.tokenizer_module["tokenizer"])
    cutoff = min(data_args.cutoff_len, MAX_TOKENS, max(64, LOGIT_ELEMENTS // max(vocab, 1)))
    if cutoff < data_args.cutoff_len:
        args["cutoff_len"] = cutoff
        plan.changed.append(f"cutoff_len {cutoff}")
    fits = max(1, MAX_TOKENS // cutoff)
    for key, value in (("per_device_train_batch_size", training_args.per_device_train_batch_size),
                       ("per_device_eval_batch_size", training_args.per_device_eval_batch_size),
                       ("gradient_accumulation_steps", training_args.gradient_accumulation_steps)):  # fmt: skip
        cap = MAX_ACCUMULATION if key == "gradient_accumulation_steps" else fits
        if isinstance(value, int) and value > cap:
            args[key] = cap
            plan.changed.append(f"{key} {cap}")
    if not data_args.streaming:
        rows = launch.rows_cap if data_args.max_samples is None else min(data_args.max_samples, launch.rows_cap)
        val = data_args.val_size or 0
        args["max_samples"] = max(rows, int(val) + 8) if val >= 1 else rows  # a split of val_size rows needs them
    args["preprocessing_num_workers"] = None  # a pool costs more than a few hundred rows
    # the run's dataloader workers, started for one step: a few tell a worker's failure; 2**62 would fork on
    workers = training_args.dataloader_num_workers
    if isinstance(workers, int) and workers > MAX_WORKERS:
        args["dataloader_num_workers"] = MAX_WORKERS
        plan.changed.append(f"dataloader_num_workers {MAX_WORKERS}")
    if getattr(training_args, "predict_with_generate", False):
        args["max_new_tokens"] = GENERATED_TOKENS
    if str(getattr(launch.model_args.flash_attn, "value", launch.model_args.flash_attn)) in ("fa2", "fa3"):
        args["flash_attn"] = "sdpa"
        plan.changed.append("flash_attn sdpa (FlashAttention is the GPU's)")
    if args.get("torch_compile"):
        args["torch_compile"] = False
        plan.changed.append("torch_compile off")
    optim = str(getattr(training_args.optim, "value", training_args.optim))
    if any(part in optim for part in ("8bit", "4bit", "bnb", "paged", "apex")):
        args["optim"] = "adamw_torch"
        plan.changed.append(f"optim adamw_torch for {optim} (a GPU optimizer)")
    if not _trains_on_this_cpu(launch):
        args["use_cpu"] = True
        if args.get("fp16") or args.get("pure_bf16"):
            args.update(fp16=False, pure_bf16=False, bf16=True)
            plan.changed.append("bf16 for fp16 (the device's precision is the parser's)")
    return plan


def _trains_on_this_cpu(launch: Launch) -> bool:
    """Whether the run trains on this machine's CPU (no GPU here, not planned for another machine)."""
    if launch.planned:
        return False
    import torch

    return not torch.cuda.is_available()


# --- the forked child ------------------------------------------------------------------------------------


class _StepDone(Exception):
    """Raised after the trainer's train() returned: the workflow goes no further than step 1's end."""


def _child(launch: Launch, plan: Plan) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)  # GNU OpenMP's thread pool does not survive a fork
    patches = Patches()  # never undone: the child exits
    _one_process(patches)
    facts: dict[str, Any] = {"phase": PHASES[0]}
    from .twin import TwinUnavailable, base_model_class, build_twin

    folder = Path(plan.args["model_name_or_path"])
    try:
        shape = build_twin(
            launch.model_args, base_model_class(launch.model), launch.tokenizer_module["tokenizer"], folder
        )
    except TwinUnavailable as exc:
        return {"unavailable": str(exc)}
    except Exception as exc:  # a shape the shrink does not know: not a verdict on the config
        return {"unavailable": f"the twin could not be built: {type(exc).__name__}: {one_line(exc)}"}
    facts["twin"] = shape.describe()
    _watch(patches, facts)
    import inspect

    from llamafactory.train import tuner

    run_exp = inspect.unwrap(tuner.run_exp)  # LLaMA-Factory's own: the start-up hook's check is this one
    try:
        run_exp(args=plan.args, callbacks=[_stopper(facts)])
    except _StepDone:
        return {"ok": True, **facts}
    except SystemExit as exc:
        if exc.code in (0, None):
            return {"unavailable": "the workflow ended before training (exit 0)", **facts}
        return {**_failure(exc), **facts}
    except BaseException as exc:
        return {**_failure(exc), **facts}
    return {"unavailable": "the workflow returned without training", **facts}


def _one_process(patches: Patches) -> None:
    """The twin runs as one process on the CPU: a rank's fake process group and torchrun's variables (the
    rank view, check/rank.py) are left behind, and no GPU is seen."""
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    for name in DISTRIBUTED_ENV:
        patches.delenv(name)
    try:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
    except ImportError:
        pass
    patches.setenv("CUDA_VISIBLE_DEVICES", "")
    patches.setenv("HIP_VISIBLE_DEVICES", "")
    patches.setenv("TOKENIZERS_PARALLELISM", "false")
    patches.setattr(torch.cuda, "is_available", lambda: False)
    patches.setattr(torch.cuda, "device_count", lambda: 0)


def _watch(patches: Patches, facts: dict[str, Any]) -> None:
    """The phase the workflow is in, from the trainer's own entry points: its set-up and train()."""
    from transformers import Trainer

    init, train = Trainer.__init__, Trainer.train

    def built(self: Any, *args: Any, **kwargs: Any) -> None:
        facts["phase"] = PHASES[1]
        init(self, *args, **kwargs)
        model = getattr(self, "model", None)
        if model is not None:
            facts["trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)

    def trained(self: Any, *args: Any, **kwargs: Any) -> Any:
        facts["phase"] = PHASES[2]
        train(self, *args, **kwargs)
        raise _StepDone

    patches.setattr(Trainer, "__init__", built)
    patches.setattr(Trainer, "train", trained)


def _stopper(facts: dict[str, Any]) -> Any:
    """A callback that stops the training after its first optimizer step, with that step's own logging,
    evaluation and save (the trainer runs those after on_step_end)."""
    from transformers import TrainerCallback

    class FirstStep(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            facts["phase"] = PHASES[3]

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            facts["phase"] = PHASES[4]
            facts["step"] = state.global_step
            facts["max_steps"] = state.max_steps
            control.should_training_stop = True
            return control

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "loss" in logs:
                facts["loss"] = float(logs["loss"])

    return FirstStep()


def _failure(exc: BaseException) -> dict[str, Any]:
    """The exception's type, words and where the library raised it (its innermost frame in a package)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    for frame in reversed(frames):
        path = frame.filename.replace(os.sep, "/")
        if "/site-packages/" in path or "/dist-packages/" in path:
            where = f"{path.split('-packages/', 1)[1]} {frame.name}"
            break
    words = one_line(exc) if not isinstance(exc, SystemExit) else f"exit {exc.code}"
    return {"ok": False, "type": type(exc).__name__, "words": words, "where": where}


def _forked(work: Any, timeout: float) -> dict[str, Any]:
    """``work()`` in a forked child, its dict answer read back as JSON; its output is discarded."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 0
        # what the parent holds is never freed here: gc's full collections (accelerate's free_memory at train
        # start makes one: ~0.4 s over a checking process's heap) skip it
        gc.freeze()
        try:
            os.close(read)
            log = os.environ.get("LLAMAFACTORY_ROCM_STEP_LOG")  # the child's output, for debugging the step
            null = os.open(log or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(null, 1)
            os.dup2(null, 2)
            if log:
                import faulthandler

                faulthandler.dump_traceback_later(timeout / 4, repeat=True)
            try:
                answer = work()
            except BaseException as exc:  # a bug of ours in the child: said by the parent as not checked
                answer = {"unavailable": f"the twin's run failed: {type(exc).__name__}: {one_line(exc)}"}
            with os.fdopen(write, "w") as out:
                out.write(json.dumps(answer, default=str))
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(write)
    chunks, deadline = [], time.monotonic() + timeout
    with os.fdopen(read, "rb") as pipe:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([pipe], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"unavailable": f"the twin's run took over {timeout:.0f} s"}
            chunk = os.read(pipe.fileno(), 65536)
            if not chunk:
                break
            chunks.append(chunk)
    os.waitpid(pid, 0)
    try:
        return json.loads(b"".join(chunks) or b"{}") or {"unavailable": "the twin's run ended without an answer"}
    except ValueError:
        return {"unavailable": "the twin's run ended without an answer"}


# --- the verdict ----------------------------------------------------------------------------------------


def _said(launch: Launch, plan: Plan, result: dict[str, Any], seconds: float) -> None:
    run, stage = launch.run, launch.run.stage
    twin = result.get("twin", "")
    if "unavailable" in result:
        run.skip(WHAT, result["unavailable"])
        return
    phase = result.get("phase", PHASES[0])
    changed = f"; changed to run here: {', '.join(plan.changed)}" if plan.changed else ""
    if result.get("ok"):
        loss = f", loss {result['loss']:.3g}" if "loss" in result else ""
        run.findings.append(
            Finding(
                code="FIRST_STEP_RAN",
                message=f"LLaMA-Factory's {stage} workflow ran to its first optimizer step (step "
                f"{result.get('step', 1)} of {result.get('max_steps', '?')}{loss}) on a shrunk twin of the model "
                f"({twin}), random weights, on the CPU, in {seconds:.1f} s{changed}. Kernels, memory and the "
                "device's own errors are the meta build's and the rules'.",
            )
        )
        return
    words = f"{result.get('type', 'Error')}: {result.get('words', '')}"
    if PHASES.index(phase) < 1:  # the twin's own load: the meta build judged the real one
        run.skip(WHAT, f"the twin's {stage} workflow stopped before its trainer: {words}")
        return
    finetuning = str(getattr(launch.finetuning_args, "finetuning_type", ""))
    facts = f" ({finetuning} fine-tuning, {result['trainable']} trainable parameters)" if "trainable" in result else ""
    given = {"model_name_or_path": launch.model_args.model_name_or_path}
    where = f" [{result['where']}]" if result.get("where") else ""
    cause = cause_of("FIRST_STEP_REFUSED", words + where + facts, launch.config, given=given)
    where = f" ({result['where']})" if result.get("where") else ""
    run.refused(
        code="FIRST_STEP_REFUSED",
        message=f"LLaMA-Factory's {stage} workflow, run to its first optimizer step on a shrunk twin of the model "
        f"({twin}, on the CPU{changed}), stopped {STOPPED[PHASES.index(phase)]}{where}: {words}",
        cause=cause,
    )
