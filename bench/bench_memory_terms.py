"""Each term of the memory estimate against its own measurement on a real CPU step: docs/memory.md#per-term.

Each case is tests/test_memory_terms.py's ``measure_terms`` (one oracle for both): Llama-3-8B's config.json (lora,
freeze, full) and Qwen3-MoE's (lora, with and without checkpointing: ``/nockpt``) with 8 layers, hidden 128,
vocabulary 769, batch 2 x cutoff 250, loaded by LLaMA-Factory's ``load_model``; weights from transformers'
``get_memory_footprint``, trainable state from the real AdamW state + ``.grad`` tensors, logits
from the profiler's logit-sized allocations, activations from the real forward's saved tensors; beside each, the
estimate ``check`` makes (dry run + ``plan_estimate``). MiB; ratio = estimated / measured; share = the measured
term / the measured peak (live state + the step's peak above it).

    python bench/bench_memory_terms.py [--cases llama3_8b/lora,llama3_8b/full,qwen3_moe_defaults/lora]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
from pathlib import Path

from _util import machine, tiny_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.test_memory_terms import CASES, measure_terms  # noqa: E402  (one oracle for both)

MIB = 2**20


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--cases", default=",".join(CASES), help="family/method,...")
    args = cli.parse_args()
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    import torch

    print(f"# {machine()}, torch {torch.__version__}, {datetime.date.today()}")
    print("| case | term | measured MiB | estimated MiB | ratio | share of the measured peak |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-terms-") as tmp:
        work = Path(tmp)
        tiny = tiny_model(work / "tiny")
        for case in args.cases.split(","):
            family, method, *flag = case.split("/")
            terms = measure_terms(method, tiny, work / family, family, checkpointing=not flag)
            for term, measured in terms.measured.items():
                est = terms.estimated[term]
                print(f"| {case} | {term} | {measured / MIB:.3f} | {est / MIB:.3f} | {terms.ratio(term):.3f} "
                      f"| {terms.share(term):.2f} |")  # fmt: skip
            peak, est_peak = terms.measured_peak / MIB, terms.estimated_peak / MIB
            ratio = est_peak / peak
            print(f"| {case} | peak (live + step) | {peak:.2f} | {est_peak:.2f} | {ratio:.3f} | 1 |", flush=True)


if __name__ == "__main__":
    main()
