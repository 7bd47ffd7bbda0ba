"""The tokens a run processes, padding included, from the lengths of the rows LLaMA-Factory's pipeline left.

A micro-batch is padded to its longest row, rounded up to the collator's ``pad_to_multiple_of``; transformers'
``include_num_input_tokens_seen`` ("all", what ``true`` means) counts ``input_ids.numel()`` of each micro-batch
on each rank (trainer.py ``_track_num_input_tokens``), so padding is in the count. The trainer's sampler
shuffles with a generator seeded at run time, so which rows meet in a batch is not known before the run: the
forecast is the expectation of each batch's padded length over the random batches of its size (the order
statistic of the longest row of k drawn from n: P(longest <= l_i) = C(i, k) / C(n, k) without replacement, where
the lengths are the whole train split, or (i / n)^k where they are a sample of it), summed over the micro-batch
sizes accelerate deals (lf/work.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..lf.work import Work

# The collator each data stage's workflow builds, and the multiple it pads to:
# sft: train/sft/workflow.py run_sft, SFTDataCollatorWith4DAttentionMask(pad_to_multiple_of=8 if do_train);
# pt: train/pt/workflow.py run_pt, DataCollatorForLanguageModeling (no multiple).
# rm (the data stage of dpo and rm): train/dpo/workflow.py and train/rm/workflow.py,
# PairwiseDataCollatorWithPadding(pad_to_multiple_of=8), which pads each row's chosen and rejected
# sequences together with the batch's others: 2 sequences a row (data/collator.py).
# kto: train/kto/workflow.py, KTODataCollatorWithPadding(pad_to_multiple_of=8), which pads the target rows
# (input_ids, what the trainer counts) and the KL rows (kl_input_ids) as two batches (data/collator.py).
# (pinned against stock runs' num_input_tokens_seen by tests/test_forecast_work.py; rm, dpo's and rm's, and
# kto by tests/test_forecast_flops.py)
PAD_MULTIPLE = {"sft": 8, "pt": 1, "rm": 8, "kto": 8}
SEQUENCES_PER_ROW = {"rm": 2}


@dataclass(frozen=True)
class Tokens:
    total: int  # tokens the run processes, padding included (num_input_tokens_seen with "all")
    spread: float  # one standard deviation of that total over the sampler's random batches
    real: int  # tokens that are not padding
    squares: int  # each sequence's padded length squared, summed: what attention's FLOPs grow with (flops.py)
    per_step: float  # the mean over optimizer steps, all ranks together
    padding_share: float  # padding / total
    sample_rows: int  # the rows whose lengths were read
    sampled: bool  # True when those rows are a sample of the train split (the dry run's rows_cap)
    exact: bool  # True where the batches' rows are known (no shuffling, every length read)
    shuffled: bool = True  # the trainer's sampler shuffles (False: disable_shuffling)

    def as_json(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "not_padding": self.real,
            "spread": round(self.spread),
            "per_step": round(self.per_step, 1),
            "padding_share": round(self.padding_share, 4),
            "lengths_read": self.sample_rows,
            "lengths_sampled": self.sampled,
            "exact": self.exact,
            "shuffled": self.shuffled,
        }


def _rounded(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def padded_moments(lengths: Sequence[int], batch: int, multiple: int, *, sample: bool) -> tuple[float, float]:
    """The mean and variance of the ``numel`` of a batch of ``batch`` random rows (batch x rounded longest row)."""
    return _padded_stats(lengths, batch, multiple, sample=sample)[:2]


def _padded_stats(lengths: Sequence[int], batch: int, multiple: int, *, sample: bool) -> tuple[float, float, float]:
    """``padded_moments`` and the mean of ``batch`` x the padded length squared (attention's FLOPs grow with it)."""
    ordered = sorted(lengths)
    n = len(ordered)
    if n == 0 or batch <= 0:
        return 0.0, 0.0, 0.0
    if not sample and batch >= n:
        longest = _rounded(ordered[-1], multiple)
        return float(batch * longest), 0.0, float(batch * longest * longest)
    first = second = squares = 0.0
    below = 0.0  # P(longest <= ordered[i - 1])
    for i, length in enumerate(ordered, start=1):
        at_most = (i / n) ** batch if sample else math.comb(i, batch) / math.comb(n, batch)
        padded = _rounded(length, multiple)
        numel = batch * padded
        first += (at_most - below) * numel
        second += (at_most - below) * numel * numel
        squares += (at_most - below) * numel * padded
        below = at_most
    return first, max(second - first * first, 0.0), squares


def run_tokens(
    lengths: Sequence[int],
    work: Work,
    multiple: int,
    *,
    sampled: bool,
    shuffled: bool = True,
    sequences: int = 1,
    row_tokens: Sequence[int] | None = None,
) -> Tokens | None:
    """The run's tokens over the micro-batches it runs (whole epochs, then the last epoch's share of them).
    ``shuffled`` (the trainer's RandomSampler): each batch's expected padded ``numel`` for its size;
    unshuffled (LLaMA-Factory's ``disable_shuffling``: a SequentialSampler, sft/trainer.py
    ``_get_train_sampler``) with every row's length read: each batch's own rows, exact. A row of ``sequences``
    sequences (a pair: 2) pads them all to the batch's longest (``lengths``: each row's longest), and its
    tokens that are not padding are ``row_tokens`` (default: its length)."""
    if not lengths or work.batches_per_rank == 0:
        return None
    exact = not shuffled and not sampled and len(lengths) == work.rows
    real_tokens = row_tokens if row_tokens is not None else lengths
    mean_length = sum(real_tokens) / len(real_tokens)
    cache: dict[int, tuple[float, float, float]] = {}

    def padded(rows: tuple[int, ...]) -> tuple[float, float, float]:
        if exact:
            longest = _rounded(max(lengths[i] for i in rows), multiple)
            numel = float(sequences * len(rows) * longest)
            return numel, 0.0, numel * longest
        if len(rows) not in cache:
            mean, variance, squares = _padded_stats(lengths, len(rows), multiple, sample=sampled)
            cache[len(rows)] = (sequences * mean, sequences * sequences * variance, sequences * squares)
        return cache[len(rows)]

    full_epochs, last_batches = work.epochs_run()
    total = real = variance = squares = 0.0
    for rank in work.batches:
        for i, rows in enumerate(rank):
            times = full_epochs + (1 if i < last_batches else 0)
            mean, spread, square = padded(rows)
            total += times * mean
            squares += times * square
            variance += times * spread  # batches taken as independent: an upper bound for one partition
            real += times * (sum(real_tokens[j] for j in rows) if exact else len(rows) * mean_length)
    return Tokens(
        total=round(total),
        spread=math.sqrt(variance),
        real=round(real),
        squares=round(squares),
        per_step=total / work.steps if work.steps else 0.0,
        padding_share=1 - real / total if total else 0.0,
        sample_rows=len(lengths),
        sampled=sampled,
        exact=exact,
        shuffled=shuffled,
    )
