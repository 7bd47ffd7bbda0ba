"""``check --cards``'s "faster settings": changes to the config that make this run faster, each with its forecast.

- Gradient checkpointing off (``disable_gradient_checkpointing: true``) where the memory estimate says it
  still fits the card: the run's FLOPs less the recompute the FLOP count told apart (flops.py), its memory
  from lf/memory.py's estimate of the changed config. An upper bound of the FLOPs, said as "at most": without
  checkpointing LLaMA-Factory also leaves the embedding's output without a gradient
  (``enable_input_require_grads`` is for checkpointing), so the first layer's input gradients are not
  computed either (1.2% of a tiny LoRA step's FLOPs; tests/test_forecast_cards.py checks the bound against
  the check of the changed config).
- Packing (``packing: true``) where padding is a large share of the tokens: its forecast needs LLaMA-Factory's
  packing of the rows (how many packed rows its knapsack makes), which only a dry run of the changed config
  has, so the line names the share and the command that forecasts it; no figure is made up.
- A larger batch is not listed: under the FLOP model (peak x achieved fraction) it changes no time, and the
  speed-up a larger batch brings on a real card is the kind of figure only ``--measure`` on that card gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .run import Forecast, _duration, _time_and_cost

PADDING_WORTH_PACKING = 0.2  # this package's threshold for saying so, not a published figure


def faster_settings(forecast: Forecast, config: Mapping[str, Any], price: float | None) -> list[dict[str, Any]]:
    """The changes that make this run faster, each with what is known of its time, memory and cost."""
    from ..lf.memory import estimate_config
    from ..machine.catalogue import load_catalogue
    from ..rules.memory_fit import BUDGET

    changes: list[dict[str, Any]] = []
    step = forecast.found_step
    checkpointing = not config.get("disable_gradient_checkpointing", False)
    if checkpointing and step is not None and step.recompute and forecast.run_flops:
        changed_config = {**config, "disable_gradient_checkpointing": True}
        estimate = estimate_config(changed_config, forecast.gpus)
        found = load_catalogue().gpu(forecast.card.alias) if forecast.card is not None else None
        memory = found[0].vram_gib if found is not None else None
        fits = None if estimate is None or memory is None else estimate.total_gib <= BUDGET * memory
        changed = dataclasses.replace(
            forecast,
            run_flops=forecast.run_flops * (step.total - step.recompute) / step.total,
            notes=[],
            hours=None,
            hours_at_peak=None,
            fraction=None,
            price=None,
            cost=None,
        )
        _time_and_cost(changed, price)
        changes.append(
            {
                "change": {"disable_gradient_checkpointing": True},
                "why": f"the recompute is {step.recompute / step.total:.0%} of the FLOPs",
                "bound": "at most: the FLOPs less the recompute",
                "run_flops": changed.run_flops,
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


def faster_lines(changes: list[dict[str, Any]]) -> list[str]:
    if not changes:
        return ["  faster settings: none found (checkpointing is off or adds nothing; padding is small)"]
    lines = ["  faster settings:"]
    for change in changes:
        (key, value), *_ = change["change"].items()
        what = f"{key}: {str(value).lower()} ({change['why']})"
        if "forecast_with" in change:
            lines.append(f"    {what}: forecast it with `{change['forecast_with']}` (LLaMA-Factory's packing)")
            continue
        if change["hours"]:
            time = f"at most {_duration(change['hours'][0])} to {_duration(change['hours'][1])}"
        elif change["hours_at_peak"]:
            time = f"at most the time at 100% of peak, {_duration(change['hours_at_peak'])}"
        else:
            time = f"at most {change['run_flops']:.3g} FLOPs (no time on this card)"
        fits = {True: "fits", False: "does NOT fit", None: "fit unknown"}[change["fits"]]
        memory = f"{change['peak_gib']:.1f} GiB estimated peak, {fits}" if change["peak_gib"] else fits
        cost = f", at most ${change['cost_usd'][0]:,.2f} to ${change['cost_usd'][1]:,.2f}" if change["cost_usd"] else ""
        lines.append(f"    {what}: {time}{cost}; {memory}")
    return lines
