"""A run's forecast from what LLaMA-Factory's dry launch found: steps (work.py), padded tokens (tokens.py), FLOPs
(flops.py, counted when the forecast was asked for), and from them time and cost on one card: time = FLOPs /
(GPUs x the card's peak dense bf16 x an achieved fraction), each figure with its source (rates.json, the
catalogue's peaks). Where no achieved fraction was published for the card, the time at 100% of its peak is
given as a lower bound and said to be one. Nothing is printed without its source (docs/forecast.md).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from ..lf.work import Work, optimizer_steps
from .tokens import PAD_MULTIPLE, Tokens, run_tokens


@dataclass(frozen=True)
class Request:
    price: float | None = None  # USD per GPU-hour, the user's (--price)


_REQUEST: contextvars.ContextVar[Request | None] = contextvars.ContextVar("forecast_request", default=None)


@contextlib.contextmanager
def requested(price: float | None = None) -> Iterator[None]:
    """The forecast is asked for (check --forecast): the dry run counts FLOPs and the check reports it."""
    from ..lf.dry_activations import STEP_HOOKS

    token = _REQUEST.set(Request(price=price))
    STEP_HOOKS.append(count_step_flops)
    try:
        yield
    finally:
        STEP_HOOKS.remove(count_step_flops)
        _REQUEST.reset(token)


def request() -> Request | None:
    return _REQUEST.get()


def count_step_flops(launch: Any) -> None:
    """A step hook of the dry run's activation step: the FLOPs of one micro-batch at the trace's shape (the
    per-device batch x cutoff_len) on the built model; a model whose forward cannot run fake gets none."""
    from ..lf.memory import sequences_per_forward
    from .flops import step_flops

    args = launch.training_args
    sequences = sequences_per_forward(str(launch.run.stage), int(args.per_device_train_batch_size))
    compute = "bfloat16" if args.bf16 else "float16" if args.fp16 else None
    try:
        launch.run.forecast["step_flops"] = step_flops(
            launch.model, sequences, int(launch.data_args.cutoff_len), compute
        )
    except Exception as exc:  # the rest of the forecast stands; the reason is said
        launch.run.forecast["step_flops_error"] = f"{type(exc).__name__}: {exc}"[:300]


@functools.lru_cache(maxsize=1)
def rates() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath("rates.json").read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Card:
    alias: str
    peak_tflops: float | None
    peak_source: str


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
    measured: dict[str, Any] | None = None  # check --measure N (measure.py measured_forecast)
    cards: list[dict[str, Any]] | None = None  # --cards: each catalogue card's row (cards.py card_rows)
    peak_gib: float | None = None  # --cards: the memory estimate's peak per device the rows are judged by
    faster: list[dict[str, Any]] | None = None  # --cards: changes that make the run faster (faster.py)

    def as_json(self) -> dict[str, Any]:
        return {
            "work": self.work.as_json(),
            "tokens": None if self.tokens is None else self.tokens.as_json(),
            "card": None if self.card is None else self.card.__dict__,
            "gpus": self.gpus,
            "run_flops": self.run_flops,
            "flops_note": self.flops_note,
            "hours": self.hours,
            "hours_at_peak": self.hours_at_peak,
            "achieved_fraction": self.fraction,
            "price": self.price,
            "cost_usd": self.cost,
            "notes": self.notes,
            **({"measured": self.measured} if self.measured is not None else {}),
            **({"cards": {"peak_gib": self.peak_gib, "rows": self.cards}} if self.cards is not None else {}),
            **({"faster_settings": self.faster} if self.faster is not None else {}),
        }


def _duration(hours: float) -> str:
    if hours < 1 / 60:
        return f"{hours * 3600:.2g} s"
    return f"{hours * 60:.1f} min" if hours < 1 else f"{hours:.2f} h"


def forecast_lines(f: Forecast | NoForecast) -> list[str]:
    """The human block (check --forecast): each figure with where it comes from."""
    if isinstance(f, NoForecast):
        return [f"forecast: not made: {f.why}"]
    w = f.work
    lines = [
        "forecast (docs/forecast.md):",
        f"  steps: {w.steps:,} optimizer steps: {w.rows:,} train rows, {w.batches_per_rank:,} batches of "
        f"{w.per_device_batch} per rank x {w.world_size} rank(s) an epoch, accumulation {w.accumulation}, "
        f"{w.epochs} epoch(s) (transformers' Trainer.set_initial_training_values)",
    ]
    t = f.tokens
    if t is not None:
        how = "exact (unshuffled)" if t.exact else f"expected over the shuffled batches, one sd {t.spread:,.0f}"
        read = f"a sample of {t.sample_rows:,} rows" if t.sampled else f"all {t.sample_rows:,} rows"
        lines.append(
            f"  tokens: {t.total:,} with padding ({t.padding_share:.1%} padding), {t.per_step:,.0f} a step; "
            f"{how}; lengths of {read} as LLaMA-Factory tokenized them"
        )
    if f.run_flops is not None:
        lines.append(f"  FLOPs: {f.run_flops:.3g} for the run ({f.flops_note})")
    if f.card is not None and f.card.peak_tflops:
        lines.append(
            f"  card: {f.card.alias} x {f.gpus}, peak dense bf16 {f.card.peak_tflops:g} TFLOPS (the catalogue's, "
            "archs.json; its sources in docs/forecast.md#peaks)"
        )
    if f.hours is not None and f.fraction is not None:
        fr = f.fraction
        lines.append(
            f"  time: {_duration(f.hours[0])} to {_duration(f.hours[1])} at {fr['fraction_low']:.0%}-"
            f"{fr['fraction_high']:.0%} of peak ({fr['label']}, {fr['date']}; docs/forecast.md#achieved)"
        )
    elif f.hours_at_peak is not None:
        lines.append(f"  time: at least {_duration(f.hours_at_peak)} (at 100% of peak: no measured fraction)")
    if f.cost is not None and f.price is not None:
        p = f.price
        rate = f"${p['low']:g}" if p["low"] == p["high"] else f"${p['low']:g}-{p['high']:g}"
        said = f"{p.get('label', p['source'])}, {p['date']}" if p.get("date") else p["source"]
        lines.append(f"  cost: ${f.cost[0]:,.2f} to ${f.cost[1]:,.2f} at {rate} per GPU-hour ({said})")
    if f.measured is not None:
        from .measure import measured_lines

        lines.extend(measured_lines(f.measured))
    lines.extend(f"  note: {note}" for note in f.notes)
    return lines


def card_of(catalogue: Any, alias: str | None, device_names: list[str]) -> Card | None:
    """The card: the target's alias (--gpu), else the catalogue product whose name the device's is."""
    found = catalogue.gpu(alias) if alias else None
    if found is None:
        for name in device_names:
            for arch in catalogue.archs.values():
                for product in arch.products:
                    if product.name.lower() == name.lower():
                        found = (product, arch)
    if found is None:
        return None
    product, arch = found
    source = arch.sources.get("peak_dense_bf16_tflops", "no peak figure in the catalogue")
    return Card(product.alias, product.peak_dense_bf16_tflops, source)


@dataclass(frozen=True)
class NoForecast:
    """Asked for, not made: why."""

    why: str

    def as_json(self) -> dict[str, Any]:
        return {"made": False, "why": self.why}


def forecast_for(
    dry: Any, config: Mapping[str, Any], world_size: int, catalogue: Any, alias: str | None, device_names: list[str]
) -> Forecast | NoForecast | None:
    """The check's forecast from its dry run (lf/dry_parts.py DryRun); None where it was not asked for."""
    asked = request()
    if asked is None:
        return None
    if not dry.rows or not dry.rows.get("train"):
        why = "the dry run counted no train rows"
        if dry.not_checked:
            why += f" ({'; '.join(dry.not_checked)})"
        else:
            why += " (LLaMA-Factory's data pipeline did not run here: see the findings)"
        return NoForecast(why)
    return forecast_of(
        config,
        dry.rows["train"],
        dry.train_lengths,
        dry.rows_estimated,
        dry.data_stage,
        world_size,
        card_of(catalogue, alias, device_names),
        dry.forecast,
        price=asked.price,
    )


