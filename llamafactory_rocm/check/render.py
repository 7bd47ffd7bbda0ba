"""Human-readable output: snapshot summary, findings, the resolved config as a diff, and the forecast (its
figures made in forecast/, all its lines said here)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..console import duration
from ..findings import Level
from ..forecast.answer import answer_line, at_least, hours_span, seconds_span, usd_span
from ..forecast.cards import peak_kind
from ..machine.snapshot import Snapshot
from ..rules.memory_fit import BUDGET
from .run import Report

_ORDER = {Level.ERROR: 0, Level.WARNING: 1, Level.CHANGE: 2, Level.INFO: 3}


def snapshot_summary(snap: Snapshot) -> list[str]:
    t = snap.torch
    build = {"rocm": f"ROCm (HIP {t.hip})", "cuda": f"CUDA {t.cuda}", "cpu": "CPU only", "missing": "missing"}
    lines = [f"machine: {snap.source}; torch {t.version or '-'} {build[t.kind]}"]
    if snap.devices:
        for d in snap.devices:
            lines.append(f"  gpu {d.index}: {d.name}, {d.arch_name} (base {d.base_arch}), {d.total_memory_gib:.1f} GiB")
    else:
        lines.append("  no GPU visible to torch")
    if t.kind == "rocm":
        lines.append(f"  torch built for: {', '.join(t.base_arch_list) or '-'}")
    if snap.kfd_targets:
        lines.append(f"  KFD targets: {', '.join(snap.kfd_targets)}")
    for key in ("PYTORCH_ROCM_ARCH", "HSA_OVERRIDE_GFX_VERSION", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        if key in snap.env:
            lines.append(f"  {key}={snap.env[key]}")
    return lines


def _scalar(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def config_diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    lines = []
    for key in list(dict.fromkeys([*before, *after])):
        if key in before and key not in after:
            lines.append(f"- {key}: {_scalar(before[key])}")
        elif key not in before:
            lines.append(f"+ {key}: {_scalar(after[key])}")
        elif before[key] != after[key]:
            lines.append(f"- {key}: {_scalar(before[key])}")
            lines.append(f"+ {key}: {_scalar(after[key])}")
    return lines


def report_text(report: Report) -> str:
    lines = snapshot_summary(report.snapshot)
    findings = sorted(report.findings, key=lambda f: _ORDER[f.level])
    lines.append("")
    lines.append(f"findings ({len(findings)}):" if findings else "findings: none")
    lines.extend(f"  {f.line()}" for f in findings)
    diff = config_diff(report.input_config, report.config)
    env_diff = [f"+ env {k}={v}" for k, v in report.resolution.env_changes.items()]
    lines.append("")
    if diff or env_diff:
        lines.append("resolved config (diff against the input):")
        lines.extend(f"  {line}" for line in diff + env_diff)
    else:
        lines.append("resolved config: unchanged")
    if report.forecast is not None:  # check --forecast
        lines.append("")
        lines.extend(forecast_lines(report.forecast))
    verdict = "ok: ready to launch" if report.ok else "refused: fix the errors above"
    lines.append("")
    lines.append(verdict)
    return "\n".join(lines)


def forecast_lines(f: Any) -> list[str]:
    """The forecast block (check --forecast, forecast/run.py Forecast or NoForecast), all its lines said here:
    each figure with where it comes from."""
    if getattr(f, "why", None) is not None:  # NoForecast
        return [f"forecast: not made: {f.why}"]
    w = f.work
    about = "" if w.rows_scaled is None else "about "
    rows = f"{w.rows:,} rows the steps read from the stream" if w.streamed else f"{about}{w.rows:,} train rows"
    lines = [
        f"forecast: {answer_line(f.as_json())}",
        "  how (docs/forecast.md):",
        f"  steps: {about}{w.steps:,} optimizer steps: {rows}, {w.batches_per_rank:,} batches "
        f"of {w.per_device_batch} per rank x {w.world_size} rank(s) an epoch, accumulation {w.accumulation}, "
        f"{w.epochs} epoch(s) (transformers' Trainer.set_initial_training_values)",
    ]
    if w.rows_scaled is not None:
        made, read, full = w.rows_scaled
        lines.append(
            f"  rows estimated: LLaMA-Factory's pipeline made {made:,} train rows of the {read:,} it read here, "
            f"scaled to the full {full:,} (packing, or rows it dropped, depends on the rows not read)"
        )
    t = f.tokens
    if t is not None:
        if t.exact and w.streamed:
            how = "exact (the stream's first rows, in the order the run's dataloader reads them)"
        elif t.exact:
            how = "exact (unshuffled)"
        elif t.shuffled:
            how = f"expected over the shuffled batches, one sd {t.spread:,.0f}"
        else:  # the file's own order, but only a sample's rows read: their batches are taken as random ones
            how = f"expected as if the sample's rows met at random (unshuffled, not all read), one sd {t.spread:,.0f}"
        read = f"a sample of {t.sample_rows:,} rows" if t.sampled else f"all {t.sample_rows:,} rows"
        lines.append(
            f"  tokens: {t.total:,} with padding ({t.padding_share:.1%} padding), {t.per_step:,.0f} a step; "
            f"{how}; lengths of {read} as LLaMA-Factory tokenized them"
        )
    if f.model_files is not None:
        lines.append(f"  model files: {f.model_files['line']}")
    if f.run_flops is not None:
        lines.append(
            f"  FLOPs: {f.run_flops:.3g} for the run (torch's FlopCounterMode on the model built on the meta device, "
            "one micro-batch scaled to the run's batches; --json has the parts)"
        )
    if f.card is not None and f.card.peak_tflops:
        lines.append(
            f"  card: {f.card.alias} x {f.gpus}, peak dense bf16 {f.card.peak_tflops:g} TFLOPS "
            f"({peak_kind(f.card.peak_source, f.card.peak_date)}; docs/rocm-facts.md#a3, --json has the whole source)"
        )
    if f.hours is not None and f.fraction is not None:
        fr = f.fraction
        lines.append(
            f"  time: {hours_span(f.hours)} at {fr['fraction_low']:.0%}-"
            f"{fr['fraction_high']:.0%} of peak ({fr['label']}, {fr['date']}; docs/forecast.md#achieved)"
        )
    elif f.hours_at_peak is not None:
        lines.append(f"  time: {at_least(f.hours_at_peak)} (at 100% of peak: no measured fraction)")
    if f.cost is not None and f.price is not None:
        p = f.price
        rate = f"${p['low']:g}" if p["low"] == p["high"] else f"${p['low']:g}-{p['high']:g}"
        said = f"{p.get('label', p['source'])}, {p['date']}" if p.get("date") else p["source"]
        lines.append(f"  cost: {usd_span(f.cost)} at {rate} per GPU-hour ({said})")
    if f.measured is not None:  # check --measure
        lines.extend(measured_lines(f.measured))
    if f.carried is not None:  # check --rate-from FILE
        c = f.carried
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
    lines.extend(f"  note: {note}" for note in f.notes)
    if f.cards is not None:  # check --cards
        lines.extend(card_lines(f.cards, f.peak_gib, f.gpus))
        lines.extend(faster_lines(f.faster or []))
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
