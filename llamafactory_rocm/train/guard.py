"""A trainer callback that stops at the first non-finite loss or grad norm, and logs speed/memory.

It raises from ``on_log``, which transformers calls before ``on_save`` in the same step, so the
diverged weights are never saved and the last good checkpoint stays as it was.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from transformers import TrainerCallback

from ..errors import EXIT_DIVERGED
from ..machine.catalogue import load_catalogue
from ..machine.snapshot import Snapshot


class TrainingDiverged(SystemExit):
    def __init__(self, message: str) -> None:
        super().__init__(EXIT_DIVERGED)
        self.message = message


def likely_cause(snapshot: Snapshot, precision: str, learning_rate: float | None) -> str:
    lr = f"learning_rate {learning_rate:g}" if learning_rate is not None else "the learning rate"
    if snapshot.is_rocm and precision == "fp16":
        return f"fp16 on ROCm overflows (use bf16), or {lr} is too high"
    reports = [info.bf16_divergence_report for arch in snapshot.gpu_base_archs if (info := load_catalogue().arch(arch))]
    report = next((text for text in reports if text), None)
    if snapshot.is_rocm and report:  # the catalogue's bf16_divergence_report (docs/rocm-facts.md#f5)
        return f"{lr} is too high ({report})"
    return f"{lr} is too high, or the data has a broken row"


class DivergenceGuard(TrainerCallback):
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self._last_time: float | None = None
        self._last_tokens = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._last_time = time.perf_counter()
        self._last_tokens = getattr(state, "num_input_tokens_seen", 0) or 0

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
        if not logs:
            return
        for key in ("loss", "grad_norm"):
            value = logs.get(key)
            if isinstance(value, (int, float)) and not math.isfinite(value):
                precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
                cause = likely_cause(self.snapshot, precision, getattr(args, "learning_rate", None))
                message = (
                    f"llamafactory-rocm: stopped at step {state.global_step}: {key} is {value} "
                    f"({precision}); likely cause: {cause}. Checkpoints saved before this step are untouched."
                )
                if state.is_world_process_zero:
                    print(message, file=sys.stderr, flush=True)
                raise TrainingDiverged(message)
        self._add_speed_and_memory(state, logs)

    def _add_speed_and_memory(self, state: Any, logs: dict[str, Any]) -> None:
        """Tokens/s since the last log (needs include_num_input_tokens_seen) and peak device memory,
        added to this step's entry of the log history (trainer_state.json) and to ``logs``."""
        extra: dict[str, float] = {}
        now = time.perf_counter()
        tokens = getattr(state, "num_input_tokens_seen", 0) or 0
        if self._last_time is not None and tokens > self._last_tokens and now > self._last_time:
            extra["rocm_tokens_per_s"] = round((tokens - self._last_tokens) / (now - self._last_time), 1)
        self._last_time, self._last_tokens = now, tokens
        try:
            import torch

            if torch.cuda.is_available():
                extra["rocm_peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        except Exception:  # memory stats are a nicety; never stop training for them
            pass
        logs.update(extra)
        history = getattr(state, "log_history", None)
        if history and history[-1].get("step") == state.global_step:
            history[-1].update(extra)
