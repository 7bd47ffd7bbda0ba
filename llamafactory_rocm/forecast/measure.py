"""``check --measure N``: N real optimizer steps of LLaMA-Factory's own trainer on this machine's device, timed,
and the whole run forecast from them.

The steps run in a child process: stock ``llamafactory.train.tuner.run_exp`` on the checked config (the check's
rewrites and environment included, as a launch would run it) with ``max_steps`` N and ``output_dir`` a
throwaway temporary folder removed afterwards; the user's ``output_dir`` is never touched. The package's hook
is off in the child (``LLAMAFACTORY_ROCM=0``: the config was just checked, and the hook would check it again).
A transformers ``TrainerCallback`` in the child takes a timestamp at each of the trainer's events
(``on_train_begin``, where the trainer's own ``train_runtime`` starts its clock; each epoch's and step's begin
and end; each log, evaluation and save). The first step is not timed: it holds the warm-up (allocator,
kernels, the dataloader's first batch); the steps after it give seconds a step (their median: one step slowed
by another process on a shared machine moves it little).

A step's time is taken as a fixed part plus parts that grow with its FLOPs: ``overhead + FLOPs / rate +
attention FLOPs / attention rate``. On a small model the fixed part (Python, kernel launches, the optimizer's
update, the data loader) is most of a step and one FLOP rate would not carry to another batch; and the
attention kernels' FLOPs (which grow with the square of the length) run at a rate of their own, so one rate
would not carry to another length either (bench/bench_forecast_wall.py: one rate fitted at cutoff 128 put a
cutoff-1024 run 46% long). So after the trainer's steps the child times forward + backward passes of one real
batch of the run at three shapes: all its rows, its first row, and its first rows (up to 4) end to end as one
row (the same kind of tokens, more attention a token). The three give the two rates and the overhead a
forward + backward (``fitted_rates``), and the overhead a step is what the trainer's steps took beyond them.

The run's time = steps x overhead + the run's FLOPs at their rates (the check's forecast: lf/work.py's steps,
tokens.py's padded tokens and squared lengths) + the first step's warm-up + each save, evaluation and later
epoch start the run will make (counted by transformers' own ``DefaultFlowCallback`` over the run's steps, each
costed as the measuring run's own took). Where the end-to-end row could not run or noise hides attention's
share, one rate stands for all FLOPs, and the block says so; where the shapes give no slope at all (one row a
batch, a stage whose batch is not a causal-LM batch, timings that noise reverses) the run's time is steps x
seconds a step, and the block says so.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Keys the measuring run sets whatever the config says: its own folder, N steps, no reporting to a tracker
# or the Hub, no resume from the user's checkpoint (the steps are timed from a fresh start), no prediction
# after training (not in the trainer's train_runtime); and the trainer's token count, for the achieved rate.
_MEASURING_RUN = {
    "report_to": "none",
    "push_to_hub": False,
    "plot_loss": False,
    "do_predict": False,
    "overwrite_output_dir": True,
    "include_num_input_tokens_seen": True,
}
_DROPPED = ("resume_from_checkpoint", "hub_model_id")
EVAL_LOG = "eval_log"  # the clock's name for the log line of an evaluation's metrics
_CHILD_ENV_DROPPED = ("FORCE_TORCHRUN", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LLAMAFACTORY_ROCM_CHECKED")
# forward + backward passes timed at each of the two shapes after the trainer's steps (their median is taken)
_SHAPE_PASSES = 2


@dataclass(frozen=True)
class StepTimes:
    """What the measuring run's clock saw (child process, perf_counter seconds)."""

    begin: float  # on_train_begin
    ends: tuple[float, ...]  # on_step_end of each step, in order
    tokens_seen: tuple[int, ...]  # the trainer's num_input_tokens_seen at each step's end
    device: str
    # every event as (name, perf_counter): begin, epoch_begin, step_begin, step_end, log, evaluate, save, ...
    events: tuple[tuple[str, float], ...] = ()
    # forward + backward of one batch of the run: (kind, rows, length, seconds) of each timed pass, kind
    # "batch" (all its rows), "row" (its first row), "end to end" (its first rows as one row: _shapes)
    shapes: tuple[tuple[str, int, int, float], ...] = ()
    shapes_why: str | None = None  # why no shapes, or no end-to-end row, were timed
    # what transformers' DefaultFlowCallback makes the real run do over its steps: saves, evaluations
    run_events: Mapping[str, int] = field(default_factory=dict)
    cpu_share: float | None = None  # process CPU seconds / wall seconds over the timed steps (CPU devices)
    micro_batches: tuple[int, ...] = ()  # the forward + backward passes of each step, in order
    eval_runtimes: tuple[float, ...] = ()  # transformers' own eval_runtime of each evaluation (its loop only)

    @property
    def timed(self) -> tuple[float, ...]:
        """The seconds of each step after the first."""
        return tuple(b - a for a, b in zip(self.ends, self.ends[1:], strict=False))

    @property
    def timed_tokens(self) -> tuple[int, ...]:
        """The tokens (padding included) of each step after the first, as the trainer counted them."""
        return tuple(b - a for a, b in zip(self.tokens_seen, self.tokens_seen[1:], strict=False))

    def durations(self, name: str) -> list[float]:
        """Seconds each ``name`` event took: from the event before it (a save's is the checkpoint written). An
        evaluation logs its metrics before ``on_evaluate`` (transformers' ``Trainer.evaluate``): its time runs
        from the event before that log line, so it holds the eval dataloader, the loop and the metrics."""
        found = []
        for i, (event, at) in enumerate(self.events):
            if event != name or i == 0:
                continue
            before = i - 1
            while before > 0 and self.events[before][0] == EVAL_LOG:
                before -= 1
            found.append(at - self.events[before][1])
        return found

    def epoch_start(self) -> float | None:
        """What starting an epoch costs beyond a step's usual batch fetch: from ``on_epoch_begin`` to the first
        ``on_step_begin`` (the dataloader's iterator made, the first batches fetched) less the median gap from
        a step's end to the next one's begin (the fetch alone)."""
        names = [n for n, _ in self.events]
        if "epoch_begin" not in names:
            return None
        i = names.index("epoch_begin")
        first = next((t for n, t in self.events[i:] if n == "step_begin"), None)
        gaps = [
            b - a
            for (na, a), (nb, b) in zip(self.events, self.events[1:], strict=False)
            if na == "step_end" and nb == "step_begin"
        ]
        if first is None or not gaps:
            return None
        return max(first - self.events[i][1] - statistics.median(gaps), 0.0)