def forecast_of(
    config: Mapping[str, Any],
    rows: int,
    lengths: tuple[int, ...] | None,
    sampled: bool,
    data_stage: str | None,
    world_size: int,
    card: Card | None,
    found: Mapping[str, Any],
    price: float | None = None,
) -> Forecast:
    """The forecast from the dry run's findings (rows, lengths, ``found``: the FLOPs hook's) and the config."""
    from transformers import TrainingArguments

    defaults = {f.name: f.default for f in TrainingArguments.__dataclass_fields__.values()}

    def value(key: str) -> Any:
        return config.get(key, defaults[key])

    work = optimizer_steps(
        rows=rows,
        per_device_batch=max(int(value("per_device_train_batch_size")), 1),
        accumulation=max(int(value("gradient_accumulation_steps")), 1),
        num_train_epochs=float(value("num_train_epochs")),
        max_steps=int(value("max_steps")),
        world_size=world_size,
        drop_last=bool(value("dataloader_drop_last")),
    )
    tokens = None
    notes: list[str] = []
    if lengths and data_stage in PAD_MULTIPLE:
        shuffled = not config.get("disable_shuffling", False)
        tokens = run_tokens(lengths, work, PAD_MULTIPLE[data_stage], sampled=sampled, shuffled=shuffled)
    else:
        notes.append(f"tokens not forecast: the {data_stage or 'unknown'} stage's rows are not read (sft, pt only)")
    result = Forecast(work=work, tokens=tokens, card=card, gpus=world_size, notes=notes)
    step = found.get("step_flops")
    result.found_step = step
    if step is not None and tokens is not None:
        # FLOPs scale with the tokens run; counted at batch x cutoff_len, attention's share (s^2) is the
        # cutoff's, an over-count where rows are shorter (docs/forecast.md)
        result.run_flops = step.total * tokens.total / (step.sequences * step.length)
        result.flops_note = (
            f"FlopCounterMode on the built model, forward {step.forward:,} + backward {step.backward:,} + "
            f"recompute {step.recompute:,} FLOPs for {step.sequences} x {step.length} tokens, scaled to the run's "
            "tokens"
        )
    elif "step_flops_error" in found:
        notes.append(f"FLOPs not counted: {found['step_flops_error']}")
    _time_and_cost(result, price)
    return result


