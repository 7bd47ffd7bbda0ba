"""The closing summary of a training run: losses, steps, speed, memory, time and where things went, and the
forecast the check made before launch beside what the run measured.

``SummaryCallback`` is a transformers ``TrainerCallback`` handed to LLaMA-Factory's ``run_exp``
with the guard; it collects from the trainer state while training runs. ``report()`` is called
after ``run_exp`` returns, because LLaMA-Factory saves the model and writes its loss plot only after
the trainer's last callback (``on_train_end``). ``format_summary`` is a pure function of a
``RunSummary``, so the demo builds one from ``trainer_state.json`` and prints the same lines.

The forecast is the one the pre-launch check made for this config (train/hook.py hands it over: the hook's own
check, or the launch record of ``llamafactory-rocm train``'s), never a second one made here. Beside it: the
trainer's ``global_step``, transformers' ``train_runtime`` and the tokens the trainer counted. Where the check
made no time for this machine (a CPU: no card), the summary says why in one line. The same comparison is added to
the launch record as its ``"run"`` block (``report``; check/record.py ``add_run``).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from transformers import TrainerCallback

from ..check.record import RECORD_STEM, add_run
from ..console import duration, say
from ..forecast.render import summary_rows, time_said
from .board import log_lines

TRAIN_RUNTIME = "transformers' train_runtime"
PLOT_NAME = "training_loss.png"  # what LLaMA-Factory's plot_loss writes for the "loss" key
ADAPTER_NAME = "adapter_model.safetensors"
# Rows read to estimate tokens per row when the trainer does not count them: enough for a stable
# mean, few enough to stay instant on a dataset of millions of rows.
ROWS_FOR_MEAN = 1000


@dataclass(frozen=True)
class PeakMemory:
    gib: float
    what: str  # says which memory: device memory allocated by torch, or the process's peak RSS


@dataclass(frozen=True)
class RunSummary:
    losses: tuple[float, ...]
    steps: int  # optimizer steps this process ran (a resumed run counts from its checkpoint)
    tokens: int | None  # tokens trained on, all ranks together
    tokens_counted: bool  # False: estimated from the data's mean row length
    train_s: float | None
    wall_s: float | None
    memory: PeakMemory | None
    output_dir: Path
    adapter: Path | None
    plot: Path | None
    record: Path | None
    resumed_from: int | None = None  # the checkpoint's global step a resumed run started from
    global_step: int | None = None  # the trainer's own count at the end (trainer_state.json global_step)
    train_s_from: str = TRAIN_RUNTIME  # which clock train_s is
    # the pre-launch check's forecast (forecast/run.py Forecast.as_json, or NoForecast's {"made": false, "why"}),
    # None where the check made none
    forecast: Mapping[str, Any] | None = None

    @property
    def tokens_per_s(self) -> float | None:
        if not self.tokens or not self.train_s or self.train_s <= 0:
            return None
        return self.tokens / self.train_s


def peak_memory() -> PeakMemory | None:
    """Peak memory of this process: torch's device peak on CUDA/ROCm, otherwise the peak RSS."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            kind = f"ROCm {torch.version.hip}" if torch.version.hip else "CUDA"
            gib = torch.cuda.max_memory_allocated() / 2**30
            return PeakMemory(gib, f"device memory allocated by torch, this rank ({kind})")
    except Exception:  # memory is a nicety: a broken device query must not hide the rest
        pass
    try:
        import resource
    except ImportError:  # Windows has no resource module
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_bytes = rss if sys.platform == "darwin" else rss * 1024  # Linux reports KiB, macOS bytes
    return PeakMemory(rss_bytes / 2**30, "process peak RSS (no GPU in use)")


def logged_losses(log_history: Iterable[Mapping[str, Any]]) -> tuple[float, ...]:
    return tuple(
        float(e["loss"]) for e in log_history if isinstance(e.get("loss"), (int, float)) and math.isfinite(e["loss"])
    )


def find_outputs(output_dir: Path) -> tuple[Path | None, Path | None, Path | None]:
    """(adapter or saved model, loss plot, newest launch record) in ``output_dir``, each if present."""
    adapter: Path | None = output_dir / ADAPTER_NAME
    if not adapter.is_file():
        saved = sorted(output_dir.glob("model*.safetensors"))  # a full or freeze fine-tune
        adapter = saved[0] if saved else None
    plot = output_dir / PLOT_NAME
    records = sorted(output_dir.glob(f"{RECORD_STEM}*.json"), key=lambda p: p.stat().st_mtime_ns)
    return adapter, (plot if plot.is_file() else None), (records[-1] if records else None)


