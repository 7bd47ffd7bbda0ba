"""Every line a forecast is said in, from the forecast as data (forecast/run.py ``Forecast.as_json``, or
NoForecast's ``{"made": false, "why"}``): the answer first (one line: time band and cost on the card), check's
forecast block with each figure's source (``block_lines``: check/render.py), its --measure, --rate-from and
--cards parts, the ``presets list --forecast`` table (``table_lines``: cli/presets_cmd.py) and the training
summary's forecast rows beside what the run measured (``summary_rows``, ``time_said``: train/summary.py).
LlamaBoard shows the check's text. The one module that words a forecast: a span of time or dollars, a lower
bound, and why there is no time are said the same way everywhere."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..console import duration
from ..rules.memory_fit import BUDGET
from .cards import peak_kind


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


def block_lines(f: Mapping[str, Any]) -> list[str]:
    """check --forecast's block: the answer, then each figure with where it comes from."""
    if f.get("made") is False:
        return [f"forecast: not made: {f['why']}"]
    w = f["work"]
    about = "" if w["exact"] else "about "
    rows = f"{w['rows']:,} rows the steps read from the stream" if w["streamed"] else f"{about}{w['rows']:,} train rows"
    lines = [
        f"forecast: {answer_line(f)}",
        "  how (docs/forecast.md):",
        f"  steps: {about}{w['steps']:,} optimizer steps: {rows}, {w['batches_per_rank_per_epoch']:,} batches "
        f"of {w['per_device_train_batch_size']} per rank x {w['world_size']} rank(s) an epoch, accumulation "
        f"{w['gradient_accumulation_steps']}, {w['epochs']} epoch(s) "
        "(transformers' Trainer.set_initial_training_values)",
    ]
    if w["rows_scaled_from"] is not None:
        scaled = w["rows_scaled_from"]
        lines.append(
            f"  rows estimated: LLaMA-Factory's pipeline made {scaled['made']:,} train rows of the "
            f"{scaled['of_rows_read']:,} it read here, scaled to the full {scaled['full_split_rows']:,} (packing, "
            "or rows it dropped, depends on the rows not read)"
        )
    t = f["tokens"]
    if t is not None:
        if t["exact"] and w["streamed"]:
            how = "exact (the stream's first rows, in the order the run's dataloader reads them)"
        elif t["exact"]:
            how = "exact (unshuffled)"
        elif t["shuffled"]:
            how = f"expected over the shuffled batches, one sd {t['spread']:,.0f}"
        else:  # the file's own order, but only a sample's rows read: their batches are taken as random ones
            how = (
                f"expected as if the sample's rows met at random (unshuffled, not all read), one sd {t['spread']:,.0f}"
            )
        read = f"a sample of {t['lengths_read']:,} rows" if t["lengths_sampled"] else f"all {t['lengths_read']:,} rows"
        # from the counts, not the JSON's share rounded to 4 places, which can move a boundary's tenth of a percent
        padding = 1 - t["not_padding"] / t["total"] if t["total"] else 0.0
        lines.append(
            f"  tokens: {t['total']:,} with padding ({padding:.1%} padding), {t['per_step']:,.0f} a step; "
            f"{how}; lengths of {read} as LLaMA-Factory tokenized them"
        )
    if f["model_files"] is not None:
        lines.append(f"  model files: {f['model_files']['line']}")
    if f["run_flops"] is not None:
        lines.append(
            f"  FLOPs: {f['run_flops']:.3g} for the run (torch's FlopCounterMode on the model built on the meta "
            "device, one micro-batch scaled to the run's batches; --json has the parts)"
        )
    card = f["card"]
    if card is not None and card["peak_tflops"]:
        lines.append(
            f"  card: {card['alias']} x {f['gpus']}, peak dense bf16 {card['peak_tflops']:g} TFLOPS "
            f"({peak_kind(card['peak_source'], card['peak_date'])}; docs/rocm-facts.md#a3, --json has the whole "
            "source)"
        )
    fr = f["achieved_fraction"]
    if f["hours"] is not None and fr is not None:
        lines.append(
            f"  time: {hours_span(f['hours'])} at {fr['fraction_low']:.0%}-"
            f"{fr['fraction_high']:.0%} of peak ({fr['label']}, {fr['date']}; docs/forecast.md#achieved)"
        )
    elif f["hours_at_peak"] is not None:
        lines.append(f"  time: {at_least(f['hours_at_peak'])} (at 100% of peak: no measured fraction)")
    p = f["price"]
    if f["cost_usd"] is not None and p is not None:
        rate = f"${p['low']:g}" if p["low"] == p["high"] else f"${p['low']:g}-{p['high']:g}"
        said = f"{p.get('label', p['source'])}, {p['date']}" if p.get("date") else p["source"]
        lines.append(f"  cost: {usd_span(f['cost_usd'])} at {rate} per GPU-hour ({said})")
    if f.get("measured") is not None:  # check --measure
        lines.extend(measured_lines(f["measured"]))
    c = f.get("carried")
    if c is not None:  # check --rate-from FILE
        if not c["made"]:
            lines.append(f"  time there: not made: {c['why']}")
        else:
            said = " + ".join(text for text, _ in c["run_seconds_parts"])
            lines.append(
                f"  time there ({c['device']}, measured {c['date']} by the check --measure in {c['from']}): {said} "
                f"= {duration(c['run_seconds'])} (the trainer's loop; saves, evaluations and epoch starts not included)"
            )
            if c.get("size_note"):
                lines.append(f"  less sure: {c['size_note']}")
    lines.extend(f"  note: {note}" for note in f["notes"])
    if f.get("cards") is not None:  # check --cards
        lines.extend(card_lines(f["cards"]["rows"], f["cards"]["peak_gib"], f["gpus"]))
        lines.extend(faster_lines(f.get("faster_settings") or []))
    return lines


