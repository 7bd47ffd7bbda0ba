"""The training dry run's trainer step (lf/dry_run.py): the parts of transformers' ``Trainer`` set-up that
need no weights, called as the trainer calls them (the trainer itself is not built: it needs weights):
``TrainingArguments.get_process_log_level``, ``Trainer.get_optimizer_cls_and_kwargs`` and the optimizer class
on a stand-in parameter, the scheduler as LLaMA-Factory's trainers create it (its ``create_custom_scheduler``,
then transformers' ``get_scheduler``), ``get_reporting_integration_callbacks`` (instantiated, as the
trainer does), and torch's ``DataLoader`` batch arguments (docs/llamafactory-launch.md#d7). This machine's
packages are what is checked (an optimizer's or a reporter's optional package).
"""

from __future__ import annotations

import dataclasses

from ..errors import one_line
from .causes import cause_of
from .dry_parts import Launch
from .memory import optimizer_state_bytes
from .patching import Patches
from .work import work_of


def trainer_setup(launch: Launch) -> None:
    import torch
    from llamafactory.train.trainer_utils import create_custom_scheduler
    from transformers import Trainer
    from transformers.integrations import get_reporting_integration_callbacks
    from transformers.optimization import get_scheduler

    args = launch.training_args
    try:
        args.get_process_log_level()  # Trainer.__init__ (trainer.py): logging.set_verbosity(...) of it
    except (KeyError, ValueError) as exc:
        # it looks up both: the one refused is the one the KeyError names
        key = "log_level" if exc.args and exc.args[0] == args.log_level else "log_level_replica"
        launch.run.error(
            code="TRAINER_SETUP_REFUSED",
            message=f"transformers' Trainer set-up refused {key} {getattr(args, key)!r}: "
            f"TrainingArguments.get_process_log_level raised {type(exc).__name__}: {one_line(exc)}",
            fix_with={"key": key},
            key=key,
            remedy={key: None},
        )
    model = launch.model if launch.model is not None else torch.nn.Linear(1, 1, device="meta")
    optimizer = None
    try:
        optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    except (ImportError, ValueError, TypeError) as exc:
        code = "OPTIMIZER_UNAVAILABLE" if isinstance(exc, ImportError) else "OPTIMIZER_REFUSED"
        # the words choose the key: a malformed optim_args ("eps:1e-8": transformers' _parse_optim_args) is
        # optim_args's, not optim's (lf/causes.json OPTIMIZER_REFUSED "optim_args")
        cause = None if code == "OPTIMIZER_UNAVAILABLE" else cause_of(code, one_line(exc), launch.config)
        fix: dict = {"key": "optim", "remedy": {"optim": "adamw_torch"}}  # torch's own AdamW: no optional package
        if cause is not None and cause.case == "optim_args":
            fix = {"key": cause.key, "remedy": cause.remedy, "fix_as": cause.case, "fix_with": cause.values}
        elif code == "OPTIMIZER_REFUSED":
            fix["fix_as"] = "optim"
        launch.run.error(
            code=code,
            message="transformers' Trainer.get_optimizer_cls_and_kwargs refused optim "
            f"{args.optim.value}: {one_line(exc)}",
            **fix,
        )
    else:
        if getattr(optimizer_cls, "__module__", "").startswith("torch.optim"):
            # The trainer builds optimizer_cls(params, **optimizer_kwargs); a value of the wrong type
            # (learning_rate: "5e-5" from YAML) fails there. A stand-in parameter needs no weights.
            stand_in = torch.nn.Parameter(torch.zeros(1))
            kwargs = {k: v for k, v in optimizer_kwargs.items() if k != "fused"}  # fused: device-specific
            try:
                optimizer = optimizer_cls([stand_in], **kwargs)
                if launch.run.built is not None:  # the state it keeps per trainable element, for memory_fit
                    per = optimizer_state_bytes(optimizer_cls, kwargs)
                    launch.run.built = dataclasses.replace(
                        launch.run.built, optimizer_bytes_per_parameter=per, optimizer=optimizer_cls.__name__
                    )
            except (TypeError, ValueError) as exc:
                cause = cause_of("OPTIMIZER_REFUSED", one_line(exc), launch.config)
                launch.run.refused(
                    code="OPTIMIZER_REFUSED",
                    message=f"torch's {optimizer_cls.__name__} refused the trainer's arguments {kwargs}: "
                    f"{one_line(exc)}",
                    cause=cause,
                )
    if optimizer is not None:
        steps = work_of(launch.training_args, launch.train_rows or 1).steps  # as the trainer counts them
        try:
            with Patches() as patches:
                # LLaMA-Factory's trainers' create_scheduler: its create_custom_scheduler fills in what
                # transformers' get_scheduler needs (warmup_stable_decay's num_stable_steps and num_decay_steps)
                # into lr_scheduler_kwargs, then transformers' create_scheduler calls get_scheduler
                patches.setattr(args, "lr_scheduler_kwargs", dict(args.lr_scheduler_kwargs or {}))
                create_custom_scheduler(args, steps, optimizer)
                get_scheduler(
                    args.lr_scheduler_type,
                    optimizer=optimizer,
                    num_warmup_steps=args.get_warmup_steps(steps),
                    num_training_steps=steps,
                    scheduler_specific_kwargs=args.lr_scheduler_kwargs,
                )
        except (ImportError, ValueError, TypeError, OverflowError) as exc:  # OverflowError: warmup_steps: .inf
            # the words choose the fix: a min_lr that plain cosine does not take is cosine_with_min_lr's
            launch.run.refused(
                code="SCHEDULER_REFUSED",
                message=f"transformers' get_scheduler refused lr_scheduler_type {args.lr_scheduler_type.value}: "
                f"{one_line(exc)}",
                cause=cause_of("SCHEDULER_REFUSED", one_line(exc), launch.config),
                key="lr_scheduler_kwargs" if args.lr_scheduler_kwargs else "lr_scheduler_type",
            )
    try:
        for callback in get_reporting_integration_callbacks(args.report_to):
            callback()  # trainer_callback.py CallbackHandler.add_callback: callback() for a class
    except (ImportError, RuntimeError, ValueError) as exc:
        launch.run.error(
            code="REPORTER_UNAVAILABLE",
            message=f"transformers' reporting callback for report_to {args.report_to} refused: {one_line(exc)}",
            key="report_to",
            remedy={"report_to": "none"},
        )
    _check_fsdp(launch)
    _check_dataloaders(launch)
    _check_best_metric(launch)


