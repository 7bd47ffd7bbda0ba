"""The forecast's answer in one line, said first: how long and how much on the card, from the forecast as data
(forecast/run.py ``Forecast.as_json``, or NoForecast's ``{"made": false, "why"}``). The one place that words
it: check's forecast block (check/render.py) and ``presets list --forecast`` (cli/presets_cmd.py) both say it.
Each figure's source stays in the lines below it (check --forecast) or in --json. Its spans (a band of time, of
dollars, a lower bound) and the reason a forecast has no time are what every other forecast line says them with:
the check's block, its --cards table and faster settings, and the training summary (train/summary.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..console import duration


@dataclass(frozen=True)
class Answer:
    """The answer's parts, for a line or a table's cells."""

    time: str  # "1 h 40 min to 3 h 20 min", "at least 25 min (100% of peak)", or "no time: <why>"
    cost: str  # "$2.50 to $6.60", "at least $0.80", or "" where no price is known
    where: str  # "1 x mi300x"
    work: str  # "57 steps, 269,475 tokens"
    basis: str  # "" or what the figures rest on: "bundled shape, stand-in tokenizer (+1.2%)"
    short_time: str = ""  # the time in a table's cell: a lower bound as "at least 25 min (at peak)"

    def line(self) -> str:
        cost = f", {self.cost}" if self.cost else ", cost unknown (--price USD)"
        basis = f"; {self.basis}" if self.basis else ""
        return f"{self.time} on {self.where}{cost} ({self.work}{basis})"


def answer(forecast: Mapping[str, Any]) -> Answer | None:
    """The answer of a made forecast; None for one not made (its ``why`` is the answer then)."""
    if forecast.get("made") is False:
        return None
    card = forecast.get("card") or {}
    where = f"{forecast['gpus']} x {card['alias']}" if card else f"{forecast['gpus']} GPU(s), no card named"
    hours, at_peak = forecast.get("hours"), forecast.get("hours_at_peak")
    if hours:
        time = short = hours_span(hours)
    elif at_peak:
        time = f"{at_least(at_peak)} (100% of peak, a lower bound)"
        short = f"{at_least(at_peak)} (at peak)"
    else:
        time = short = "no time: " + _why_no_time(forecast)
    cost = usd_span(forecast["cost_usd"], banded=bool(hours)) if forecast.get("cost_usd") else ""
    work = [f"{forecast['work']['steps']:,} steps"]
    if forecast.get("tokens"):
        work.append(f"{forecast['tokens']['total']:,} tokens")
    return Answer(time, cost, where, ", ".join(work), basis(forecast.get("model_files")), short)


def usd(amount: float) -> str:
    """Dollars to the cent, or in three figures from a billion (a run of 1e30 epochs is said, not spelled)."""
    return f"${amount:,.2f}" if amount < 1e9 else f"${amount:.3g}"


def usd_span(cost: Sequence[float], banded: bool = True) -> str:
    """A cost band, "$2.50 to $6.60"; where the time is a lower bound (at peak), "at least $0.80"."""
    return f"{usd(cost[0])} to {usd(cost[1])}" if banded else f"at least {usd(cost[0])}"


def seconds_span(low: float, high: float) -> str:
    return f"{duration(low)} to {duration(high)}"


def hours_span(hours: Sequence[float]) -> str:
    """A time band given in hours ("2.50 h to 4.80 h"), each end as ``console.duration`` says it."""
    return seconds_span(hours[0] * 3600, hours[1] * 3600)


def at_least(hours: float) -> str:
    return f"at least {duration(hours * 3600)}"


def why_no_time(notes: Iterable[str]) -> str | None:
    """Why a forecast has no time, from its notes (forecast/cards.py ``time_and_cost`` and forecast/run.py write
    them): the first that says so, without its "time not forecast: " prefix; None where none does."""
    said = next((str(n) for n in notes if str(n).startswith(("time not forecast: ", "FLOPs not counted"))), None)
    return None if said is None else said.removeprefix("time not forecast: ")


def basis(model_files: Mapping[str, Any] | None) -> str:
    """What the figures rest on where the model's own files were not here (lf/model_files.py ModelFiles)."""
    if not model_files or model_files.get("how") != "standin":
        return ""
    if model_files.get("tokenizer_exact"):
        return "its bundled shape and its family's own tokenizer"
    error = model_files.get("tokenizer_error")
    return "its bundled shape; tokens by a stand-in tokenizer" + (f", {error.split(' (')[0]}" if error else "")


def _why_no_time(forecast: Mapping[str, Any]) -> str:
    said = why_no_time(forecast.get("notes") or ())
    return "see the notes (check --forecast)" if said is None else said.split(" (", 1)[0]


def answer_line(forecast: Mapping[str, Any]) -> str:
    """One line: the time band and cost on the card(s), or why no forecast was made."""
    found = answer(forecast)
    return f"not made: {forecast['why']}" if found is None else found.line()


__all__ = [
    "Answer",
    "answer",
    "answer_line",
    "at_least",
    "basis",
    "hours_span",
    "seconds_span",
    "usd",
    "usd_span",
    "why_no_time",
]