def measured_lines(measured: Mapping[str, Any]) -> list[str]:
    """The human lines of the measured block (under the check's forecast)."""
    if not measured.get("made"):
        return [f"  measured: not made: {measured['why']}"]
    shown = ", ".join(f"{t:.3g}" for t in measured["step_seconds"][:8])
    more = ", ..." if len(measured["step_seconds"]) > 8 else ""
    lines = [
        f"  measured on this machine ({measured['device']}), {measured['date']}: {measured['timed_steps']} timed "
        f"step(s) after the first of {measured['steps_run']} run by LLaMA-Factory's trainer in a throwaway folder: "
        f"{measured['seconds_per_step']:.3g} s a step ({shown}{more})",
        f"  time here: {' + '.join(text for text, _ in measured['run_seconds_parts'])} = "
        f"{duration(measured['run_seconds'])} (the trainer's loop; model loading and data processing not included)",
    ]
    low, high = measured["run_seconds_band"]
    share = measured.get("cpu_share")
    loaded = (
        f"; the measuring process ran on the CPU {share:.0%} of the time it took, other processes the rest"
        if share and share < 0.9
        else ""
    )
    lines.append(
        f"  uncertain: {seconds_span(low, high)} at the fastest and the slowest timed step{loaded}; a run "
        "that meets another load on this machine takes longer or shorter"
    )
    if measured.get("model_why") and measured.get("model") == "seconds a step":  # carried as they are
        lines.append(f"  overhead not told apart from the FLOPs: {measured['model_why']}")
    elif measured.get("model_why"):  # one rate for all FLOPs
        lines.append(f"  attention's rate not told apart: {measured['model_why']}")
    if measured.get("achieved_flops_per_s"):
        lines.append(
            f"  achieved rate: {measured['achieved_flops_per_s']:.3g} FLOP/s measured on this machine, "
            f"{measured['date']} (FLOPs of the timed steps' {measured['timed_tokens']:,} tokens, padding included, "
            "/ their time)"
        )
    return lines


def card_lines(rows: list[dict], peak_gib: float | None, gpus: int) -> list[str]:
    """The human table under the forecast block."""
    memory = f"{peak_gib:.1f} GiB estimated peak per device" if peak_gib is not None else "memory not estimated"
    lines = [f"  cards (x {gpus}, cheapest first; {memory}, fits = within {BUDGET:.0%} of the card's memory):"]
    for row in rows:
        fits = {True: "fits", False: "does not fit", None: "fit unknown"}[row["fits"]]
        if row["hours"]:
            time = hours_span(row["hours"])
        elif row["hours_at_peak"]:
            time = f"{at_least(row['hours_at_peak'])} (100% of peak, no measured fraction)"
        else:
            # "no peak dense bf16 figure for mi50 (none published by AMD: <source>)": the reason, not the source
            head, _, reason = row["why_no_time"].removeprefix("time not forecast: ").partition(" (")
            reason = reason.split(":", 1)[0].rstrip(")")
            time = f"no time: {head}" + (f" ({reason})" if reason else "")
        cost = ""
        if row["cost_usd"]:
            span = usd_span(row["cost_usd"], banded=bool(row["hours"]))
            cost = f", {span}" + (f" ({row['price']['date']})" if row["price"].get("date") else "")
        lines.append(f"    {row['card']:14} {row['memory_gib']:>6g} GiB  {fits:12}  {time}{cost}")
    return lines


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
            time = f"at most {hours_span(change['hours'])}"
        elif change["hours_at_peak"]:
            time = f"at most the time at 100% of peak, {duration(change['hours_at_peak'] * 3600)}"
        else:
            time = f"at most {change['run_flops']:.3g} FLOPs (no time on this card)"
        fits = {True: "fits", False: "does NOT fit", None: "fit unknown"}[change["fits"]]
        memory = f"{change['peak_gib']:.1f} GiB estimated peak, {fits}" if change["peak_gib"] else fits
        cost = f", at most {usd_span(change['cost_usd'])}" if change["cost_usd"] else ""
        lines.append(f"    {what}: {time}{cost}; {memory}")
    return lines


