"""The memory estimate against LLaMA-Factory's own trainer of each stage, on CPU: docs/memory.md#stages.

Each case is tests/test_memory_stages.py's: Llama-3-8B's config.json reduced to 2 layers, hidden 128, vocab
1024, bf16, LoRA ``all``, gradient checkpointing, batch 2 x cutoff 512 (one case at batch 1), rows that fill
the cutoff; stock ``run_exp`` (hook off, one child process, tests/stage_step.py) with its second step under
torch's profiler. Printed next to ``check``'s estimate for the same config (the dry run's trace, then
``plan_estimate``): activations + logits + gradients against the measured step's peak above the live state.
MiB; ratio = estimated / measured.

    python bench/bench_memory_stages.py [--runs 1]

With ``--runs`` above 1 each measured figure is the median of the runs (the estimate does not vary).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
from pathlib import Path

from _util import machine, median, tiny_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.test_memory_stages import BATCH, CASES, CUTOFF, estimated_step_bytes, run_cases  # noqa: E402

MIB = 2**20


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--runs", type=int, default=1)
    args = cli.parse_args()
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    import torch

    from llamafactory_rocm.lf.memory import TrainingShape, logit_bytes

    print(
        f"# LoRA step per stage, batch {BATCH} x cutoff {CUTOFF}, median of {args.runs}, {machine()}, "
        f"torch {torch.__version__}, {datetime.date.today()}"
    )
    print("| case | measured step MiB | estimated MiB | ratio | logit bytes estimated |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-stages-") as tmp:
        work = Path(tmp)
        tiny = tiny_model(work / "tiny")
        runs = [run_cases(tiny, work / f"run-{i}") for i in range(args.runs)]
        for name in CASES:
            config, _ = runs[0][name]
            step = median([run[name][1]["step_peak_bytes"] for run in runs]) / MIB
            estimated, _ = estimated_step_bytes(config)
            shape = TrainingShape.from_config(config)
            ratio = estimated / MIB / step
            print(f"| {name} | {step:.2f} | {estimated / MIB:.2f} | {ratio:.2f} | {logit_bytes(shape):g} |")


if __name__ == "__main__":
    main()
