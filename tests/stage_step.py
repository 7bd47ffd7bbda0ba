"""LLaMA-Factory's own training runs with their second step's memory measured: the oracle of
tests/test_memory_stages.py. It runs in a child process with this package's hook off
(``LLAMAFACTORY_ROCM=0``, read when the process starts), so each run is stock ``run_exp``.

    LLAMAFACTORY_ROCM=0 python tests/stage_step.py CASES.json OUT.json

CASES.json maps a case name to a LLaMA-Factory train config (``max_steps: 2``); OUT.json gets, for each, the
bytes live when the second optimizer step began (parameters, buffers, optimizer state) and the most the step
allocated above them (``StepMemory``), from torch's profiler on the CPU allocator.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from transformers import TrainerCallback


def events_peak(prof: Any) -> int:
    """The peak of the bytes allocated and not yet freed while ``prof`` recorded: every allocation (+bytes)
    and free (-bytes) of the CPU allocator, summed in order; their maximum."""
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak


def live_bytes(model: Any, optimizer: Any) -> int:
    """Parameters, buffers and optimizer state, each storage once."""
    import torch

    live = {id(t): t.numel() * t.element_size() for t in model.parameters()}
    live.update({id(b): b.numel() * b.element_size() for b in model.buffers()})
    for state in optimizer.state.values():
        live.update({id(t): t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor)})
    return sum(live.values())


class StepMemory(TrainerCallback):
    """The Trainer's second step (forward and loss as the stage's trainer computes them, backward, clipping,
    the optimizer step) under ``torch.profiler``: from ``on_step_begin`` to ``on_step_end``, the batch already
    fetched. The first step is left out: AdamW's state is made there, as in no step after it."""

    def __init__(self) -> None:
        self.prof: Any = None
        self.live = self.step_peak = 0

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if state.global_step != 1 or self.prof is not None:
            return
        from torch.profiler import ProfilerActivity, profile

        self.live = live_bytes(model, optimizer)
        self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self.prof.__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        if self.prof is not None and not self.step_peak:
            self.prof.__exit__(None, None, None)
            self.step_peak = events_peak(self.prof)


def main(cases_file: Path, out_file: Path) -> None:
    from llamafactory.train.tuner import run_exp

    results = {}
    for name, config in json.loads(cases_file.read_text()).items():
        step = StepMemory()
        run_exp(config, callbacks=[step])
        if not step.step_peak:
            raise SystemExit(f"{name}: the second step was not measured (max_steps 2?)")
        results[name] = {"live_bytes": step.live, "step_peak_bytes": step.step_peak}
    out_file.write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
