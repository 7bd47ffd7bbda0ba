"""A run's forecast from what LLaMA-Factory's dry launch found: steps (lf/work.py), padded tokens (tokens.py),
FLOPs (flops.py, counted when the forecast was asked for), and from them time and cost on its card (cards.py),
each figure with its source; made in one call (``forecast_for``), said by render.py. Nothing is printed
without its source (docs/forecast.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..lf.work import Work, optimizer_steps, streamed_steps
from .cards import Card, add_cards, card_for, time_and_cost
from .flops import request
from .tokens import PAD_MULTIPLE, SEQUENCES_PER_ROW, Tokens, run_tokens


@dataclass
class Forecast:
    work: Work
    tokens: Tokens | None
    card: Card | None
    gpus: int
    run_flops: float | None = None
    flops_note: str | None = None
    hours: tuple[float, float] | None = None  # wall hours, (fast, slow) end of the achieved band
    hours_at_peak: float | None = None  # the lower bound, at 100% of peak
    fraction: dict[str, Any] | None = None
    price: dict[str, Any] | None = None
    cost: tuple[float, float] | None = None  # USD, (low, high)
    notes: list[str] = field(default_factory=list)
    found_step: Any = None  # the FLOPs hook's StepFlops (flops.py), kept for the measured rate
    forward_only_flops: float = 0.0  # of run_flops, the forwards without gradients (a reference model's)
    run_attention_flops: float = 0.0  # of run_flops, the attention kernels' (measure.py times them apart)
    measured: dict[str, Any] | None = None  # check --measure N (measure.py measured_forecast)
    carried: dict[str, Any] | None = None  # check --rate-from FILE (measure.py carried_forecast)
    cards: list[dict[str, Any]] | None = None  # --cards: each catalogue card's row (cards.py card_rows)
    peak_gib: float | None = None  # --cards: the memory estimate's peak per device the rows are judged by
    faster: list[dict[str, Any]] | None = None  # --cards: changes that make the run faster (cards.py)
    # where the model's files were not here: fetched, or its bundled shape and a stand-in tokenizer
    # (lf/model_files.py ModelFiles.as_json); None where local or cached
    model_files: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "work": self.work.as_json(),
            "tokens": None if self.tokens is None else self.tokens.as_json(),
            "card": None if self.card is None else self.card.__dict__,
            "gpus": self.gpus,
            "run_flops": self.run_flops,
            "run_attention_flops": self.run_attention_flops,
            "flops_note": self.flops_note,
            "hours": self.hours,
            "hours_at_peak": self.hours_at_peak,
            "achieved_fraction": self.fraction,
            "price": self.price,
            "cost_usd": self.cost,
            "notes": self.notes,
            "model_files": self.model_files,
            **({"measured": self.measured} if self.measured is not None else {}),
            **({"carried": self.carried} if self.carried is not None else {}),
            **({"cards": {"peak_gib": self.peak_gib, "rows": self.cards}} if self.cards is not None else {}),
            **({"faster_settings": self.faster} if self.faster is not None else {}),
        }


@dataclass(frozen=True)
class TrainRows:
    """What LLaMA-Factory's data pipeline gave the dry run's train split, as the forecast reads it (``of``: from
    lf/dry_parts.py DryRun, the one place its fields are named)."""

    rows: int  # after max_samples, val_size and packing
    lengths: tuple[int, ...] | None  # each row's tokens as tokenized; None where not read
    data_stage: str | None = "sft"  # whose collator pads them (tokens.py PAD_MULTIPLE)
    sampled: bool = False  # the lengths are of a sample of the rows
    rows_scaled: tuple[int, int, int] | None = None  # (made, of rows read, full split): the steps are estimated
    pair_tokens: tuple[int, ...] | None = None  # dpo/kto: both sequences' tokens of each row, not padded
    kl_lengths: tuple[int, ...] | None = None  # kto: the KL rows' lengths
    streamed: bool = False  # streaming: no row count; ``lengths`` are the stream's first rows (lf/dry_data.py)
    read: int | None = None  # the rows whose lengths were read, where ``lengths`` repeat rows to weigh them

    @classmethod
    def of(cls, dry: Any, streamed: bool = False) -> TrainRows:
        weights = dry.train_row_weights  # several datasets read in other shares than the run's (lf/dry_data.py)

        def weighed(values: tuple[int, ...] | None) -> tuple[int, ...] | None:
            if values is None or weights is None:
                return values
            return tuple(value for value, times in zip(values, weights, strict=True) for _ in range(times))

        return cls(
            rows=(dry.rows or {}).get("train") or 0,
            streamed=streamed,
            lengths=weighed(dry.train_lengths),
            data_stage=dry.data_stage,
            sampled=dry.rows_estimated,
            rows_scaled=dry.train_rows_scaled,
            pair_tokens=weighed(dry.train_pair_tokens),
            kl_lengths=weighed(dry.train_kl_lengths),
            read=None if weights is None or dry.train_lengths is None else len(dry.train_lengths),
        )


def card_of(catalogue: Any, alias: str | None, device_names: list[str]) -> Card | None:
    """The card: the catalogue product the target names (``alias``: machine/catalogue.py ``Catalogue.gpu``), else
    the product whose name the device's is."""
    found = catalogue.gpu(alias) if alias else None
    product = found[0] if found else None
    if product is None:
        names = {name.lower() for name in device_names}
        for arch in catalogue.archs.values():
            for candidate in arch.products:
                if candidate.name.lower() in names:
                    product = candidate
    return None if product is None else card_for(product)


