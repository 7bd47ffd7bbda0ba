"""The training dry run's trainer step (lf/dry_run.py): the parts of transformers' ``Trainer`` set-up that
need no weights, called as the trainer calls them (the trainer itself is not built: it needs weights):
``TrainingArguments.get_process_log_level``, ``Trainer.get_optimizer_cls_and_kwargs`` and the optimizer class
on a stand-in parameter, ``get_scheduler``, ``get_reporting_integration_callbacks`` (instantiated, as the
trainer does), and torch's ``DataLoader`` batch arguments (docs/llamafactory-launch.md#d7). This machine's
packages are what is checked (an optimizer's or a reporter's optional package).
"""

from __future__ import annotations

import dataclasses

from ..forecast.work import work_of
from ..memory import optimizer_state_bytes
from .dry_parts import Launch, _words


def trainer_setup(launch: Launch) -> None:
    import torch
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
            f"TrainingArguments.get_process_log_level raised {type(exc).__name__}: {_words(exc)}",
            fix_with={"key": key},
            key=key,
        )
    model = launch.model if launch.model is not None else torch.nn.Linear(1, 1, device="meta")
    optimizer = None
    try:
        optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    except (ImportError, ValueError, TypeError) as exc:
        code = "OPTIMIZER_UNAVAILABLE" if isinstance(exc, ImportError) else "OPTIMIZER_REFUSED"
        launch.run.error(
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
                if launch.run.built is not None:  # the state it keeps per trainable element, for memory_fit
                    per = optimizer_state_bytes(optimizer_cls, kwargs)
                    launch.run.built = dataclasses.replace(
                        launch.run.built, optimizer_bytes_per_parameter=per, optimizer=optimizer_cls.__name__
                    )
            except (TypeError, ValueError) as exc:
                launch.run.error(
                    code="OPTIMIZER_REFUSED",
                    message=f"torch's {optimizer_cls.__name__} refused the trainer's arguments {kwargs}: {_words(exc)}",
                    key="learning_rate",
                )
    if optimizer is not None:
        steps = planned_steps(launch)
        try:
            get_scheduler(
                args.lr_scheduler_type,
                optimizer=optimizer,
                num_warmup_steps=args.get_warmup_steps(steps),
                num_training_steps=steps,
                scheduler_specific_kwargs=args.lr_scheduler_kwargs,
            )
        except (ImportError, ValueError, TypeError, OverflowError) as exc:  # OverflowError: warmup_steps: .inf
            launch.run.error(
                code="SCHEDULER_REFUSED",
                message=f"transformers' get_scheduler refused lr_scheduler_type {args.lr_scheduler_type.value}: "
                f"{_words(exc)}",
                key="lr_scheduler_kwargs" if args.lr_scheduler_kwargs else "lr_scheduler_type",
            )
    try:
        for callback in get_reporting_integration_callbacks(args.report_to):
            callback()  # trainer_callback.py CallbackHandler.add_callback: callback() for a class
    except (ImportError, RuntimeError, ValueError) as exc:
        launch.run.error(
            code="REPORTER_UNAVAILABLE",
            message=f"transformers' reporting callback for report_to {args.report_to} refused: {_words(exc)}",
            key="report_to",
        )
    try:
        # Trainer.get_train_dataloader builds a torch DataLoader with these arguments.
        torch.utils.data.DataLoader(
            range(launch.train_rows or 1), batch_size=args.train_batch_size, drop_last=args.dataloader_drop_last
        )
    except (ValueError, TypeError) as exc:
        launch.run.error(
            code="BATCH_REFUSED",
            message=f"torch's DataLoader refused the trainer's batch size {args.train_batch_size}: {_words(exc)}",
            key="per_device_train_batch_size",
        )


def planned_steps(launch: Launch) -> int:
    """The run's optimizer steps as the trainer counts them (forecast/work.py, the one owner)."""
    return work_of(launch.training_args, launch.train_rows or 1).steps