def _check_fsdp(launch: Launch) -> None:
    """The FSDP part of ``Trainer.__init__``: ``create_accelerator_and_postprocess`` builds accelerate's
    ``FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)`` (called here as it calls it), then the trainer
    refuses FSDP outside a distributed world. The world is the rank's view check takes (check/rank.py):
    ``parallel_mode`` is DISTRIBUTED where the launcher starts torchrun."""
    from transformers.training_args import ParallelMode

    args = launch.training_args
    if not args.fsdp:
        return
    if args.fsdp_plugin_args is not None:
        from accelerate.utils import FullyShardedDataParallelPlugin

        try:
            FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
        except (RuntimeError, ValueError, TypeError, ImportError) as exc:
            launch.run.error(
                code="FSDP_REFUSED",
                message=f"accelerate's FullyShardedDataParallelPlugin, built by the trainer for fsdp "
                f"{' '.join(str(o.value) for o in args.fsdp)}, refused: {one_line(exc)}",
                fix_as="plugin",
                key="fsdp",
                remedy={"fsdp": ""},  # TrainingArguments reads "" as no FSDP option
            )
            return
    # transformers/trainer.py Trainer.__init__: "Using fsdp only works in distributed training." (pinned by
    # tests/test_dry_run.py against the real Trainer)
    if not args.fsdp_config["xla"] and args.parallel_mode != ParallelMode.DISTRIBUTED:
        launch.run.error(
            code="FSDP_REFUSED",
            message="transformers' Trainer refuses fsdp in a single process (parallel_mode "
            f"{args.parallel_mode.value}): 'Using fsdp only works in distributed training.'",
            fix_as="world",
            key="fsdp",
            remedy={"fsdp": ""},
        )


def _evaluates(launch: Launch) -> bool:
    """Whether the trainer builds an eval dataloader: an eval set, evaluated during training (eval_strategy)
    or after it (do_eval, the workflow's trainer.evaluate())."""
    args, data_args, rows = launch.training_args, launch.data_args, launch.run.rows
    if str(getattr(args.eval_strategy, "value", args.eval_strategy)) == "no" and not args.do_eval:
        return False
    if rows is not None:
        return rows.get("eval", 0) > 0
    return bool(data_args.eval_dataset) or bool(data_args.val_size and data_args.val_size > 1e-6)


