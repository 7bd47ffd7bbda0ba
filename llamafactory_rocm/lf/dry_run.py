"""LLaMA-Factory's own launch, run dry: every step up to the first training step, with no weights and no GPU.

After ``get_train_args`` (lf/verdict.py), LLaMA-Factory 0.9.5's workflows (``train/sft/workflow.py``
``run_sft`` and its siblings) go on with ``load_tokenizer``, ``get_template_and_fix_tokenizer``,
``get_dataset(..., stage=<the workflow's data stage>)``, ``load_model`` (config, model, ``init_adapter``),
then transformers' ``Trainer`` (optimizer, scheduler, reporting callbacks, dataloader, resume). Each of
these refuses configs ``get_train_args`` accepts. Here they run as LLaMA-Factory runs them, with these
differences, each chosen so that nothing heavy is loaded and nothing is written where the user looks:

- The Hub is offline for the call (``huggingface_hub.constants.HF_HUB_OFFLINE``): a model or tokenizer
  that is neither a folder nor in the Hugging Face cache is "not checked", never downloaded.
- The data pipeline reads at most ``rows_cap`` rows per dataset (LLaMA-Factory's own ``max_samples``),
  with its caches, and any ``tokenized_path`` it would save, in a temporary folder. The split
  (``val_size``) and the mix (``interleave_probs``) are computed on the full row counts by LLaMA-Factory's
  own ``merge_dataset``/``split_dataset`` (datasets' ``interleave_datasets``/``train_test_split``) over
  index-only datasets of those sizes (docs/llamafactory-launch.md#d4).
- The model is LLaMA-Factory's ``load_model`` itself, with its weight-loading call swapped for
  ``from_config`` (its own ``train_from_scratch`` branch) under torch's meta default device: the
  config is patched, the model patched, and ``init_adapter`` run on meta tensors, so module-name errors
  are LLaMA-Factory's or peft's own words (docs/llamafactory-launch.md#d5). Not run: quantization
  (the meta model is not quantized), the reference and reward models of dpo/kto/ppo.
- The trainer is not built (it needs weights); the parts of its set-up that need none are called:
  ``Trainer.get_optimizer_cls_and_kwargs`` and the optimizer class on a stand-in parameter,
  ``get_scheduler``, ``get_reporting_integration_callbacks`` (instantiated, as the trainer does), and
  torch's ``DataLoader`` batch arguments (docs/llamafactory-launch.md#d7).
- The checkpoint LLaMA-Factory resumes from (``training_args.resume_from_checkpoint`` as
  ``get_train_args`` set it) is checked against the meta model's adapter by tensor shapes only
  (safetensors metadata), and by the files transformers' or DeepSpeed's loader needs
  (docs/llamafactory-launch.md#d6).

This machine's packages are what is checked (an optimizer's or a reporter's optional package).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..findings import Level
from ..memory import count_model, optimizer_state_bytes
from .dry_parts import DryRun, Resume, _hub_offline, _meta_limitation, _words, reachable
from .stages import NoWorkflow, UnknownStage, adds_valuehead, data_stage, trainer_requirements
from .text_only import text_only_llamafactory
from .verdict import _quiet, _restored_environ

TRAINER_STATE_NAME = "trainer_state.json"  # transformers/trainer.py: TRAINER_STATE_NAME (pinned by a test)
FSDP_MODEL_NAME = "pytorch_model_fsdp"  # transformers/trainer.py: FSDP_MODEL_NAME (pinned by a test)
DEEPSPEED_LATEST = "latest"  # DeepSpeedEngine.load_checkpoint(tag=None) reads the tag from this file


def dry_launch(config: Mapping[str, Any], *, rows_cap: int = 256, deepspeed_elsewhere: bool = False) -> DryRun:
    """Run LLaMA-Factory's launch on ``config`` (a dict as ``run_exp(args=...)`` receives it), dry.
    ``deepspeed_elsewhere``: the run is a DeepSpeed one on the target, though its ``deepspeed:`` key was left
    out here (planning: DeepSpeed and torchrun are the target's); a checkpoint is then judged as DeepSpeed
    resumes it."""
    run = DryRun()
    with text_only_llamafactory():
        import llamafactory.data
        import llamafactory.model  # noqa: F401
        from llamafactory.hparams import get_train_args
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lfrocm-dry-")))
        stack.enter_context(_restored_environ())  # get_train_args sets environment variables
        stack.enter_context(_quiet())
        stack.enter_context(_hub_offline())
        stack.enter_context(_no_progress_bars())
        # LLaMA-Factory prints a training example (loader.py _get_preprocessed_dataset, print_data_example)
        stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        start = time.perf_counter()
        try:
            args = get_train_args(dict(config))
        except (Exception, SystemExit) as exc:
            run.timings["parse"] = time.perf_counter() - start
            run.skip("LLaMA-Factory's launch after get_train_args", f"get_train_args refused the config: {_words(exc)}")
            return run
        run.timings["parse"] = time.perf_counter() - start
        launch = _Launch(run, tmp, rows_cap, *args[:4])
        launch.deepspeed_elsewhere = deepspeed_elsewhere
        try:
            launch.go()
        except (TypeError, AttributeError) as exc:
            if not _stopped_by_unconverted_values(run, config, launch.step, exc):
                raise  # no value of another type to blame: a bug of ours, said as one (exit 4)
    return run


def _stopped_by_unconverted_values(run: DryRun, config: Mapping[str, Any], step: str, exc: Exception) -> bool:
    """A launch step stopped with a type error while the config hands a string field another type
    (``cache_dir: true``: huggingface_hub's ``Path(cache_dir)``; ``optim_args: 7``: transformers'
    ``_parse_optim_args``); stock LLaMA-Factory stops there with the same traceback. Said as an error naming
    those keys; False where the config has none (then the error is not the config's)."""
    from .schema import load_schema

    suspects = load_schema().unconverted_values(config)
    if not suspects:
        return False
    named = ", ".join(f"{s.key}: {s.value!r} (type {type(s.value).__name__})" for s in suspects[:3])
    run.error(
        code="VALUE_TYPE_STOPS_LAUNCH",
        message=f"{named} where LLaMA-Factory's field takes a string; its parser hands YAML values on "
        f"unconverted, and the launch stops at its {step} step with {type(exc).__name__}: {_words(exc)}",
        fix_with={"key": suspects[0].key},
        key=suspects[0].key,
    )
    return True


class _Launch:
    deepspeed_elsewhere = False  # see dry_launch

    def __init__(self, run: DryRun, tmp: Path, rows_cap: int, model_args, data_args, training_args, finetuning_args):
        self.run, self.tmp, self.rows_cap = run, tmp, rows_cap
        self.model_args, self.data_args = model_args, data_args
        self.training_args, self.finetuning_args = training_args, finetuning_args
        self.tokenizer_module: dict[str, Any] | None = None
        self.template = None
        self.model = None
        self.train_rows: int | None = None
        self.user_max_samples: int | None = None
        self.tokenized_max_id: int | None = None
        self.tokenized_vocab = 0
        self.step = "workflow"  # the launch step running now, for a type error's message

    def timed(self, name: str, step: Callable[[], None]) -> None:
        self.step = name
        start = time.perf_counter()
        try:
            step()
        finally:
            self.run.timings[name] = time.perf_counter() - start

    def go(self) -> None:
        run = self.run
        run.stage = self.finetuning_args.stage
        try:
            run.data_stage = data_stage(run.stage)
        except NoWorkflow:
            run.error(
                code="STAGE_UNKNOWN",
                message=f"LLaMA-Factory has no workflow for stage {run.stage!r}: run_exp stops with "
                f'"Unknown task: {run.stage}." (train/tuner.py)',
                key="stage",
            )
            return
        except UnknownStage as exc:
            run.skip("the data pipeline", str(exc))
        self.check_stage_requirements()
        self.timed("output_dir", self.check_output_dir)
        self.step = "model lookup"
        reachable = self.reachable()
        if reachable:
            self.timed("tokenizer", self.tokenizer_and_template)
        if self.template is not None and run.data_stage is not None:
            self.timed("data", self.data)
        if reachable:
            self.timed("model", self.build_model)
        if reachable and self.tokenizer_module is not None:  # dpo/kto's reference, ppo's reward model
            self.timed("workflow models", self.workflow_models)
        self.timed("resume", self.check_resume)
        self.timed("trainer", self.trainer_setup)

    # -- the stage's trainer pins ------------------------------------------------------------------
    def check_stage_requirements(self) -> None:
        """The versions the stage's trainer requires when it is built (ppo: trl), with transformers' own
        ``require_version``, the call the trainer makes (lf/stages.py reads the requirement from it)."""
        from transformers.utils.versions import require_version

        stage = self.run.stage
        for requirement in trainer_requirements(stage):
            try:
                require_version(requirement)
            except ImportError as exc:
                self.run.error(
                    code="STAGE_PACKAGE_VERSION",
                    message=f"LLaMA-Factory's {stage} trainer requires {requirement} (train/{stage}/trainer.py "
                    f"require_version), checked when it is built after the model is loaded: {_words(exc)}",
                    fix_with={"requirement": requirement},
                    key="stage",
                )

    # -- output_dir -------------------------------------------------------------------------------
    def check_output_dir(self) -> None:
        out = self.training_args.output_dir
        # transformers' Trainer.save_model/_save: os.makedirs(output_dir, exist_ok=True) raises
        # FileExistsError on a file, at the first save (after the first save_steps of training).
        if out and os.path.exists(out) and not os.path.isdir(out):
            self.run.error(
                code="OUTPUT_DIR_NOT_A_FOLDER",
                message=f"output_dir {out} is a file: the trainer's first save "
                "(os.makedirs(output_dir, exist_ok=True)) "
                "raises FileExistsError after the first save_steps.",
                key="output_dir",
            )

    # -- 2. reachability --------------------------------------------------------------------------
    def reachable(self) -> bool:
        """config.json local or in the Hugging Face cache (lf/dry_parts.py ``reachable``)."""
        return reachable(self.run, self.model_args)

    # -- 3. tokenizer and template ----------------------------------------------------------------
    def tokenizer_and_template(self) -> None:
        from llamafactory.data import get_template_and_fix_tokenizer
        from llamafactory.model import load_tokenizer

        try:
            self.tokenizer_module = load_tokenizer(self.model_args)
        except Exception as exc:
            self.run.error(
                code="TOKENIZER_REFUSED",
                message=f"LLaMA-Factory's load_tokenizer failed: {_words(exc)}",
                key="model_name_or_path",
            )
            return
        try:
            self.template = get_template_and_fix_tokenizer(self.tokenizer_module["tokenizer"], self.data_args)
        except Exception as exc:
            key = "train_on_prompt" if "train_on_prompt" in str(exc) else "template"
            self.run.error(
                code="TEMPLATE_REFUSED",
                message=f"LLaMA-Factory's get_template_and_fix_tokenizer refused: {_words(exc)}",
                key=key,
            )

    # -- 4. data ----------------------------------------------------------------------------------
    def data(self) -> None:
        from llamafactory.data import get_dataset
        from llamafactory.extras.misc import has_tokenized_data

        data_args, model_args = self.data_args, self.model_args
        user_tokenized = data_args.tokenized_path
        if user_tokenized is not None and has_tokenized_data(user_tokenized):
            self.tokenized_data(user_tokenized)
            return
        remote = self.remote_datasets()
        if remote:
            self.run.skip("the data pipeline", f"{', '.join(remote)} is not a local file; the dry run reads none")
            return
        split = _SplitSpy(self, data_args.streaming)
        saved = {
            "max_samples": data_args.max_samples,
            "tokenized_path": data_args.tokenized_path,
            "overwrite_cache": data_args.overwrite_cache,
            "preprocessing_num_workers": data_args.preprocessing_num_workers,
            "val_size": data_args.val_size,  # the full-size split may set the capped run's share
            "cache_dir": model_args.cache_dir,
        }
        self.user_max_samples = data_args.max_samples
        if not data_args.streaming:  # LLaMA-Factory refuses max_samples with streaming (data_args.py)
            data_args.max_samples = _RecordingCap(min(data_args.max_samples or self.rows_cap, self.rows_cap), split)
        if data_args.tokenized_path is not None:  # LLaMA-Factory would save there: save into tmp instead
            data_args.tokenized_path = str(self.tmp / "tokenized")
        data_args.overwrite_cache = True
        data_args.preprocessing_num_workers = None  # a pool of workers costs more than a few hundred rows
        model_args.cache_dir = str(self.tmp / "datasets-cache")
        try:
            with split.installed():
                module = get_dataset(
                    self.template,
                    model_args,
                    data_args,
                    self.training_args,
                    stage=self.run.data_stage,
                    **self.tokenizer_module,
                )
        except Exception as exc:
            if split.error is None:  # the full-size split refused already, with datasets' words
                self.run.error(
                    code="DATA_PIPELINE_REFUSED",
                    message=f"LLaMA-Factory's data pipeline (get_dataset, stage={self.run.data_stage!r} for "
                    f"stage {self.run.stage!r}) refused: {_words(exc)}",
                    fix_as="pipeline",
                    key="interleave_probs" if "probabilit" in _words(exc) else "dataset",
                )
            return
        finally:
            for name, value in saved.items():
                setattr(model_args if name == "cache_dir" else data_args, name, value)
        self.count_rows(module, split)

    def remote_datasets(self) -> list[str]:
        from llamafactory.data.parser import get_dataset_list

        names = [*(self.data_args.dataset or []), *(self.data_args.eval_dataset or [])]
        try:
            attrs = get_dataset_list(names, self.data_args.dataset_dir)
        except Exception:
            return []  # get_dataset raises it again, in LLaMA-Factory's words
        return [str(attr) for attr in attrs if attr.load_from != "file"]

    def count_rows(self, module: Mapping[str, Any], split: _SplitSpy) -> None:
        if self.data_args.streaming:
            self.run.skip("row counts", "streaming: rows are counted while training")
            return
        train = module.get("train_dataset")
        evals = module.get("eval_dataset")
        rows = {"train": len(train) if train is not None else 0}
        if isinstance(evals, dict):
            rows["eval"] = sum(len(d) for d in evals.values())
        else:
            rows["eval"] = len(evals) if evals is not None else 0
        if split.capped and split.full and split.dry:
            # Rows kept by the processors, scaled from the capped rows to the full split.
            rows = {
                part: round(n * split.full[part] / split.dry[part]) if split.dry.get(part) else 0
                for part, n in rows.items()
            }
            self.run.rows_estimated = True
        self.run.rows = rows
        self.train_rows = rows["train"]

    def tokenized_data(self, path: str) -> None:
        """LLaMA-Factory loads a saved ``tokenized_path`` instead of the data: its ids must fit the model."""
        from datasets import load_from_disk

        tokenizer = self.tokenizer_module["tokenizer"]
        try:
            saved = load_from_disk(path)
        except Exception as exc:
            self.run.error(
                code="DATA_PIPELINE_REFUSED",
                message=f"LLaMA-Factory would load tokenized_path {path}, and datasets' "
                f"load_from_disk refused: {_words(exc)}",
                fix_as="tokenized",
                key="tokenized_path",
            )
            return
        self.tokenized_max_id = _max_token_id(saved)
        self.tokenized_vocab = len(tokenizer)
        if hasattr(saved, "items"):  # a DatasetDict, as get_dataset saves it
            self.run.rows = {"train": len(saved["train"]) if "train" in saved else 0}
            self.run.rows["eval"] = sum(len(d) for name, d in saved.items() if name.startswith("validation"))
        else:
            self.run.rows = {"train": len(saved), "eval": 0}
        self.train_rows = self.run.rows["train"]
        self.run.skip("the dataset's rows", f"LLaMA-Factory loads the tokenized data in {path} instead of the dataset")

    # -- 5. model on the meta device --------------------------------------------------------------
    def build_model(self) -> None:
        from llamafactory.model import load_model

        if self.tokenizer_module is None:
            return
        from .dry_load import meta_load_model

        is_trainable = self.training_args.do_train
        add_valuehead = adds_valuehead(self.run.stage)  # run_rm / run_ppo: load_model(..., add_valuehead=True)
        # lf/dry_load.py meta_load_model: load_model with its from_config branch under torch's meta default
        # device (nn.Parameter(torch.zeros(...)) in MoE experts included: nothing is allocated); the rest of
        # load_model (patch_config, patch_model, init_adapter, the value head) runs as in the real run.
        try:
            self.model = meta_load_model(load_model)(
                self.tokenizer_module["tokenizer"],
                self.model_args,
                self.finetuning_args,
                is_trainable,
                add_valuehead,
            )
        except Exception as exc:
            text = _words(exc)
            if _meta_limitation(exc):  # a step that needs real weights (e.g. PiSSA's SVD): not a verdict
                self.run.skip("the model's adapter set-up", f"it needs real weights: {text}")
                return
            self.run.error(
                code="MODEL_MODULES_REFUSED",
                message=f"LLaMA-Factory's load_model/init_adapter refused (model built on the meta device): {text}",
                fix_as=_module_case(self.finetuning_args.finetuning_type),
                key=_module_key(self.finetuning_args.finetuning_type, text),
            )
        if self.model is not None:
            self.run.built = count_model(self.model)
        if self.model is not None and self.tokenized_max_id is not None:
            self.check_tokenized_ids()

    def workflow_models(self) -> None:
        from .dry_load import workflow_models

        args = (self.run.stage, self.model_args, self.finetuning_args, self.training_args.do_train, self.model)
        workflow_models(self.run, *args)

    def check_tokenized_ids(self) -> None:
        embeddings = _input_embeddings(self.model)
        vocab = embeddings.num_embeddings if embeddings is not None else self.tokenized_vocab
        if self.tokenized_max_id >= vocab:
            # torch.nn.functional.embedding: an index >= num_embeddings raises "IndexError: index out of
            # range in self" on CPU and a device-side assert on a GPU, at the first forward (step 1).
            self.run.error(
                code="TOKENIZED_DATA_MISMATCH",
                message=f"tokenized_path {self.data_args.tokenized_path} holds token id "
                f"{self.tokenized_max_id}, but the "
                f"model's embedding has {vocab} rows (ids 0-{vocab - 1}): a tokenized dataset from another "
                "tokenizer. The first forward fails in the embedding (index out of range).",
                key="tokenized_path",
            )

    # -- 6. resume --------------------------------------------------------------------------------
    def check_resume(self) -> None:
        checkpoint = self.training_args.resume_from_checkpoint
        if not checkpoint or not self.training_args.do_train:
            return
        checkpoint = str(checkpoint)
        deepspeed = bool(self.training_args.deepspeed) or self.deepspeed_elsewhere
        resume = Resume(checkpoint=checkpoint)
        self.run.resume = resume
        if not os.path.isdir(checkpoint) or not checkpoint_loadable(checkpoint, deepspeed=deepspeed):
            needs = (
                "a global_step* folder named by a 'latest' file (DeepSpeed)"
                if deepspeed
                else "model or adapter weights (model.safetensors, adapter_model.safetensors, ...)"
            )
            self.run.error(
                code="CHECKPOINT_NOT_LOADABLE",
                message=f"resume_from_checkpoint {checkpoint} cannot be resumed: the trainer needs "
                f"{TRAINER_STATE_NAME} "
                f"and {needs} there ('Can't find a valid checkpoint at {checkpoint}').",
                key="resume_from_checkpoint",
            )
            return
        state = _read_json(Path(checkpoint) / TRAINER_STATE_NAME)
        resume.global_step = _int_or_none(state.get("global_step"))
        if self.training_args.max_steps and self.training_args.max_steps > 0:
            resume.total_steps = int(self.training_args.max_steps)
        else:
            resume.total_steps = _int_or_none(state.get("max_steps"))
        if resume.total_steps is not None and resume.global_step is not None:
            resume.steps_left = max(resume.total_steps - resume.global_step, 0)
        left = f"{resume.steps_left} of {resume.total_steps} steps left" if resume.steps_left is not None else ""
        self.run.add(
            code="RESUMES_FROM_CHECKPOINT",
            level=Level.INFO,
            message=f"The run resumes from {checkpoint} (global step {resume.global_step})"
            + (f": {left}." if left else "."),
            key="resume_from_checkpoint",
        )
        if not deepspeed:
            self.check_checkpoint_matches(Path(checkpoint))

    def check_checkpoint_matches(self, checkpoint: Path) -> None:
        from transformers.utils import ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME

        has_adapter = any((checkpoint / name).is_file() for name in (ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME))
        peft_run = self.model is not None and _is_peft(self.model)
        ftype = self.finetuning_args.finetuning_type
        if self.model is not None and has_adapter != peft_run:
            what = "an adapter only" if has_adapter else "full model weights, no adapter"
            self.run.error(
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
            self.run.skip("the checkpoint's adapter shapes", f"{checkpoint} has no adapter_model.safetensors")
            return
        from peft import get_peft_model_state_dict

        peft_model = self.model.pretrained_model if hasattr(self.model, "v_head") else self.model
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
            self.run.error(
                code="CHECKPOINT_MISMATCH",
                message=f"{checkpoint} was trained with another adapter (r={config.get('r')}, "
                f"target_modules={config.get('target_modules')}): {'; '.join(parts)}. Resuming dies in "
                "load_state_dict (size mismatch) or in the optimizer's load_state_dict.",
                fix_as="adapter",
                key="lora_rank" if differ else "lora_target",
            )
        base = config.get("base_model_name_or_path")
        if base and not _same_model(base, self.model_args.model_name_or_path):
            self.run.add(
                code="CHECKPOINT_BASE_DIFFERS",
                level=Level.WARNING,
                message=f"{checkpoint}'s adapter was trained on {base}, and this run's model is "
                f"{self.model_args.model_name_or_path}.",
                key="model_name_or_path",
            )

    # -- 7. the trainer's set-up that needs no weights --------------------------------------------
    def trainer_setup(self) -> None:
        import torch
        from transformers import Trainer
        from transformers.integrations import get_reporting_integration_callbacks
        from transformers.optimization import get_scheduler

        args = self.training_args
        try:
            args.get_process_log_level()  # Trainer.__init__ (trainer.py): logging.set_verbosity(...) of it
        except (KeyError, ValueError) as exc:
            # it looks up both: the one refused is the one the KeyError names
            key = "log_level" if exc.args and exc.args[0] == args.log_level else "log_level_replica"
            self.run.error(
                code="TRAINER_SETUP_REFUSED",
                message=f"transformers' Trainer set-up refused {key} {getattr(args, key)!r}: "
                f"TrainingArguments.get_process_log_level raised {type(exc).__name__}: {_words(exc)}",
                fix_with={"key": key},
                key=key,
            )
        model = self.model if self.model is not None else torch.nn.Linear(1, 1, device="meta")
        optimizer = None
        try:
            optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
        except (ImportError, ValueError, TypeError) as exc:
            code = "OPTIMIZER_UNAVAILABLE" if isinstance(exc, ImportError) else "OPTIMIZER_REFUSED"
            self.run.error(
                code=code,
                message="transformers' Trainer.get_optimizer_cls_and_kwargs refused optim "
                f"{args.optim.value}: {_words(exc)}",
                key="optim",
            )
        else:
            if getattr(optimizer_cls, "__module__", "").startswith("torch.optim"):
                # The trainer builds optimizer_cls(params, **optimizer_kwargs); a value of the wrong type
                # (learning_rate: "5e-5" from YAML) fails there. A stand-in parameter needs no weights.
                stand_in = torch.nn.Parameter(torch.zeros(1))
                kwargs = {k: v for k, v in optimizer_kwargs.items() if k != "fused"}  # fused: device-specific
                try:
                    optimizer = optimizer_cls([stand_in], **kwargs)
                    if self.run.built is not None:  # the state it keeps per trainable element, for memory_fit
                        per = optimizer_state_bytes(optimizer_cls, kwargs)
                        self.run.built = dataclasses.replace(
                            self.run.built, optimizer_bytes_per_parameter=per, optimizer=optimizer_cls.__name__
                        )
                except (TypeError, ValueError) as exc:
                    self.run.error(
                        code="OPTIMIZER_REFUSED",
                        message=f"torch's {optimizer_cls.__name__} refused the trainer's arguments "
                        f"{kwargs}: {_words(exc)}",
                        key="learning_rate",
                    )
        if optimizer is not None:
            steps = self.planned_steps()
            try:
                get_scheduler(
                    args.lr_scheduler_type,
                    optimizer=optimizer,
                    num_warmup_steps=args.get_warmup_steps(steps),
                    num_training_steps=steps,
                    scheduler_specific_kwargs=args.lr_scheduler_kwargs,
                )
            except (ImportError, ValueError, TypeError) as exc:
                self.run.error(
                    code="SCHEDULER_REFUSED",
                    message=f"transformers' get_scheduler refused lr_scheduler_type {args.lr_scheduler_type.value}: "
                    f"{_words(exc)}",
                    key="lr_scheduler_kwargs" if args.lr_scheduler_kwargs else "lr_scheduler_type",
                )
        try:
            for callback in get_reporting_integration_callbacks(args.report_to):
                callback()  # trainer_callback.py CallbackHandler.add_callback: callback() for a class
        except (ImportError, RuntimeError, ValueError) as exc:
            self.run.error(
                code="REPORTER_UNAVAILABLE",
                message=f"transformers' reporting callback for report_to {args.report_to} refused: {_words(exc)}",
                key="report_to",
            )
        try:
            # Trainer.get_train_dataloader builds a torch DataLoader with these arguments.
            torch.utils.data.DataLoader(
                range(self.train_rows or 1), batch_size=args.train_batch_size, drop_last=args.dataloader_drop_last
            )
        except (ValueError, TypeError) as exc:
            self.run.error(
                code="BATCH_REFUSED",
                message=f"torch's DataLoader refused the trainer's batch size {args.train_batch_size}: {_words(exc)}",
                key="per_device_train_batch_size",
            )

    def planned_steps(self) -> int:
        args = self.training_args
        if args.max_steps and args.max_steps > 0:
            return int(args.max_steps)
        rows = self.train_rows or 1
        per_step = max(args.train_batch_size, 1) * max(args.gradient_accumulation_steps, 1)
        return max(1, math.ceil(rows / per_step * float(args.num_train_epochs)))


class _RecordingCap(int):
    """LLaMA-Factory's ``max_samples`` for the dry run, noting each dataset's full row count.

    loader.py ``_load_single_dataset``: ``max_samples = min(data_args.max_samples, len(dataset))``
    (pinned by a test). ``min`` compares ``len(dataset) < max_samples``; for an ``int`` subclass on the
    right, Python calls its reflected ``__gt__`` first, which is where the full count is seen.
    """

    def __new__(cls, value: int, spy: _SplitSpy) -> _RecordingCap:
        cap = super().__new__(cls, value)
        cap.spy = spy
        return cap

    def __gt__(self, other: object) -> bool:
        if isinstance(other, int) and not isinstance(other, _RecordingCap):
            self.spy.seen.append(other)
        return int(self) > other


class _SplitSpy:
    """Stands in for loader.py's ``split_dataset``: the full-size split first, then the capped one."""

    def __init__(self, launch: _Launch, streaming: bool) -> None:
        self.launch = launch
        self.streaming = streaming
        self.seen: list[int] = []  # full row counts, one per dataset loaded, in LLaMA-Factory's order
        self.capped = False
        self.full: dict[str, int] = {}
        self.dry: dict[str, int] = {}
        self.error: str | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        import llamafactory.data.loader as loader

        original = loader.split_dataset

        def split_dataset(dataset, eval_dataset, data_args, seed):
            if not self.streaming:
                self.full_split(original, dataset, eval_dataset, data_args, seed)
            try:
                train, evals = original(dataset, eval_dataset, data_args, seed)
            except Exception as exc:
                if self.error is None:
                    self.refused(exc, _length(dataset) + _length(eval_dataset))
                raise
            self.dry = {"train": _length(train.get("train")), "eval": sum(_length(d) for d in evals.values())}
            return train, evals

        loader.split_dataset = split_dataset
        try:
            yield
        finally:
            loader.split_dataset = original

    def refused(self, exc: Exception, rows: int) -> None:
        self.error = _words(exc)
        self.launch.run.error(
            code="DATA_SPLIT_REFUSED",
            message=f"On the full data ({rows} rows), LLaMA-Factory's split_dataset (datasets' train_test_split) "
            f"refused: {self.error}",
            key="val_size",
        )

    def full_split(self, original, dataset, eval_dataset, data_args, seed) -> None:
        """LLaMA-Factory's merge and split on index-only datasets of the full sizes (datasets' own calls)."""
        from llamafactory.data.data_utils import merge_dataset

        from datasets import Dataset

        launch = self.launch
        cap = int(data_args.max_samples)
        n_train = len(data_args.dataset or [])
        if len(self.seen) != n_train + len(data_args.eval_dataset or []):
            launch.run.skip("the split on the full rows", "LLaMA-Factory's max_samples line changed (loader.py)")
            return
        user = launch.user_max_samples
        counts = [min(n, user) if user is not None else n for n in self.seen]
        self.capped = any(n > cap for n in counts)
        if not self.capped:
            return  # the real split below is the full split
        index = [Dataset.from_dict({"i": range(n)}) for n in counts]
        train_parts, eval_parts = index[:n_train], index[n_train:]
        try:
            merged = merge_dataset(train_parts, data_args, seed=seed) if train_parts else None
            merged_eval = None
            if eval_parts:
                if data_args.eval_on_each_dataset:
                    merged_eval = dict(zip(data_args.eval_dataset, eval_parts, strict=True))
                else:
                    merged_eval = merge_dataset(eval_parts, data_args, seed=seed)
            train, evals = original(merged, merged_eval, data_args, seed)
        except Exception as exc:
            self.refused(exc, sum(counts))
            raise
        self.full = {"train": _length(train.get("train")), "eval": sum(_length(d) for d in evals.values())}
        if data_args.val_size > 1e-6 and self.full["train"]:
            # Keep the capped split's share: an integer val_size larger than the capped rows would be a
            # refusal of the dry run's own making.
            data_args.val_size = self.full["eval"] / (self.full["train"] + self.full["eval"])


def _length(dataset: Any) -> int:
    if dataset is None:
        return 0
    try:
        return len(dataset)
    except TypeError:  # an IterableDataset
        return 0


# -- checkpoints ---------------------------------------------------------------------------------
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


# -- helpers -------------------------------------------------------------------------------------
@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    import datasets

    enabled = datasets.utils.logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if enabled:
            datasets.enable_progress_bars()


def _max_token_id(saved: Any) -> int:
    """The largest id in any ``*input_ids`` column of a saved (tokenized) dataset."""
    import pyarrow.compute as pc

    parts = saved.values() if hasattr(saved, "values") else [saved]
    best = -1
    for part in parts:
        table = part.with_format("arrow")[:]
        for name in table.column_names:
            if name.endswith("input_ids"):
                column = pc.list_flatten(table[name])
                if len(column):
                    best = max(best, pc.max(column).as_py())
    return best


def _input_embeddings(model: Any) -> Any:
    try:
        return model.get_input_embeddings()
    except Exception:
        return None


def _is_peft(model: Any) -> bool:
    from peft import PeftModel

    inner = getattr(model, "pretrained_model", model)  # trl's value-head wrapper
    return isinstance(inner, PeftModel)


def _module_key(finetuning_type: str, text: str) -> str:
    if finetuning_type == "freeze":
        return "freeze_extra_modules" if "extra" in text.lower() else "freeze_trainable_modules"
    if finetuning_type == "lora":
        return "additional_target" if "additional" in text.lower() else "lora_target"
    return "finetuning_type"


def _module_case(finetuning_type: str) -> str:
    """MODEL_MODULES_REFUSED's fix for this finetuning_type (its registry entry has one a case)."""
    return finetuning_type if finetuning_type in ("freeze", "lora") else "other"


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