@dataclass(frozen=True)
class NoForecast:
    """Asked for, not made: why."""

    why: str

    def as_json(self) -> dict[str, Any]:
        return {"made": False, "why": self.why}


def forecast_for(
    dry: Any, resolution: Any, ctx: Any, alias: str | None, world_size: int, peak_gib: float | None = None
) -> Forecast | NoForecast | None:
    """The check's whole forecast in one call, as data (render.py says it): from its dry run
    (lf/dry_parts.py DryRun) and its resolution, the run's work, tokens, FLOPs, time and cost on its card;
    with --cards every catalogue card and the faster settings (cards.py), with --measure the steps timed on
    this machine (measure.py); ``peak_gib``: the check's memory estimate, which --cards judges each card by.
    None where it was not asked for."""
    asked = request()
    if asked is None:
        return None
    config = resolution.config
    # a stream has no row count: its steps are max_steps, its tokens from the rows of it the dry run read
    streamed = bool(config.get("streaming")) and bool(dry.train_lengths)
    if not streamed and (not dry.rows or not dry.rows.get("train")):
        seen = "; ".join(dry.not_checked) or "LLaMA-Factory's data pipeline did not run here: see the findings"
        return NoForecast(f"the dry run counted no train rows ({seen})")
    card = card_of(ctx.catalogue, alias, [d.name for d in ctx.snapshot.devices])
    try:
        train = TrainRows.of(dry, streamed=streamed)
        forecast = forecast_of(config, train, world_size, card, dry.forecast, price=asked.price)
        forecast.model_files = dry.model_files
        if asked.cards:
            add_cards(forecast, config, asked.price, peak_gib)
    except Exception as exc:  # the hook asks at every launch: a forecast bug must not stop a run
        return NoForecast(f"the forecast failed here, a bug to report: {type(exc).__name__}: {exc}"[:300])
    if asked.measure is not None:
        from .measure import measure

        measure(forecast, config, resolution.env_changes, asked.measure, ok=resolution.ok)
    if asked.rate_from is not None:
        from .measure import carried_forecast

        forecast.carried = carried_forecast(forecast, asked.rate_from[1], asked.rate_from[0])
    return forecast


