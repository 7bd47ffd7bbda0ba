"""``check --forecast --cards``: one config across the catalogue's cards, cheapest first.

For each card: does the run fit (the memory estimate of lf/memory.py, made as the memory rule makes it, from
the model LLaMA-Factory built in the dry run, against the rule's budget of the card's memory), and the time
and cost forecast/run.py gives on that card (peak x achieved fraction, the dated price). A card without a
peak figure gets no time and says so; one with a peak but no measured fraction gets a lower bound, said to
be one. The run's GPU count is the check's world size on every card.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .run import Card, Forecast, _duration, _time_and_cost


def estimated_peak_gib(config: Mapping[str, Any], world_size: int) -> float | None:
    """The memory estimate's peak GiB per device (lf/memory.py ``estimate_config``: the checkpoint's
    config.json shape); None where unknown. The memory rule adds the built model's count where the dry run
    built it (rules/memory_fit.py ``_plan``); for LoRA the two agree (tests/test_forecast_cards.py)."""
    from ..lf.memory import estimate_config

    found = estimate_config(config, world_size)
    return None if found is None else found.total_gib


def add_cards(forecast: Forecast, config: Mapping[str, Any], price: float | None) -> None:
    """``check --cards``: the rows and the memory estimate they are judged by, set on the check's forecast."""
    from ..machine.catalogue import load_catalogue
    from .faster import faster_settings

    forecast.peak_gib = estimated_peak_gib(config, forecast.gpus)
    forecast.cards = card_rows(forecast, load_catalogue(), forecast.peak_gib, price)
    forecast.faster = faster_settings(forecast, config, price)


def card_rows(forecast: Forecast, catalogue: Any, peak_gib: float | None, price: float | None) -> list[dict]:
    """Each catalogue card's row, cheapest first: cards that fit before those that do not, then by cost (high
    end), then by time where no price is known, then the cards with no time."""
    from ..rules.memory_fit import BUDGET

    rows = []
    for arch in catalogue.archs.values():
        for product in arch.products:
            if product.alias in {r["card"] for r in rows} or product.name in {r["name"] for r in rows}:
                continue  # one device under two aliases (strixhalo, ryzenaimax395): listed once
            card = Card(product.alias, product.peak_dense_bf16_tflops, arch.sources.get("peak_dense_bf16_tflops", ""))
            on_card = dataclasses.replace(
                forecast, card=card, notes=[], hours=None, hours_at_peak=None, fraction=None, price=None, cost=None
            )
            _time_and_cost(on_card, price)
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


def _why(on_card: Forecast, forecast: Forecast) -> str:
    if forecast.run_flops is None:
        return "no FLOPs counted for the run (see the notes)"
    return next((n for n in on_card.notes if "not forecast" in n), "no time (see the notes)")


def card_lines(rows: list[dict], peak_gib: float | None, gpus: int) -> list[str]:
    """The human table under the forecast block."""
    memory = f"{peak_gib:.1f} GiB estimated peak per device" if peak_gib is not None else "memory not estimated"
    lines = [f"  cards (x {gpus}, cheapest first; {memory}, fits = within {_budget():.0%} of the card's memory):"]
    for row in rows:
        fits = {True: "fits", False: "does not fit", None: "fit unknown"}[row["fits"]]
        if row["hours"]:
            time = f"{_duration(row['hours'][0])} to {_duration(row['hours'][1])}"
        elif row["hours_at_peak"]:
            time = f"at least {_duration(row['hours_at_peak'])} (100% of peak, no measured fraction)"
        else:
            time = "no time: " + row["why_no_time"].split(" (", 1)[0].removeprefix("time not forecast: ")
        cost = ""
        if row["cost_usd"]:
            low, high = row["cost_usd"]
            span = f"${low:,.2f} to ${high:,.2f}" if row["hours"] else f"at least ${low:,.2f}"
            cost = f", {span}" + (f" ({row['price']['date']})" if row["price"].get("date") else "")
        lines.append(f"    {row['card']:14} {row['memory_gib']:>6g} GiB  {fits:12}  {time}{cost}")
    return lines


def _budget() -> float:
    from ..rules.memory_fit import BUDGET

    return BUDGET