def last_train_runtime(history: list[dict[str, Any]]) -> float | None:
    """transformers' own ``train_runtime`` (Trainer._finalize_training logs it: speed_metrics, self.log), the
    last one a log history holds, or None."""
    runtimes = [e["train_runtime"] for e in history if isinstance(e.get("train_runtime"), (int, float))]
    return float(runtimes[-1]) if runtimes else None


def summary_from_output_dir(output_dir: Path, wall_s: float | None = None) -> RunSummary | None:
    """A summary from what the trainer saved (``trainer_state.json``), for a run in this process."""
    state_file = output_dir / "trainer_state.json"
    if not state_file.is_file():
        return None
    state = json.loads(state_file.read_text(encoding="utf-8"))
    history = state.get("log_history", [])
    tokens = int(state.get("num_input_tokens_seen") or 0)
    adapter, plot, record = find_outputs(output_dir)
    return RunSummary(
        losses=logged_losses(history),
        steps=int(state.get("global_step") or 0),
        global_step=int(state.get("global_step") or 0),
        tokens=tokens or None,
        tokens_counted=True,
        train_s=last_train_runtime(history),
        wall_s=wall_s,
        memory=peak_memory(),
        output_dir=output_dir,
        adapter=adapter,
        plot=plot,
        record=record,
    )


NO_FORECAST = "the check before launch made no forecast for this run"


def beside_forecast(s: RunSummary) -> dict[str, Any]:
    """The check's forecast beside what this run measured: the summary's lines and the record's ``"run"`` block."""
    f = s.forecast
    if f is None or f.get("made") is False:
        return {"made": False, "why": NO_FORECAST if f is None else str(f.get("why"))}
    tokens = f.get("tokens") or {}
    when = time_said(f)
    return {
        "made": True,
        "steps": f["work"]["steps"],
        "steps_exact": f["work"].get("exact", True),
        "global_step": s.global_step,
        "tokens_with_padding": tokens.get("total"),
        "tokens_counted": s.tokens if s.tokens_counted else None,
        "time": when,
        "train_runtime_s": s.train_s,
        # the measured train_runtime over the forecast's slow and fast ends
        "measured_over_forecast": (
            [s.train_s / when["seconds"][1], s.train_s / when["seconds"][0]]
            if s.train_s and when.get("seconds") and when["seconds"][0] > 0
            else None
        ),
    }


def run_record(s: RunSummary) -> dict[str, Any]:
    """What the launch record gets after the run (its ``"run"`` block): the summary's figures, each with its source."""
    return {
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "global_step": s.global_step,
        "steps_run": s.steps,
        "resumed_from": s.resumed_from,
        "train_runtime_s": s.train_s,
        "train_runtime_from": s.train_s_from,
        "tokens": s.tokens,
        "tokens_counted": s.tokens_counted,
        "tokens_per_s": s.tokens_per_s,
        "wall_s": s.wall_s,
        "peak_memory_gib": None if s.memory is None else s.memory.gib,
        "peak_memory_what": None if s.memory is None else s.memory.what,
        "losses_first_last": [s.losses[0], s.losses[-1]] if s.losses else None,
        "forecast": beside_forecast(s),
    }