def forecast_of(
    config: Mapping[str, Any],
    train: TrainRows,
    world_size: int,
    card: Card | None,
    found: Mapping[str, Any],
    price: float | None = None,
) -> Forecast:
    """The forecast from the dry run's findings (``train``: its rows and lengths; ``found``: the FLOPs hook's)
    and the config."""
    rows, lengths, data_stage, sampled = train.rows, train.lengths, train.data_stage, train.sampled
    rows_scaled, pair_tokens, kl_lengths = train.rows_scaled, train.pair_tokens, train.kl_lengths
    from transformers import TrainingArguments

    defaults = {f.name: f.default for f in TrainingArguments.__dataclass_fields__.values()}

    def value(key: str) -> Any:
        return config.get(key, defaults[key])

    batch = max(int(value("per_device_train_batch_size")), 1)
    accumulation = max(int(value("gradient_accumulation_steps")), 1)
    if train.streamed:
        work = streamed_steps(
            per_device_batch=batch, accumulation=accumulation, max_steps=int(value("max_steps")), world_size=world_size
        )
    else:
        work = optimizer_steps(
            rows=rows,
            per_device_batch=batch,
            accumulation=accumulation,
            num_train_epochs=float(value("num_train_epochs")),
            max_steps=int(value("max_steps")),
            world_size=world_size,
            drop_last=bool(value("dataloader_drop_last")),
        )
    if rows_scaled is not None:
        work = dataclasses.replace(work, rows_scaled=rows_scaled)
    tokens = None
    notes: list[str] = []
    kl_tokens = None
    if lengths and data_stage in PAD_MULTIPLE:
        shuffled = not config.get("disable_shuffling", False)
        if train.streamed:
            # on one rank the steps' rows are the stream's first ones, in the order the dry run's dataloader read
            # them (lf/dry_data.py): exact where they were all read; else a sample met at random
            in_order = world_size == 1 and len(lengths) >= work.rows
            lengths, sampled, shuffled = (lengths[: work.rows], False, False) if in_order else (lengths, True, True)
        multiple = PAD_MULTIPLE[data_stage]
        sequences = SEQUENCES_PER_ROW.get(data_stage, 1)
        tokens = run_tokens(
            lengths, work, multiple, sampled=sampled, shuffled=shuffled, sequences=sequences, row_tokens=pair_tokens
        )
        if kl_lengths:  # kto's KL rows: the same rows' batches, padded apart, forward only
            kl_tokens = run_tokens(kl_lengths, work, multiple, sampled=sampled, shuffled=shuffled)
        if train.read is not None:  # rows repeated to weigh their datasets: the sample is the rows read
            tokens = dataclasses.replace(tokens, sample_rows=train.read)
            notes.append(
                "tokens: each dataset's rows read weighed by the rows the run trains on of it (lf/dry_data.py "
                "_row_weights)"
            )
        if found.get("tokens_note"):
            notes.append(found["tokens_note"])
    else:
        notes.append(f"tokens not forecast: the {data_stage or 'unknown'} stage's rows are not read (sft, pt, rm, kto)")
    result = Forecast(work=work, tokens=tokens, card=card, gpus=world_size, notes=notes)
    step = found.get("step_flops")
    result.found_step = step
    if step is not None and tokens is not None:
        # counted at batch x cutoff_len: the attention kernels' part at each batch's padded length squared,
        # the rest per token (docs/forecast.md); the step, then the forwards without gradients (dpo's and kto's
        # reference, kto's KL batch), each on its own batches
        batches = {"target": tokens, "kl": kl_tokens}
        forwards = found.get("forwards", ())
        if any(batches[batch] is None for batch, _ in forwards):
            notes.append("FLOPs not counted: kto's KL rows were not read")
        else:
            counted = [(step, tokens)] + [(f, batches[b]) for b, f in forwards]
            parts = [flops.parts(on.total, on.squares) for flops, on in counted]
            result.forward_only_flops = sum(sum(part) for part in parts[1:])
            result.run_attention_flops = sum(attention for _, attention in parts)
            result.run_flops = sum(sum(part) for part in parts)
        if kl_tokens is not None:
            notes.append(
                f"kto's KL rows: {kl_tokens.total:,} tokens with padding, forward only (the trainer's "
                "num_input_tokens_seen counts the target rows alone)"
            )
        result.flops_note = (
            f"FlopCounterMode on the built model, forward {step.forward:,} + backward {step.backward:,} + "
            f"recompute {step.recompute:,} FLOPs for {step.sequences} x {step.length} tokens (attention "
            f"{step.attention:,}), scaled to the run's tokens and, attention, to its batches' padded lengths"
            + (
                f"; plus {len(forwards)} forward(s) without gradients a step, {result.forward_only_flops:.3g}"
                if forwards
                else ""
            )
        )
    elif "step_flops_error" in found:
        notes.append(f"FLOPs not counted: {found['step_flops_error']}")
    time_and_cost(result, price)
    return result