def _time_and_cost(result: Forecast, price: float | None) -> None:
    card, flops = result.card, result.run_flops
    if card is None:
        result.notes.append("time not forecast: the card is not in the catalogue (name one with --gpu)")
        return
    if flops is None:
        return
    if not card.peak_tflops:
        result.notes.append(f"time not forecast: no peak dense bf16 figure for {card.alias} ({card.peak_source})")
        return
    table = rates()
    seconds_at_peak = flops / (card.peak_tflops * 1e12 * result.gpus)
    result.hours_at_peak = seconds_at_peak / 3600
    measured = table["achieved"].get(card.alias)
    if measured is None:
        result.notes.append(f"{card.alias}: {table['achieved_none']}")
        hours = (result.hours_at_peak, result.hours_at_peak)
    else:
        result.fraction = measured
        hours = (result.hours_at_peak / measured["fraction_high"], result.hours_at_peak / measured["fraction_low"])
        result.hours = hours
    if price is not None:
        result.price = {"low": price, "high": price, "unit": "USD per GPU-hour", "source": "--price", "date": None}
    else:
        listed = table["prices"].get(card.alias)
        if listed is None:
            result.notes.append(table["prices_none"])
            return
        result.price = listed
    result.cost = (
        hours[0] * result.gpus * result.price["low"],
        hours[1] * result.gpus * result.price["high"],
    )
    if measured is None:
        result.notes.append("the cost is at 100% of peak: a lower bound")
