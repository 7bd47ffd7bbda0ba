"""Time and cost on a card (``time_and_cost``: FLOPs / (GPUs x the card's peak dense bf16 x an achieved
fraction), the dated price, each with its source: rates.json, the catalogue's peaks; without a published
fraction, the time at 100% of peak, said to be a lower bound), and ``check --cards``: the config on every
catalogue card, cheapest first, and the faster settings.

For each card: does the run fit (the memory estimate of lf/memory.py, made as the memory rule makes it, against
the rule's budget of the card's memory), and its time and cost there; the run's GPU count is the check's world
size on every card. The faster settings, each with its forecast:

- Gradient checkpointing off (``disable_gradient_checkpointing: true``) where the memory estimate says it
  still fits the card: the run's FLOPs less the recompute the FLOP count told apart (flops.py). An upper
  bound, said as "at most": without checkpointing LLaMA-Factory also leaves the embedding's output without a
  gradient (``enable_input_require_grads`` is for checkpointing), so the first layer's input gradients are not
  computed either (tests/test_forecast_cards.py checks the bound against the check of the changed config).
- Packing (``packing: true``) where padding is a large share of the tokens: its forecast needs LLaMA-Factory's
  packing of the rows, which only a dry run of the changed config has, so the line names the share and the
  command that forecasts it; no figure is made up.
- A larger batch is not listed: under the FLOP model it changes no time; what it brings on a real card only
  ``--measure`` on that card gives.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any


@functools.lru_cache(maxsize=1)
def rates() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath("rates.json").read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Card:
    alias: str
    peak_tflops: float | None
    peak_source: str
    peak_date: str | None = None


NO_PEAK = "none found: docs/rocm-facts.md#a3"


def card_for(product: Any) -> Card:
    """A catalogue product as the forecast's card: its peak with that peak's own source (AMD's, derived from
    AMD's, or secondary: machine/catalogue.py ``Product.peak_source``)."""
    return Card(product.alias, product.peak_dense_bf16_tflops, product.peak_source or NO_PEAK, product.peak_date)


def peak_kind(source: str | None, date: str | None = None) -> str:
    """What kind of figure a peak is, as its catalogue peak_source starts ("AMD's figure", "derived from AMD's
    figures" or "secondary"), with its source's date."""
    kind = (source or NO_PEAK).split(":", 1)[0]
    kind = "AMD's figure" if kind == "AMD" else kind
    return f"{kind}, {date}" if date else kind


def estimated_peak_gib(config: Mapping[str, Any], world_size: int) -> float | None:
    """The memory estimate's peak GiB per device from the checkpoint's config.json shape (lf/memory.py
    ``estimate_config``); None where unknown. Only where the check made no estimate of its own: the memory
    rule's counts the model the dry run built (rules/memory_fit.py ``_plan``), and full and freeze differ."""
    from ..lf.memory import estimate_config

    found = estimate_config(config, world_size)
    return None if found is None else found.total_gib


def add_cards(
    forecast: Any, config: Mapping[str, Any], price: float | None, checked_peak_gib: float | None = None
) -> None:
    """``check --cards``: the rows and the memory estimate they are judged by, set on the check's forecast:
    the check's own (``checked_peak_gib``: the memory rule's, with the model the dry run built) where it made
    one, else the estimate from the checkpoint's config.json (a check with no device to plan for)."""
    from ..machine.catalogue import load_catalogue

    catalogue = load_catalogue()
    checked = checked_peak_gib
    forecast.peak_gib = checked if checked is not None else estimated_peak_gib(config, forecast.gpus)
    forecast.cards = card_rows(forecast, catalogue, forecast.peak_gib, price)
    forecast.faster = faster_settings(forecast, config, price, catalogue)


def card_rows(forecast: Any, catalogue: Any, peak_gib: float | None, price: float | None) -> list[dict]:
    """Each catalogue card's row, cheapest first: cards that fit before those that do not, then by cost (high
    end), then by time where no price is known, then the cards with no time."""
    from ..rules.memory_fit import BUDGET

    rows = []
    for arch in catalogue.archs.values():
        for product in arch.products:
            if product.alias in {r["card"] for r in rows} or product.name in {r["name"] for r in rows}:
                continue  # one device under two aliases (strixhalo, ryzenaimax395): listed once
            card = card_for(product)
            on_card = dataclasses.replace(
                forecast, card=card, notes=[], hours=None, hours_at_peak=None, fraction=None, price=None, cost=None
            )
            time_and_cost(on_card, price)
            fits = None if peak_gib is None else peak_gib <= BUDGET * product.vram_gib
            rows.append(
                {
                    "card": product.alias,
                    "name": product.name,
                    "memory_gib": product.vram_gib,
                    "fits": fits,
                    "hours": on_card.hours,
                    "hours_at_peak": on_card.hours_at_peak,
                    "cost_usd": on_card.cost,
                    "price": on_card.price,
                    "why_no_time": None if on_card.hours_at_peak else _why(on_card, forecast),
                }
            )

    def order(row: dict) -> tuple:
        # a band (a published or measured fraction) is comparable; a lower bound (100% of peak) only to others
        kind = 0 if row["hours"] else 1 if row["hours_at_peak"] else 2
        time = row["hours"][1] if row["hours"] else row["hours_at_peak"]
        cost = row["cost_usd"][1] if row["cost_usd"] else None
        return (row["fits"] is False, kind, cost is None, cost or 0.0, time or 0.0, row["card"])

    return sorted(rows, key=order)


def _why(on_card: Any, forecast: Any) -> str:
    if forecast.run_flops is None:
        return "no FLOPs counted for the run (see the notes)"
    return next((n for n in on_card.notes if "not forecast" in n), "no time (see the notes)")


PADDING_WORTH_PACKING = 0.2  # this package's threshold for saying so, not a published figure


def faster_settings(forecast: Any, config: Mapping[str, Any], price: float | None, catalogue: Any) -> list[dict]:
    """The changes that make this run faster, each with what is known of its time, memory and cost."""
    from ..lf.memory import estimate_config
    from ..rules.memory_fit import BUDGET

    changes: list[dict[str, Any]] = []
    step = forecast.found_step
    checkpointing = not config.get("disable_gradient_checkpointing", False)
    if checkpointing and step is not None and step.recompute and forecast.run_flops:
        forward_only = forecast.forward_only_flops
        changed_config = {**config, "disable_gradient_checkpointing": True}
        estimate = estimate_config(changed_config, forecast.gpus)
        found = catalogue.gpu(forecast.card.alias) if forecast.card is not None else None
        memory = found[0].vram_gib if found is not None else None
        fits = None if estimate is None or memory is None else estimate.total_gib <= BUDGET * memory
        tokens = forecast.tokens
        dense, attention = step.without_recompute().parts(tokens.total, tokens.squares)
        changed = dataclasses.replace(
            forecast,
            run_flops=dense + attention + forward_only,  # forwards without gradients recompute nothing
            run_attention_flops=attention + forecast.run_attention_flops - step.parts(tokens.total, tokens.squares)[1],
            notes=[],
            hours=None,
            hours_at_peak=None,
            fraction=None,
            price=None,
            cost=None,
        )
        time_and_cost(changed, price)
        changes.append(
            {
                "change": {"disable_gradient_checkpointing": True},
                "why": f"the recompute is {1 - changed.run_flops / forecast.run_flops:.0%} of the FLOPs",
                "bound": "at most: the FLOPs less the recompute",
                "run_flops": changed.run_flops,
                "run_attention_flops": changed.run_attention_flops,
                "hours": changed.hours,
                "hours_at_peak": changed.hours_at_peak,
                "cost_usd": changed.cost,
                "peak_gib": None if estimate is None else estimate.total_gib,
                "fits": fits,
            }
        )
    tokens = forecast.tokens
    if tokens is not None and tokens.padding_share >= PADDING_WORTH_PACKING and not config.get("packing"):
        changes.append(
            {
                "change": {"packing": True},
                "why": f"{tokens.padding_share:.0%} of the tokens are padding",
                "forecast_with": "llamafactory-rocm check CONFIG packing=true --forecast",
            }
        )
    return changes


def time_and_cost(result: Any, price: float | None) -> None:
    """The time and cost of ``result`` (forecast/run.py Forecast) on its card, set in place, each with its source."""
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