def _check_dataloaders(launch: Launch) -> None:
    """torch's ``DataLoader`` built with the arguments ``Trainer._get_dataloader`` gives it (trainer.py), for the
    train set (``get_train_dataloader``: the train batch size, a sampler) and, where evaluated, the eval set
    (``get_eval_dataloader``: the eval batch size). The dataset stands in by its row count."""
    args = launch.training_args
    parts = [("train", args.train_batch_size, "per_device_train_batch_size")]
    if _evaluates(launch):
        parts.append(("eval", args.eval_batch_size, "per_device_eval_batch_size"))
    for part, batch_size, batch_key in parts:
        rows = (launch.run.rows or {}).get(part) or 1
        params = {
            "batch_size": batch_size,
            "num_workers": args.dataloader_num_workers,
            "pin_memory": args.dataloader_pin_memory,
            "persistent_workers": args.dataloader_persistent_workers,
            "drop_last": args.dataloader_drop_last,
            "prefetch_factor": args.dataloader_prefetch_factor,
        }
        refusal = _dataloader_refusal(rows, part, params)
        if refusal is None:
            continue
        # The key torch refuses: the one whose working value alone makes torch accept the rest.
        workable = {"batch_size": 1, "num_workers": 0, "persistent_workers": False, "prefetch_factor": None}
        culprit = next(
            (
                name
                for name, value in workable.items()
                if _dataloader_refusal(rows, part, {**params, name: value}) is None
            ),
            "num_workers",
        )
        if culprit == "batch_size":
            launch.run.error(
                code="BATCH_REFUSED",
                message=f"torch's DataLoader refused the trainer's {part} batch size {batch_size} "
                f"({batch_key}): {refusal}",
                fix_with={"key": batch_key},
                key=batch_key,
                remedy={batch_key: 1},
            )
        else:
            key = f"dataloader_{culprit}"
            launch.run.error(
                code="DATALOADER_REFUSED",
                message=f"torch's DataLoader, built as the trainer builds its {part} dataloader, refused "
                f"{key} {params[culprit]!r}: {refusal}",
                fix_with={"key": key, "value": "null" if workable[culprit] is None else str(workable[culprit]).lower()},
                key=key,
                remedy={key: workable[culprit]},
            )
        return  # one refusal: the same arguments refuse the other dataloader too


def _dataloader_refusal(rows: int, part: str, params: dict) -> str | None:
    from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

    data = range(rows)
    sampler = RandomSampler(data) if part == "train" else SequentialSampler(data)  # Trainer._get_*_sampler
    try:
        DataLoader(data, sampler=sampler, **params)
    except (ValueError, TypeError) as exc:
        return one_line(exc)
    return None


def _check_best_metric(launch: Launch) -> None:
    """``metric_for_best_model`` against the metrics the evaluation reports: transformers' Trainer looks up
    ``eval_<name>`` after each evaluation during training (``_determine_best_metric``), a KeyError when the
    evaluation does not report it."""
    args = launch.training_args
    name = args.metric_for_best_model
    if not name or str(getattr(args.eval_strategy, "value", args.eval_strategy)) == "no" or not _evaluates(launch):
        return
    reported = reported_metrics(launch)
    if reported is None:
        launch.run.skip(
            f"metric_for_best_model {name}", f"the metrics stage {launch.run.stage}'s evaluation reports are not known"
        )
        return
    wanted = name if name.startswith("eval_") else f"eval_{name}"  # trainer.py _determine_best_metric
    if wanted not in reported:
        names = sorted(m.removeprefix("eval_") for m in reported if m.startswith("eval_"))
        launch.run.error(
            code="METRIC_NOT_REPORTED",
            message=f"metric_for_best_model {name}: the {launch.run.stage} evaluation reports "
            f"{', '.join(sorted(reported))}, not {wanted}; the trainer raises KeyError at the first evaluation",
            fix_with={"names": ", ".join(names)},
            key="metric_for_best_model",
            remedy={"metric_for_best_model": "loss"},
        )


def reported_metrics(launch: Launch) -> set[str] | None:
    """The metric names the stage's evaluation reports during training: transformers' evaluation loop
    (``eval_loss``, ``speed_metrics``, and ``epoch`` added as it logs them), and the ``compute_metrics`` LLaMA-Factory's
    workflow hands its trainer (train/sft/workflow.py: ComputeSimilarity with predict_with_generate, else
    ComputeAccuracy with compute_accuracy; train/rm/workflow.py: ComputeAccuracy; pt: none), read from the
    metric object's own ``score_dict``. None for the stages whose trainers add their own (dpo, kto, ppo)."""
    from transformers.trainer_utils import speed_metrics

    stage = launch.run.stage
    metric = None
    if stage == "sft":
        from llamafactory.train.sft.metric import ComputeAccuracy, ComputeSimilarity

        if launch.training_args.predict_with_generate:
            metric = ComputeSimilarity(tokenizer=None)
        elif launch.finetuning_args.compute_accuracy:
            metric = ComputeAccuracy()
    elif stage == "rm":
        from llamafactory.train.rm.metric import ComputeAccuracy as RewardAccuracy

        metric = RewardAccuracy()
    elif stage != "pt":
        return None
    reported = {"eval_loss", "epoch", *speed_metrics("eval", 0.0, num_samples=1, num_steps=1)}
    if metric is not None:
        reported |= {f"eval_{key}" for key in metric.score_dict}
    return reported
