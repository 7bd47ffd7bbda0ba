"""The memory estimate against a measured LoRA training step per model family, on CPU: docs/memory.md's table.

Each case is tests/test_memory_oracle.py's ``compare``: the family's shipped config.json reduced to 2 layers,
hidden 128, vocab 1024 (``reduced_config``), loaded by LLaMA-Factory's own ``load_model`` (LoRA ``all``,
gradient checkpointing unless marked), two training steps as transformers' Trainer runs them, the second
under the torch profiler (allocator events summed in order: the step's peak above the live state). Printed
next to the package's estimate for the same folder and config (``plan_estimate``, the model counted by
``count_model``, its forward traced by lf/dry_activations.py as the dry run traces it; the per-family
formula's step ratio beside it): the step's working set (measured) against activations + logits + gradients (estimated),
and the whole peak (live state + step) against weights + trainable state + activations + logits (the
0.25 GiB workspace left out). MiB; ratio = estimated / measured. The cases are the test's, plus Gemma 3
without checkpointing.

    python bench/bench_memory_oracle.py [--runs 1] [--cases llama3_8b,llama3_8b:nockpt,...]

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
from tests.test_memory_oracle import BATCH, CUTOFF, FAMILIES, compare  # noqa: E402  (one oracle for both)

NO_CHECKPOINTING = ("llama3_8b", "llama4_defaults", "gemma3_defaults")
CASES = tuple(FAMILIES) + tuple(f"{family}:nockpt" for family in NO_CHECKPOINTING)
MIB = 2**20


def row(case: str, tiny: Path, work: Path, runs: int) -> str:
    family, _, flag = case.partition(":")
    checkpointing = flag != "nockpt"
    pairs = [compare(family, tiny, work / f"{case.replace(':', '-')}-{i}", checkpointing) for i in range(runs)]
    step = median([traced.measured.step_peak_bytes for traced, _ in pairs]) / MIB
    peak = median([traced.measured.peak_bytes for traced, _ in pairs]) / MIB
    traced, formula = pairs[0]
    est_step, est_peak = traced.estimated_step_bytes / MIB, traced.estimated_peak_bytes / MIB
    formula_step = formula.estimated_step_bytes / MIB
    label = family if checkpointing else f"{family}, no checkpointing"
    return (
        f"| {label} | {step:.2f} | {est_step:.2f} | {est_step / step:.2f} | {formula_step / step:.2f} "
        f"| {peak:.2f} | {est_peak:.2f} | {est_peak / peak:.2f} |"
    )


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--runs", type=int, default=1)
    cli.add_argument("--cases", default=",".join(CASES), help="family[:nockpt],...")
    args = cli.parse_args()
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    import torch

    print(
        f"# LoRA step, batch {BATCH} x cutoff {CUTOFF}, median of {args.runs}, {machine()}, "
        f"torch {torch.__version__}, {datetime.date.today()}"
    )
    print(
        "| family (reduced) | measured step MiB | estimated (traced) | ratio | formula's ratio "
        "| measured peak MiB | estimated (traced) | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-oracle-") as tmp:
        work = Path(tmp)
        tiny = tiny_model(work / "tiny")
        for case in args.cases.split(","):
            print(row(case, tiny, work, args.runs), flush=True)


if __name__ == "__main__":
    main()
