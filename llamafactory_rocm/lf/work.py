"""The work a run does, counted as transformers' ``Trainer`` counts it: the one owner of optimizer steps,
micro-batches per rank and the world size they are dealt to.

Nothing here is restated arithmetic: the dataloader's length on each rank is the length of a torch
``DataLoader`` over the train rows' indices, prepared by accelerate's ``prepare_data_loader`` as
``Trainer._get_dataloader`` prepares it (``accelerator.prepare``: batches dealt to the ranks, the short ones
filled from the start with ``even_batches``); the steps are ``Trainer.set_initial_training_values``'s
(``num_update_steps_per_epoch`` from ``len(train_dataloader)`` and ``gradient_accumulation_steps``, then
``max_steps`` or ``ceil(num_train_epochs x steps per epoch)``), called on a stand-in trainer that answers the
three questions it asks (tests/test_forecast_work.py pins the result to a stock run's ``global_step``).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any


@dataclass(frozen=True)
class Work:
    rows: int  # train rows after LLaMA-Factory's pipeline (max_samples, val_size, packing)
    world_size: int  # data-parallel ranks the batches are dealt to
    per_device_batch: int
    accumulation: int
    batches_per_rank: int  # len(train_dataloader) on each rank, one epoch
    steps_per_epoch: int  # the trainer's num_update_steps_per_epoch
    steps: int  # the trainer's max_steps: the run's final global_step
    epochs: int  # epochs the trainer loops over (the last one may stop early at max_steps)
    # the row indices of each micro-batch of one epoch on each rank, as accelerate deals them unshuffled
    batches: tuple[tuple[tuple[int, ...], ...], ...] = ()
    # (rows the pipeline made, of the rows it read, the full split's) where ``rows`` is scaled from a sample
    # (lf/dry_parts.py DryRun.train_rows_scaled): the steps are an estimate; None where they are exact
    rows_scaled: tuple[int, int, int] | None = None
    streamed: bool = False  # an IterableDataset (streaming): ``rows`` are those the steps read, not the data's

    def epochs_run(self) -> tuple[int, int]:
        """(whole epochs, micro-batches of the last one) the trainer's loop walks each rank's dataloader for: an
        epoch's last step takes the micro-batches left (fewer than the accumulation where they do not divide),
        and ``max_steps`` can end the run inside an epoch."""
        whole, steps_left = divmod(self.steps, self.steps_per_epoch) if self.steps_per_epoch else (0, 0)
        return whole, min(steps_left * self.accumulation, self.batches_per_rank)

    @property
    def micro_batches_per_rank(self) -> int:
        """The forward + backward passes each rank runs (not ``steps x accumulation``: see ``epochs_run``)."""
        whole, last = self.epochs_run()
        return whole * self.batches_per_rank + last

    def as_json(self) -> dict[str, Any]:
        return {
            "exact": self.rows_scaled is None,
            "streamed": self.streamed,
            "rows_scaled_from": None if self.rows_scaled is None else dict(zip(_SCALED, self.rows_scaled, strict=True)),
            "rows": self.rows,
            "world_size": self.world_size,
            "per_device_train_batch_size": self.per_device_batch,
            "gradient_accumulation_steps": self.accumulation,
            "batches_per_rank_per_epoch": self.batches_per_rank,
            "steps_per_epoch": self.steps_per_epoch,
            "steps": self.steps,
            "epochs": self.epochs,
        }


_SCALED = ("made", "of_rows_read", "full_split_rows")


@functools.lru_cache(maxsize=256)
def dealt_batches(rows: int, batch: int, world_size: int, drop_last: bool) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """The row indices of every micro-batch each rank gets in one epoch, before shuffling: a torch DataLoader
    over ``rows`` indices, prepared by accelerate for each rank as the trainer's ``accelerator.prepare`` does.
    Its batch sampler is walked, not the loader: no batch is collated and no data is read."""
    import torch
    from accelerate.data_loader import prepare_data_loader

    loader = torch.utils.data.DataLoader(range(rows), batch_size=batch, drop_last=drop_last)
    if world_size == 1:
        return (tuple(tuple(b) for b in loader.batch_sampler),)
    return tuple(
        tuple(tuple(b) for b in prepare_data_loader(loader, num_processes=world_size, process_index=rank).batch_sampler)
        for rank in range(world_size)
    )


def _initial_values(loader: Any, *, accumulation: int, num_train_epochs: float, max_steps: int, total_batch: int,
                    rows: int) -> tuple:  # fmt: skip
    """``Trainer.set_initial_training_values`` for ``loader`` (only its len(), or its lack of one, is read), called
    on a stand-in that answers what it asks of the trainer: the batch total (logged only), the sequence-parallel
    size (1: LLaMA-Factory sets no ParallelismConfig) and num_examples."""
    from transformers import Trainer

    args = SimpleNamespace(
        max_steps=max_steps, num_train_epochs=num_train_epochs, gradient_accumulation_steps=accumulation
    )
    stand_in = SimpleNamespace(
        get_total_train_batch_size=lambda _args: total_batch, get_sp_size=lambda: 1, num_examples=lambda _l: rows
    )
    return Trainer.set_initial_training_values(stand_in, args, loader)


def optimizer_steps(
    *,
    rows: int,
    per_device_batch: int,
    accumulation: int,
    num_train_epochs: float,
    max_steps: int = -1,
    world_size: int = 1,
    drop_last: bool = False,
) -> Work:
    """The run's steps as ``Trainer.set_initial_training_values`` computes them for these rows."""
    import torch

    dealt = dealt_batches(rows, per_device_batch, world_size, drop_last)
    length = len(dealt[0])  # every rank's dataloader has the same length (even_batches)
    epochs, per_epoch, _examples, _samples, _total, _in_epoch, steps = _initial_values(
        torch.utils.data.DataLoader(range(length)),
        accumulation=accumulation,
        num_train_epochs=num_train_epochs,
        max_steps=max_steps,
        total_batch=per_device_batch * accumulation * world_size,
        rows=rows,
    )
    return Work(
        rows=rows,
        world_size=world_size,
        per_device_batch=per_device_batch,
        accumulation=accumulation,
        batches_per_rank=length,
        steps_per_epoch=per_epoch,
        steps=int(steps),
        epochs=int(epochs),
        batches=dealt,
    )