def format_summary(s: RunSummary) -> str:
    """The closing summary, one fact a line."""
    if s.losses:
        loss = f"{s.losses[0]:.3f} -> {s.losses[-1]:.3f} (first and last of {len(s.losses)} logged)"
    else:
        loss = "none logged (logging_steps is larger than the steps run)"
    speed = "not known (set include_num_input_tokens_seen: true to count them)"
    if s.tokens_per_s is not None:
        how = "counted" if s.tokens_counted else "estimated from the data's mean row length"
        speed = f"{s.tokens_per_s:,.0f} ({s.tokens:,} tokens, {how})"
    memory = f"{s.memory.gib:.2f} GiB {s.memory.what}" if s.memory else "not known"
    wall = duration(s.wall_s) if s.wall_s is not None else "not known"
    if s.train_s is not None:
        wall += f" (training {duration(s.train_s)}, {s.train_s_from})"
    rows = [
        ("loss", loss),
        ("steps", str(s.steps) + (f" (resumed at step {s.resumed_from})" if s.resumed_from else "")),
        ("tokens/s", speed),
        ("peak memory", memory),
        ("wall time", wall),
        *summary_rows(beside_forecast(s), s.resumed_from),
        ("adapter" if s.adapter is None or s.adapter.name == ADAPTER_NAME else "model", str(s.adapter or "none saved")),
        ("loss plot", str(s.plot) if s.plot else "none (plot_loss: true writes one)"),
        ("launch record", str(s.record) if s.record else "none"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(["llamafactory-rocm: training summary", *(f"  {k.ljust(width)}  {v}" for k, v in rows)])


def format_summary_line(s: RunSummary) -> str:
    """The same facts in one line, for the demo."""
    parts = [f"loss {s.losses[0]:.3f} -> {s.losses[-1]:.3f}" if s.losses else "no loss logged", f"{s.steps} steps"]
    if s.tokens_per_s is not None:
        parts.append(f"{s.tokens_per_s:,.0f} tokens/s")
    if s.memory:
        parts.append(f"peak {s.memory.gib:.2f} GiB ({s.memory.what.split(' (')[0]})")
    if s.wall_s is not None:
        parts.append(f"{duration(s.wall_s)} wall")
    return ", ".join(parts)


def _mean_row_tokens(dataloader: Any) -> float | None:
    """Mean ``input_ids`` length of the first rows of the training set, or None if it cannot tell."""
    try:
        dataset = dataloader.dataset
        rows = min(len(dataset), ROWS_FOR_MEAN)
        ids = dataset[:rows]["input_ids"]
        return sum(len(x) for x in ids) / rows if rows else None
    except Exception:  # a streamed or unusual dataset: the speed is then reported as not known
        return None


class SummaryCallback(TrainerCallback):
    """Collects the summary's facts while the trainer runs; ``report()`` prints them on rank 0 and adds them to
    the launch record. ``forecast``: the pre-launch check's (as JSON); ``record``: that check's launch record."""

    def __init__(self, forecast: Mapping[str, Any] | None = None, record: Path | None = None) -> None:
        self._forecast, self._record = forecast, record
        self._created = time.perf_counter()  # the wall time counts model and data loading too
        self._train_start: float | None = None
        self._train_s: float | None = None
        self._train_s_from = TRAIN_RUNTIME
        self._tokens_at_start = 0
        self._mean_row_tokens: float | None = None
        self._state: Any = None
        self._args: Any = None
        self._memory: PeakMemory | None = None
        self._first_step: int | None = None  # global_step when this process took its first step

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._train_start = time.perf_counter()
        self._tokens_at_start = getattr(state, "num_input_tokens_seen", 0) or 0
        self._mean_row_tokens = _mean_row_tokens(kwargs.get("train_dataloader"))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # transformers loads a resumed checkpoint's state after on_train_begin (Trainer._inner_training_loop),
        # so the step a resumed run starts from is known at its first step, not before.
        if self._first_step is None:
            self._first_step = state.global_step

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        runtime = last_train_runtime(state.log_history)  # logged before this callback runs
        if runtime is not None:
            self._train_s, self._train_s_from = runtime, TRAIN_RUNTIME
        elif self._train_start is not None:
            self._train_s = time.perf_counter() - self._train_start
            self._train_s_from = "from on_train_begin (no train_runtime logged)"
        self._state, self._args = state, args
        self._memory = peak_memory()

    def summary(self) -> RunSummary | None:
        """The run's summary, or None when training never finished (nothing to sum up)."""
        state, args = self._state, self._args
        if state is None or args is None:
            return None
        counted = (getattr(state, "num_input_tokens_seen", 0) or 0) - self._tokens_at_start
        tokens: int | None = counted if counted > 0 else None
        if tokens is None and self._mean_row_tokens:
            # rows per optimizer step, all ranks (the last batch of an epoch may be smaller)
            rows_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
            tokens = round(self._mean_row_tokens * rows_per_step * self.steps_run(state))
        output_dir = Path(str(args.output_dir))
        adapter, plot, record = find_outputs(output_dir)
        return RunSummary(
            losses=logged_losses(state.log_history),
            steps=self.steps_run(state),
            resumed_from=self._first_step or None,
            global_step=state.global_step,
            tokens=tokens,
            tokens_counted=counted > 0,
            train_s=self._train_s,
            train_s_from=self._train_s_from,
            wall_s=time.perf_counter() - self._created,
            memory=self._memory,
            output_dir=output_dir,
            adapter=adapter,
            plot=plot,
            record=self._record if self._record is not None and self._record.is_file() else record,
            forecast=self._forecast,
        )

    def steps_run(self, state: Any) -> int:
        return state.global_step - (self._first_step or 0)

    def report(self, stream: TextIO | None = None) -> RunSummary | None:
        """Print the summary on the world's rank 0 and add it to the check's launch record; call after ``run_exp``
        returns."""
        summary = self.summary()
        if summary is not None and self._state.is_world_process_zero:
            text = format_summary(summary)
            print(text, file=stream or sys.stdout, flush=True)
            log_lines(text.splitlines())  # into LlamaBoard's running_log.txt, when it runs
            if self._record is not None:
                try:
                    add_run(self._record, run_record(summary))
                except (OSError, ValueError) as exc:  # the run is done and said: a record left as it was is a warning
                    say(f"warning: the run's figures could not be added to {self._record} ({exc}).")
        return summary