@dataclass(frozen=True)
class NotMeasured:
    why: str

    def as_json(self) -> dict[str, Any]:
        return {"made": False, "why": self.why}


def measuring_config(config: Mapping[str, Any], steps: int, output_dir: str) -> dict[str, Any]:
    """The checked config as the measuring run takes it: ``steps`` optimizer steps into ``output_dir``."""
    run = {k: v for k, v in config.items() if k not in _DROPPED}
    run.update(_MEASURING_RUN, max_steps=steps, output_dir=output_dir)
    if run.get("save_strategy", "steps") == "best":  # needs an eval metric every save; no save is needed here
        run["save_strategy"] = "no"
    return run


def run_steps(
    config: Mapping[str, Any], env_changes: Mapping[str, str], steps: int, work: Any = None
) -> StepTimes | NotMeasured:
    """``steps`` optimizer steps of stock ``run_exp`` on ``config`` in a child process, timed; ``work`` (lf/work.py
    Work) is the real run's, whose saves and evaluations the child counts. The throwaway folder (the run's
    output_dir and the clock's file) is removed whatever happens."""
    folder = Path(tempfile.mkdtemp(prefix="lfr-measure-"))
    try:
        config_file, clock_file, log_file = folder / "config.json", folder / "clock.json", folder / "run.log"
        run = {"steps": work.steps, "epochs": work.epochs, "steps_per_epoch": work.steps_per_epoch} if work else {}
        config_file.write_text(
            json.dumps({"config": measuring_config(config, steps, str(folder / "output")), "run": run}, default=str)
        )
        env = {k: v for k, v in os.environ.items() if k not in _CHILD_ENV_DROPPED}
        env.update(env_changes)
        env["LLAMAFACTORY_ROCM"] = "0"  # the config was just checked; the hook would check it again
        with log_file.open("w", encoding="utf-8") as log:
            done = subprocess.run(
                [sys.executable, "-m", __name__, str(config_file), str(clock_file)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        if done.returncode != 0 or not clock_file.is_file():
            tail = [line for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines() if line]
            last = tail[-1][:300] if tail else "no output"
            return NotMeasured(f"LLaMA-Factory's trainer stopped (exit {done.returncode}): {last}")
        clock = json.loads(clock_file.read_text(encoding="utf-8"))
        return StepTimes(
            clock["begin"],
            tuple(clock["ends"]),
            tuple(clock["tokens_seen"]),
            clock["device"],
            events=tuple((n, t) for n, t in clock["events"]),
            shapes=tuple((str(kind), int(rows), int(length), float(s)) for kind, rows, length, s in clock["shapes"]),
            shapes_why=clock["shapes_why"],
            run_events=clock["run_events"],
            cpu_share=clock["cpu_share"],
            micro_batches=tuple(clock["micro_batches"]),
            eval_runtimes=tuple(clock["eval_runtimes"]),
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class Rates:
    """What the shapes' forward + backward passes give (``fitted_rates``)."""

    flops_per_s: float  # of the FLOPs that grow with the tokens
    attention_flops_per_s: float  # of the attention kernels' FLOPs (flops_per_s where not told apart)
    pass_seconds: float  # a forward + backward's time beyond its FLOPs: the overhead a micro-batch
    apart: bool  # attention's rate was told apart by the end-to-end shape
    why: str | None = None  # where not: why

    def seconds(self, flops: float, attention: float) -> float:
        """The time of ``flops`` FLOPs of which ``attention`` are the attention kernels'."""
        return (flops - attention) / self.flops_per_s + attention / self.attention_flops_per_s


def _spread(seconds: Sequence[float]) -> float:
    return max(seconds) - min(seconds)


def fitted_rates(shapes: Sequence[tuple[str, int, int, float]], step: Any) -> Rates | None:
    """The rates and the overhead a pass from the shapes' forward + backward (their median time each; ``step``:
    flops.py StepFlops, whose parts give each shape's FLOPs at its rows and length). With the end-to-end shape,
    time = overhead + FLOPs / rate + attention FLOPs / attention rate solved on the three; else (or where the
    end-to-end row's time is within the noise of its own and the row's passes, no attention FLOPs were
    counted, or the solve gives a rate at or below 0) one rate, the slope from the first row to all rows. None
    where there is no slope: no second shape, or all rows' time within the spread of the batch's or the row's
    own passes (noise: a difference near 0 would make any rate)."""
    by_kind: dict[str, tuple[int, int, list[float]]] = {}
    for kind, rows, length, seconds in shapes:
        by_kind.setdefault(kind, (rows, length, []))[2].append(seconds)
    if "batch" not in by_kind or "row" not in by_kind:
        return None
    timed = {}
    for kind, (rows, length, seconds) in by_kind.items():
        linear, attention = step.parts(rows * length, rows * length * length)
        timed[kind] = (linear, attention, statistics.median(seconds))
    (a_row, b_row, t_row), (a_all, b_all, t_all) = timed["row"], timed["batch"]
    spread = max(_spread(by_kind["batch"][2]), _spread(by_kind["row"][2]))
    if t_all - t_row <= spread:
        return None
    rate = ((a_all + b_all) - (a_row + b_row)) / (t_all - t_row)
    one = Rates(rate, rate, max(t_row - (a_row + b_row) / rate, 0.0), apart=False)
    if "end to end" not in timed:
        return one
    a_end, b_end, t_end = timed["end to end"]
    # (t - t_row) = (a - a_row) / rate + (b - b_row) / attention rate, for the batch and the end-to-end row
    da1, db1, dt1 = a_all - a_row, b_all - b_row, t_all - t_row
    da2, db2, dt2 = a_end - a_row, b_end - b_row, t_end - t_row
    det = da1 * db2 - da2 * db1
    if not det:
        return dataclasses.replace(one, why="no attention FLOPs counted (no attention kernel torch has a formula "
                                            "for): one rate for all FLOPs")  # fmt: skip
    if dt2 <= max(_spread(by_kind["end to end"][2]), _spread(by_kind["row"][2])):
        return dataclasses.replace(one, why=NOISE_HIDES_ATTENTION)
    per_flop, per_attention = (dt1 * db2 - dt2 * db1) / det, (da1 * dt2 - da2 * dt1) / det
    if per_flop <= 0 or per_attention <= 0:
        return dataclasses.replace(one, why=NOISE_HIDES_ATTENTION)
    overhead = t_row - a_row * per_flop - b_row * per_attention
    return Rates(1 / per_flop, 1 / per_attention, max(overhead, 0.0), apart=True)


NOISE_HIDES_ATTENTION = "the end-to-end row's time did not tell attention's rate apart (noise): one rate for all FLOPs"


def measured_forecast(forecast: Any, times: StepTimes, steps_asked: int) -> dict[str, Any]:
    """The whole run from the timed steps: ``forecast`` is the check's (forecast/run.py Forecast)."""
    timed = times.timed
    if not timed:
        return NotMeasured(
            f"the trainer ran {len(times.ends)} step(s) of the {steps_asked} asked: no step after the first to time "
            "(the run has fewer steps; its time is its own)"
        ).as_json()
    per_step = statistics.median(timed)
    warmup = max((times.ends[0] - times.begin) - per_step, 0.0)
    steps = forecast.work.steps
    result: dict[str, Any] = {
        "made": True,
        "device": times.device,
        "date": datetime.date.today().isoformat(),
        "steps_run": len(times.ends),
        "timed_steps": len(timed),
        "step_seconds": [round(t, 4) for t in timed],
        "seconds_per_step": per_step,
        "warmup_seconds": warmup,
        "run_steps": steps,
        "timed_tokens": None,
        "achieved_flops_per_s": None,
        "cpu_share": times.cpu_share,
    }
    per_token: tuple[float, float] | None = None  # the run's (FLOPs, attention FLOPs) a token
    rates = None
    timed_tokens = sum(times.timed_tokens)
    step = forecast.found_step
    if timed_tokens > 0:
        result["timed_tokens"] = timed_tokens
        # what --rate-from compares another run's micro-batches with (carried_forecast): the timed steps' own
        # micro-batches, as the trainer ran them (an epoch's last step may take fewer than the accumulation)
        micro_batches = sum(times.micro_batches[1:])
        if micro_batches:
            result["micro_batch_tokens"] = timed_tokens / micro_batches
        if step is not None:
            # the timed steps are random batches of the run: the run's own FLOPs per token (attention at its
            # batches' lengths, run.py); the shapes are one batch at its one padded length
            tokens = forecast.tokens
            if forecast.run_flops and tokens and tokens.total:
                per_token = (forecast.run_flops / tokens.total, forecast.run_attention_flops / tokens.total)
            else:
                per_token = (step.per_token(step.length), step.parts(step.length, step.length**2)[1] / step.length)
            result["flops_per_token"] = per_token[0]
            result["achieved_flops_per_s"] = per_token[0] * timed_tokens / sum(timed)
            rates = fitted_rates(times.shapes, step)
    result["shapes"] = [[kind, rows, length, round(s, 4)] for kind, rows, length, s in times.shapes]
    parts: list[tuple[str, float]] = []
    if rates is not None and forecast.run_flops is not None and per_token is not None:
        # each timed step's time less its FLOPs' share at the fitted rates: what a step costs whatever its size
        overhead = statistics.median(
            t - rates.seconds(per_token[0] * k, per_token[1] * k)
            for t, k in zip(timed, times.timed_tokens, strict=True)
        )
        overhead = max(overhead, 0.0)
        result.update(
            marginal_flops_per_s=rates.flops_per_s,
            attention_flops_per_s=rates.attention_flops_per_s,
            overhead_seconds_per_step=overhead,
            # the per-micro-batch part of the overhead: a forward + backward's time beyond its FLOPs
            overhead_seconds_per_micro_batch=min(rates.pass_seconds, overhead / forecast.work.accumulation),
            accumulation=forecast.work.accumulation,
            model=FITTED if rates.apart else ONE_RATE,
        )
        if not rates.apart:  # why: the end-to-end row was not timed (shapes_why), or the fit's
            result["model_why"] = times.shapes_why or rates.why
        parts.append((f"{steps:,} steps x {overhead:.3g} s overhead", steps * overhead))
        parts.append(_flops_part(forecast, rates))
        # the fit (shapes timed after the loop, maybe under another load) must not override the steps it timed
        fitted, low, high = parts[0][1] + parts[1][1], steps * min(timed), steps * max(timed)
        if not low <= fitted <= high:
            which, bound = ("slowest", high) if fitted > high else ("fastest", low)
            result["steps_bound"] = which
            parts[:2] = [
                (f"{steps:,} steps x {bound / steps:.3g} s, the {which} timed step (the fit's overhead + FLOPs "
                 f"gave {fitted:.3g} s, outside the timed steps' {low:.3g}-{high:.3g} s)", bound)
            ]  # fmt: skip
    else:
        if times.shapes_why and not times.shapes:  # no shape was timed
            why = times.shapes_why
        elif per_token is None or forecast.run_flops is None:
            why = "no FLOPs counted for the run or its timed steps (the forecast's notes say why)"
        else:
            why = "the two shapes' times differ less than one shape's passes spread (noise: another process ran)"
        result.update(model="seconds a step", model_why=why)
        parts.append((f"{steps:,} steps x {per_step:.3g} s", steps * per_step))
    parts.append((f"{warmup:.2g} s first-step warm-up", warmup))
    for name, event, said in (("saves", "save", "save"), ("evaluations", "evaluate", "evaluation")):
        count, seen = times.run_events.get(name, 0), times.durations(event)
        result[f"run_{name}"] = count
        if count and seen and event == "evaluate" and len(seen) > 1:
            # the measuring run's two evaluations (``_child``): the first builds the eval dataloader and runs
            # the eval shapes for the first time, as the run's first does; the second is as each later one
            first, later = seen[0], statistics.median(seen[1:])
            result.update(evaluate_seconds=later, first_evaluate_seconds=first)
            result["eval_runtime_seconds"] = statistics.median(times.eval_runtimes[1:] or times.eval_runtimes)
            text = f"{count} {said}(s): the first {first:.2g} s"
            text += f", {count - 1} x {later:.2g} s" if count > 1 else ""
            parts.append((text, first + (count - 1) * later))
        elif count and seen:
            each = statistics.median(seen)
            result[f"{event}_seconds"] = each
            parts.append((f"{count} {said}(s) x {each:.2g} s", count * each))
    epoch_start = times.epoch_start()
    if epoch_start is not None and forecast.work.epochs > 1:
        result["epoch_start_seconds"] = epoch_start
        later = forecast.work.epochs - 1
        parts.append((f"{later} later epoch start(s) x {epoch_start:.2g} s", later * epoch_start))
    result["run_seconds"] = sum(seconds for _, seconds in parts)
    result["run_seconds_parts"] = [[text, seconds] for text, seconds in parts]
    # how uncertain: the steps' part at the fastest and the slowest timed step instead of their median (on a
    # shared machine the load a run meets moves it more than the model's error)
    fit_parts = result["model"] != "seconds a step" and "steps_bound" not in result
    steps_part = parts[0][1] + (parts[1][1] if fit_parts else 0.0)
    rest = result["run_seconds"] - steps_part
    result["run_seconds_band"] = [rest + steps * min(timed), rest + steps * max(timed)]
    return result


def _flops_part(forecast: Any, rates: Rates) -> tuple[str, float]:
    """The run's FLOPs at the fitted rates, said."""
    flops, attention = forecast.run_flops, forecast.run_attention_flops
    if not rates.apart:
        return f"{flops:.3g} FLOPs / {rates.flops_per_s:.3g} FLOP/s", rates.seconds(flops, attention)
    return (
        f"{flops - attention:.3g} FLOPs / {rates.flops_per_s:.3g} FLOP/s + {attention:.3g} attention FLOPs / "
        f"{rates.attention_flops_per_s:.3g} FLOP/s",
        rates.seconds(flops, attention),
    )


# the measured block's models: the FLOPs at two rates, at one, or no rate (seconds a step)
FITTED = "overhead + FLOPs / rate + attention FLOPs / attention rate"
ONE_RATE = "overhead + FLOPs / rate"
# what a measured fit (``measured_forecast``'s block with a rate) carries to another run; a file without
# attention_flops_per_s (written before it was timed apart) carries its one rate for all FLOPs
CARRIED = ("marginal_flops_per_s", "overhead_seconds_per_step", "overhead_seconds_per_micro_batch", "accumulation")


def fit_in(said: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """The measured block in ``said`` (``check --measure N --json``'s whole output, its ``forecast`` or its
    ``measured`` block), checked to carry a rate; ValueError, in one line, where it does not."""
    for key in ("forecast", "measured"):
        if isinstance(said.get(key), Mapping):
            said = said[key]
    if said.get("made") is not True:
        raise ValueError(f"{source} holds no measure (check CONFIG --measure 5 --json writes one): {said.get('why')}")
    if any(not isinstance(said.get(key), int | float) for key in CARRIED):
        why = said.get("model_why") or "it has no FLOP rate"
        raise ValueError(f"{source}'s measure timed seconds a step, not a FLOP rate, so it fits no other run ({why})")
    return said


def carried_forecast(forecast: Any, fit: Mapping[str, Any], source: str) -> dict[str, Any]:
    """This run's time on the machine another config's ``--measure`` timed (``fit``: its measured block): the
    run's steps and micro-batches at that measure's overheads, its FLOPs at that measure's rate, and that
    measure's first-step warm-up. Saves, evaluations and epoch starts are not in it (each was costed only for
    the measured config's own run)."""
    work = forecast.work
    if forecast.run_flops is None:
        return {"made": False, "why": "no FLOPs counted for this run (the forecast's notes say why)"}
    micro = float(fit["overhead_seconds_per_micro_batch"])
    per_update = max(float(fit["overhead_seconds_per_step"]) - float(fit["accumulation"]) * micro, 0.0)
    micro_batches = work.micro_batches_per_rank
    rate, warmup = float(fit["marginal_flops_per_s"]), float(fit.get("warmup_seconds") or 0.0)
    attention_rate = fit.get("attention_flops_per_s")
    rates = Rates(rate, float(attention_rate or rate), micro, apart=bool(attention_rate) and attention_rate != rate)
    parts = [
        (f"{work.steps:,} steps x {per_update:.3g} s + {micro_batches:,} micro-batches x {micro:.3g} s overhead",
         work.steps * per_update + micro_batches * micro),
        _flops_part(forecast, rates),
        (f"{warmup:.2g} s first-step warm-up", warmup),
    ]  # fmt: skip
    return {
        "made": True,
        "from": source,
        "device": fit.get("device"),
        "date": fit.get("date"),
        "run_seconds": sum(seconds for _, seconds in parts),
        "run_seconds_parts": [[text, seconds] for text, seconds in parts],
        "size_note": _size_note(forecast, fit.get("micro_batch_tokens")),
    }


SIZE_APART = 2.0  # this package's threshold for saying so, not a published figure


def _size_note(forecast: Any, measured_tokens: float | None) -> str | None:
    """Why the carried time may be off where the run's micro-batches are far larger or smaller than the
    measured ones: a device's FLOP rate moves with a micro-batch's size (a GPU's up as it fills, this page's
    CPU's down as activations leave its caches: docs/forecast.md#what-it-was-measured-against); None where
    they are alike or a size is not known (a rate file from before the measure wrote it)."""
    work, tokens = forecast.work, forecast.tokens
    if not measured_tokens or tokens is None or not work.micro_batches_per_rank:
        return None
    run_tokens = tokens.total / (work.micro_batches_per_rank * work.world_size)
    if 1 / SIZE_APART <= run_tokens / measured_tokens <= SIZE_APART:
        return None
    return (
        f"this run's micro-batches hold about {run_tokens:,.0f} tokens, the measured ones {measured_tokens:,.0f}: "
        "a device's FLOP rate moves with a micro-batch's size, so this time is less sure; `check --measure` on "
        "this config times its own"
    )


def measure(forecast: Any, config: Mapping[str, Any], env_changes: Mapping[str, str], steps: int, *, ok: bool) -> None:
    """``check --measure``: the measured block of the check's ``forecast`` (forecast/run.py Forecast), set in
    place; a refused config is not run (it would fail or waste the device, as the findings say)."""
    if not ok:
        forecast.measured = NotMeasured("the check refused the config: fix its findings first").as_json()
        return
    print(f"measuring: {steps} optimizer steps of LLaMA-Factory's trainer on this machine ...", file=sys.stderr)
    times = run_steps(config, env_changes, steps, forecast.work)
    if isinstance(times, NotMeasured):
        forecast.measured = times.as_json()
        return
    forecast.measured = measured_forecast(forecast, times, steps)
    if forecast.measured.get("made") and forecast.work.world_size > 1:
        forecast.notes.append(
            f"measured in one process: each of the run's {forecast.work.world_size} ranks does its steps in about "
            "that time; the gradients' all-reduce between ranks is not in it"
        )


def device_name() -> str:
    """The device the child's trainer ran on: the GPU torch sees (ROCm's through torch.cuda), else the CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    except OSError:
        pass
    return f"CPU: {model}, {torch.get_num_threads()} thread(s)"


def device_sync() -> Any:
    """What waits for the device's queued kernels before a timestamp (ROCm's torch answers as torch.cuda): a step
    ends when its work is done, not when the host queued it; nothing to wait for on the CPU."""
    import torch

    return torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)


def run_events(args: Any, steps: int, epochs: int) -> dict[str, int]:
    """The saves and evaluations the real run makes: transformers' ``DefaultFlowCallback`` (the callback that
    decides them in the trainer's loop) asked at each of the run's ``steps`` step ends and ``epochs`` epoch
    ends, with the run's step counts resolved by ``TrainerState.compute_steps`` as the trainer does."""
    from transformers.trainer_callback import DefaultFlowCallback, TrainerControl, TrainerState

    state, flow = TrainerState(max_steps=steps), DefaultFlowCallback()
    state.compute_steps(args, steps)
    counts = {"saves": 0, "evaluations": 0}

    def asked(control: TrainerControl) -> None:
        counts["saves"] += int(control.should_save)
        counts["evaluations"] += int(control.should_evaluate)

    for state.global_step in range(1, steps + 1):
        asked(flow.on_step_end(args, state, TrainerControl()))
    for epoch in range(1, epochs + 1):
        state.epoch = float(epoch)
        asked(flow.on_epoch_end(args, state, TrainerControl()))
    return counts


# rows of the batch put end to end as the third shape (its length: this many times the batch's)
_END_TO_END_ROWS = 4


def _no_end_to_end(model: Any, batch: Mapping[str, Any], rows: int, length: int, joined: int) -> str | None:
    """Why the batch's first rows cannot run end to end as one row of ``joined`` tokens; None where they can."""
    import torch

    if not all(isinstance(v, torch.Tensor) and tuple(v.shape) == (rows, length) for v in batch.values()):
        return "a tensor of the batch is not one per token: no end-to-end row timed, one rate"
    mask = batch.get("attention_mask")
    if mask is not None and int(mask.max()) > 1:  # neat_packing's segment ids: rows end to end would merge them
        return "the attention mask holds packed segments: no end-to-end row timed, one rate"
    config = getattr(model, "config", None)
    rotary = any(getattr(config, key, None) is not None for key in ("rope_theta", "rope_parameters", "rope_scaling"))
    limit = getattr(config, "max_position_embeddings", None)
    if not rotary and isinstance(limit, int) and joined > limit:  # learned positions end at the limit
        return f"the end-to-end row ({joined} tokens) is longer than the model's {limit} positions: one rate"
    return None


def _shapes(model: Any, dataloader: Any) -> tuple[list[tuple[str, int, int, float]], str | None]:
    """Forward + backward of one batch of the run at all its rows ("batch"), at its first row ("row") and at its
    first rows (up to ``_END_TO_END_ROWS``) end to end as one row ("end to end"), alternated, each
    ``_SHAPE_PASSES`` times after one untimed pass of each smaller shape; (kind, rows, length, seconds) of each
    timed pass, and why a shape was not timed. The weights are not updated (the gradients are dropped after
    each pass). The end-to-end row is left out where it cannot run (a tensor of the batch that is not one per
    token, a length the model's positions do not reach, memory) and the fit then takes one rate."""
    import torch

    batch = next(iter(dataloader), None)
    if not isinstance(batch, Mapping) or "labels" not in batch or "input_ids" not in batch:
        return [], "the stage's batch is not a causal-LM batch (input_ids, labels): no second shape timed"
    rows, length = (int(n) for n in batch["input_ids"].shape)
    if rows < 2:
        return [], "one row a batch: no smaller shape to time"
    one = {k: v[:1] if isinstance(v, torch.Tensor) and v.shape[:1] == (rows,) else v for k, v in batch.items()}
    joined = min(rows, _END_TO_END_ROWS)
    why = _no_end_to_end(model, batch, rows, length, joined * length)
    end_to_end = None if why else {k: v[:joined].reshape(1, joined * length) for k, v in batch.items()}
    sync = device_sync()

    def timed_pass(inputs: Mapping[str, Any]) -> float:
        sync()
        start = time.perf_counter()
        model(**inputs).loss.backward()
        sync()
        seconds = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        return seconds

    model.train()
    timed_pass(one)  # the smaller shapes' first passes: their kernels and buffers
    shapes = [("batch", batch, rows, length), ("row", one, 1, length)]
    if end_to_end is not None:
        try:
            timed_pass(end_to_end)
            shapes.append(("end to end", end_to_end, 1, joined * length))
        except Exception as exc:  # the two other shapes still give one rate
            model.zero_grad(set_to_none=True)
            if torch.cuda.is_available():  # an out-of-memory leaves its blocks cached: the other passes need them
                torch.cuda.empty_cache()
            why = f"the end-to-end row ({joined * length} tokens) could not run: {type(exc).__name__}, one rate"
    passes = []
    for _ in range(_SHAPE_PASSES):
        for kind, inputs, n_rows, n_length in shapes:
            passes.append((kind, n_rows, n_length, timed_pass(inputs)))
    return passes, why


def _child(config_file: str, clock_file: str) -> None:
    """The measuring run: stock run_exp with a clock callback; the timestamps written to ``clock_file``."""
    import torch
    from transformers import TrainerCallback

    sync = device_sync()
    payload = json.loads(Path(config_file).read_text(encoding="utf-8"))
    run = payload["run"]

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.begin = 0.0
            self.ends: list[float] = []
            self.cpu: list[float] = []
            self.tokens: list[int] = []
            self.events: list[tuple[str, float]] = []
            self.shapes: list[tuple[int, float]] = []
            self.shapes_why: str | None = None
            self.run_events: dict[str, int] = {}
            self.micro_batches: list[int] = []
            self.eval_runtimes: list[float] = []
            self.substeps = 0

        def _event(self, name: str) -> float:
            sync()
            now = time.perf_counter()
            self.events.append((name, now))
            return now

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if run:  # before the clock starts: counting a long run's events takes a while
                self.run_events = run_events(args, int(run["steps"]), int(run["epochs"]))
                if self.run_events["evaluations"]:
                    # the real run evaluates: the measure does so after its last step (twice: evaluate_twice),
                    # outside the timed steps (its own eval_steps would put one between them, or none at all)
                    from transformers.trainer_utils import IntervalStrategy

                    args.eval_strategy, args.eval_delay, state.eval_steps = IntervalStrategy.STEPS, 0, state.max_steps
            self.begin = self._event("begin")

        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._event("epoch_begin")

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._event("step_begin")

        def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.substeps += 1  # a micro-batch that is not its step's last (transformers' Trainer._inner_loop)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.ends.append(self._event("step_end"))
            self.cpu.append(time.process_time())
            self.tokens.append(int(state.num_input_tokens_seen))
            self.micro_batches.append(self.substeps + 1)
            self.substeps = 0

        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            evaluation = any(str(key).startswith("eval_") for key in kwargs.get("logs") or {})
            self._event(EVAL_LOG if evaluation else "log")

        def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._event("evaluate")
            runtime = (kwargs.get("metrics") or {}).get("eval_runtime")
            if runtime is not None:
                self.eval_runtimes.append(float(runtime))

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._event("save")

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._event("epoch_end")

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._event("end")
            # after the trainer's loop (outside its train_runtime and the timed steps); a model the plain
            # forward + backward cannot take loses the fit, not the measure
            try:
                self.shapes, self.shapes_why = _shapes(kwargs["model"], kwargs["train_dataloader"])
            except Exception as exc:
                self.shapes_why = f"the shapes could not be run: {type(exc).__name__}: {exc}"[:300]

    from transformers import Trainer

    from ..lf.library import run_exp

    evaluate = Trainer.evaluate

    def evaluate_twice(self: Any, *args: Any, **kwargs: Any) -> Any:
        """The run's evaluation, cold (its dataloader built, the eval shapes' first passes) then warm: the
        run's first evaluation and each later one (this run evaluates only after its last timed step)."""
        evaluate(self, *args, **kwargs)
        return evaluate(self, *args, **kwargs)

    Trainer.evaluate = evaluate_twice  # this child's own: it ends with the measure
    clock = Clock()
    run_exp(payload["config"], callbacks=[clock])
    # on a GPU the process's CPU time is the launches' and waits', not a share of the device: not said
    wall = clock.ends[-1] - clock.ends[0] if len(clock.ends) > 1 and not torch.cuda.is_available() else 0.0
    Path(clock_file).write_text(
        json.dumps(
            {
                "begin": clock.begin,
                "ends": clock.ends,
                "tokens_seen": clock.tokens,
                "device": device_name(),
                "events": clock.events,
                "shapes": clock.shapes,
                "shapes_why": clock.shapes_why,
                "run_events": clock.run_events,
                "cpu_share": (clock.cpu[-1] - clock.cpu[0]) / wall if wall > 0 else None,
                "micro_batches": clock.micro_batches,
                "eval_runtimes": clock.eval_runtimes,
            }
        ),
        encoding="utf-8",
    )


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