def streamed_steps(*, per_device_batch: int, accumulation: int, max_steps: int, world_size: int = 1) -> Work:
    """A streamed run's steps (LLaMA-Factory's ``streaming``: an IterableDataset, whose dataloader has no length),
    as ``Trainer.set_initial_training_values`` counts them: ``max_steps``, an epoch of ``max_steps x
    accumulation`` micro-batches of ``per_device_batch`` rows on each rank, dealt from the stream in order
    (accelerate's dispatcher gives each rank its slice of the ranks' batch): the Work of that many rows. A
    stream shorter than those rows starts again, its short last batch not counted apart. ValueError, the
    trainer's own, where ``max_steps`` is not set."""
    import torch

    class Stream(torch.utils.data.IterableDataset):  # no len(): the trainer's case for a stream
        def __iter__(self) -> Any:
            return iter(())

    *_, in_epoch, steps = _initial_values(
        torch.utils.data.DataLoader(Stream()),
        accumulation=accumulation,
        num_train_epochs=1.0,
        max_steps=max_steps,
        total_batch=per_device_batch * accumulation * world_size,
        rows=0,
    )
    rows = in_epoch * per_device_batch * world_size
    work = optimizer_steps(rows=rows, per_device_batch=per_device_batch, accumulation=accumulation,
                           num_train_epochs=1.0, max_steps=steps, world_size=world_size)  # fmt: skip
    return dataclasses.replace(work, streamed=True)


def work_of(training_args: Any, rows: int, world_size: int | None = None) -> Work:
    """``optimizer_steps`` for transformers' parsed ``TrainingArguments`` (LLaMA-Factory's, as
    ``get_train_args`` returns them); ``world_size`` defaults to the arguments' own."""
    return optimizer_steps(
        rows=rows,
        per_device_batch=max(int(training_args.per_device_train_batch_size), 1),
        accumulation=max(int(training_args.gradient_accumulation_steps), 1),
        num_train_epochs=float(training_args.num_train_epochs),
        max_steps=int(training_args.max_steps),
        world_size=world_size if world_size is not None else max(int(training_args.world_size), 1),
        drop_last=bool(training_args.dataloader_drop_last),
    )