def table_lines(forecasts: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """``presets list --forecast``: each preset's answer (time and cost on its target card, then its work) in a
    table; what the figures rest on below it, once per kind."""
    lines = [f"{'NAME':28} {'ON':14} {'TIME':28} {'COST':18} WORK"]
    bases: list[str] = []
    for name, forecast in forecasts:
        found = answer(forecast)
        if found is None:
            lines.append(f"{name:28} {'-':14} not made: {forecast['why']}")
            continue
        mark = ""
        if found.basis:
            if found.basis not in bases:
                bases.append(found.basis)
            mark = f" [{bases.index(found.basis) + 1}]"
        cost = found.cost or "unknown (--price)"
        lines.append(f"{name:28} {found.where:14} {found.short_time:28} {cost:18} {found.work}{mark}")
    for n, said in enumerate(bases, 1):
        lines.append(f"[{n}] {said}: the model is not here (check --forecast PRESET says why and how to fetch it)")
    lines.append(
        "\nTime: the forecast's FLOPs at the card's achieved fraction of its peak, or, 'at peak', at 100% of its peak "
        "where no fraction is published (a lower bound); each figure's source and date: llamafactory-rocm check "
        "PRESET --forecast"
    )
    return lines


NO_TIME = "no time was forecast (the launch record's forecast notes say why)"


def time_said(f: Mapping[str, Any]) -> dict[str, Any]:
    """The forecast's time for the run with its source (forecast/cards.py ``time_and_cost``), or why there is
    none: the training summary's row and its launch record's ``"run"`` block."""
    card, fraction = f.get("card") or {}, f.get("achieved_fraction")
    kind = peak_kind(card.get("peak_source"), card.get("peak_date"))
    peak = f"peak dense bf16 {card.get('peak_tflops')} TFLOPS ({kind}; docs/rocm-facts.md#a3)"
    where = f"{card.get('alias')} x {f.get('gpus')}, {peak}"
    if f.get("hours") and fraction:
        low, high = f["hours"]
        return {
            "seconds": [low * 3600, high * 3600],
            "source": f"{where} x {fraction['fraction_low']:.0%}-{fraction['fraction_high']:.0%} achieved "
            f"({fraction['label']}, {fraction['date']})",
        }
    if f.get("hours_at_peak"):
        return {
            "at_least_seconds": f["hours_at_peak"] * 3600,
            "source": f"{where} at 100% of peak: no measured fraction for this card",
        }
    return {"none": why_no_time(f.get("notes") or ()) or NO_TIME}


def summary_rows(said: Mapping[str, Any], resumed_from: int | None) -> list[tuple[str, str]]:
    """The training summary's forecast rows, each figure beside what the run measured: steps and tokens, then
    time (``said``: train/summary.py ``beside_forecast``, the launch record's ``"run"`` block)."""
    if not said["made"]:
        return [("forecast", f"none: {said['why']}")]
    whole = " for the whole run" if resumed_from else ""  # the forecast counts from step 0
    about = "" if said["steps_exact"] else "about "
    step = said["global_step"] if said["global_step"] is not None else "not known"
    work = f"{about}{said['steps']:,} steps{whole} (global_step {step})"
    if said["tokens_with_padding"] is not None:
        counted = f"counted {said['tokens_counted']:,}" if said["tokens_counted"] else "not counted by the trainer"
        work += f", {said['tokens_with_padding']:,} tokens with padding ({counted})"
    rows = [("forecast", f"{work}: the check before launch")]
    when = said["time"]
    train_s = said["train_runtime_s"]
    trained = "" if train_s is None else f" (trained {duration(train_s)})"
    if "seconds" in when:
        low, high = when["seconds"]
        rows.append(("forecast time", f"{seconds_span(low, high)}{trained}: {when['source']}"))
    elif "at_least_seconds" in when:
        rows.append(("forecast time", f"{at_least(when['at_least_seconds'] / 3600)}{trained}: {when['source']}"))
    else:
        rows.append(("forecast time", f"none for this machine (the check's forecast: {when['none']})"))
    return rows
