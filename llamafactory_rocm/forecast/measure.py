"""``check --measure N``: N real optimizer steps of LLaMA-Factory's own trainer on this machine's device, timed,
and the whole run forecast from them.

The steps run in a child process: stock ``llamafactory.train.tuner.run_exp`` on the checked config (the check's
rewrites and environment included, as a launch would run it) with ``max_steps`` N and ``output_dir`` a
throwaway temporary folder removed afterwards; the user's ``output_dir`` is never touched. The package's hook
is off in the child (``LLAMAFACTORY_ROCM=0``: the config was just checked, and the hook would check it again).
A transformers ``TrainerCallback`` in the child takes a timestamp at ``on_train_begin`` (where the trainer's
own ``train_runtime`` starts its clock) and at each ``on_step_end`` (after the optimizer step; the logging
and saving of a step fall in the next interval, as in the real run). The first step is not timed: it holds
the warm-up (allocator, kernels, the dataloader's first batch); the steps after it give seconds a step.

The run's time = the run's steps (lf/work.py, the one owner of steps) x seconds a step + the first step's
warm-up (what the first step took beyond a timed one), which the real run pays once too. The machine's
achieved rate = the FLOPs of the timed steps (the forecast's FLOPs a token x the tokens the trainer counted in
them, padding included) / their time: how a machine measured once forecasts other configs on it.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
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
_CHILD_ENV_DROPPED = ("FORCE_TORCHRUN", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LLAMAFACTORY_ROCM_CHECKED")


@dataclass(frozen=True)
class StepTimes:
    """What the measuring run's clock saw (child process, perf_counter seconds)."""

    begin: float  # on_train_begin
    ends: tuple[float, ...]  # on_step_end of each step, in order
    tokens_seen: tuple[int, ...]  # the trainer's num_input_tokens_seen at each step's end
    device: str

    @property
    def timed(self) -> tuple[float, ...]:
        """The seconds of each step after the first."""
        return tuple(b - a for a, b in zip(self.ends, self.ends[1:], strict=False))


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


def run_steps(config: Mapping[str, Any], env_changes: Mapping[str, str], steps: int) -> StepTimes | NotMeasured:
    """``steps`` optimizer steps of stock ``run_exp`` on ``config`` in a child process, timed; the throwaway
    folder (the run's output_dir and the clock's file) is removed whatever happens."""
    work = Path(tempfile.mkdtemp(prefix="lfr-measure-"))
    try:
        config_file, clock_file, log_file = work / "config.json", work / "clock.json", work / "run.log"
        config_file.write_text(json.dumps(measuring_config(config, steps, str(work / "output")), default=str))
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
        return StepTimes(clock["begin"], tuple(clock["ends"]), tuple(clock["tokens_seen"]), clock["device"])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measured_forecast(forecast: Any, times: StepTimes, steps_asked: int) -> dict[str, Any]:
    """The whole run from the timed steps: ``forecast`` is the check's (forecast/run.py Forecast)."""
    timed = times.timed
    if not timed:
        return NotMeasured(
            f"the trainer ran {len(times.ends)} step(s) of the {steps_asked} asked: no step after the first to time "
            "(the run has fewer steps; its time is its own)"
        ).as_json()
    per_step = sum(timed) / len(timed)
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
        "run_seconds": steps * per_step + warmup,
        "timed_tokens": None,
        "achieved_flops_per_s": None,
    }
    timed_tokens = times.tokens_seen[-1] - times.tokens_seen[0]
    if timed_tokens > 0:
        result["timed_tokens"] = timed_tokens
        step = forecast.found_step
        if step is not None:
            flops_per_token = step.total / (step.sequences * step.length)
            result["flops_per_token"] = flops_per_token
            result["achieved_flops_per_s"] = flops_per_token * timed_tokens / sum(timed)
    return result


def measure(forecast: Any, config: Mapping[str, Any], env_changes: Mapping[str, str], steps: int, *, ok: bool) -> None:
    """``check --measure``: the measured block of the check's ``forecast`` (forecast/run.py Forecast), set in
    place; a refused config is not run (it would fail or waste the device, as the findings say)."""
    if not ok:
        forecast.measured = NotMeasured("the check refused the config: fix its findings first").as_json()
        return
    print(f"measuring: {steps} optimizer steps of LLaMA-Factory's trainer on this machine ...", file=sys.stderr)
    times = run_steps(config, env_changes, steps)
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


def _child(config_file: str, clock_file: str) -> None:
    """The measuring run: stock run_exp with a clock callback; the timestamps written to ``clock_file``."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.begin = 0.0
            self.ends: list[float] = []
            self.tokens: list[int] = []

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.begin = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.ends.append(time.perf_counter())
            self.tokens.append(int(state.num_input_tokens_seen))

    from llamafactory.train.tuner import run_exp

    clock = Clock()
    run_exp(args=json.loads(Path(config_file).read_text(encoding="utf-8")), callbacks=[clock])
    Path(clock_file).write_text(
        json.dumps({"begin": clock.begin, "ends": clock.ends, "tokens_seen": clock.tokens, "device": device_name()}),
        encoding="utf-8",
    )


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
