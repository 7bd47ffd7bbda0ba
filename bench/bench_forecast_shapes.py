"""Does a fit on three shapes of one batch carry to other batches and lengths? forecast/measure.py's
``fitted_rates`` (time = overhead + FLOPs / rate + attention FLOPs / attention rate) against one rate for all
FLOPs (the slope from one row to the batch, as the measure fitted before), on forward + backward passes of
the tiny Llama with LoRA on every linear and gradient checkpointing (as LLaMA-Factory builds it for the
bench's configs), random tokens, at every shape of a grid from 1 x 64 to 16 x 1024 tokens.

Each shape's FLOPs are the check's own count (forecast/flops.py ``step_flops`` at 4 x 128, taken apart by
``StepFlops.parts``); each shape's time is the median of ``--passes`` passes, the shapes interleaved pass by pass
(a slow minute on a shared machine touches every shape alike). The fit takes the three shapes the measure
would time on a batch of ``--fit`` (rows x length): the batch, its first row, its first rows (up to 4) end to
end; every other shape is forecast from it and printed as forecast / measured time.

    OMP_NUM_THREADS=1 python bench/bench_forecast_shapes.py [--passes 5] [--fit 4x128]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import tempfile
import time
from pathlib import Path

from _util import machine, median, tiny_model

from llamafactory_rocm.forecast.flops import step_flops
from llamafactory_rocm.forecast.measure import fitted_rates

GRID = [(rows, length) for rows in (1, 2, 4, 8, 16) for length in (64, 128, 256, 512, 1024) if rows * length <= 8192]


def main() -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    cli = argparse.ArgumentParser()
    cli.add_argument("--passes", type=int, default=5)
    cli.add_argument("--fit", default="4x128", help="ROWSxLENGTH of the batch the fit is made on")
    args = cli.parse_args()
    rows, length = (int(n) for n in args.fit.split("x"))
    joined = min(rows, 4)
    fit_shapes = {"batch": (rows, length), "row": (1, length), "end to end": (1, joined * length)}
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="lfr-bench-shapes-") as work:
        model = AutoModelForCausalLM.from_pretrained(tiny_model(Path(work) / "tiny"))
    model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))
    model.gradient_checkpointing_enable()
    model.enable_input_require_grads()
    model.train()
    step = step_flops(model, 4, 128, None)
    shapes = sorted(set(GRID) | set(fit_shapes.values()))
    batches = {}
    for shape in shapes:
        ids = torch.randint(7, model.config.vocab_size, shape)
        batches[shape] = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

    def timed_pass(shape: tuple[int, int]) -> float:
        start = time.perf_counter()
        model(**batches[shape]).loss.backward()
        seconds = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        return seconds

    for shape in shapes:  # each shape's first pass: its kernels and buffers
        timed_pass(shape)
    seconds: dict[tuple[int, int], list[float]] = {shape: [] for shape in shapes}
    for _ in range(args.passes):
        for shape in shapes:
            seconds[shape].append(timed_pass(shape))
    measured = {shape: statistics.median(times) for shape, times in seconds.items()}

    # each fitted shape's median, as the measure's two passes would be if they agreed (the noise check is the
    # measure's; here the medians of --passes passes stand for each shape)
    passes = [(kind, r, n, measured[(r, n)]) for kind, (r, n) in fit_shapes.items() for _ in range(2)]
    two = fitted_rates(passes, step)
    one = fitted_rates([p for p in passes if p[0] != "end to end"], step)
    print(f"machine: {machine()}, torch threads {torch.get_num_threads()}; {datetime.date.today()}")
    for name, rates in (("two rates", two), ("one rate", one)):
        if rates is None:
            raise SystemExit(f"{name}: no fit (the shapes' times are within their noise): run it again")
        print(
            f"{name} fitted on {args.fit}: {rates.flops_per_s:.3g} FLOP/s, attention {rates.attention_flops_per_s:.3g}"
            f" FLOP/s, overhead {rates.pass_seconds:.3g} s a pass"
        )
    print(f"{'shape':>8} {'measured s':>10} {'two rates':>9} {'one rate':>8}")
    errors: dict[str, list[float]] = {"two": [], "one": []}
    for shape in GRID:
        r, n = shape
        flops, attention = step.parts(r * n, r * n * n)
        ratios = {}
        for name, rates in (("two", two), ("one", one)):
            ratios[name] = (rates.pass_seconds + rates.seconds(flops + attention, attention)) / measured[shape]
            errors[name].append(abs(ratios[name] - 1))
        print(f"{r:>3} x {n:<4} {measured[shape]:10.4f} {ratios['two']:9.3f} {ratios['one']:8.3f}")
    for name in ("two", "one"):
        worst = max(errors[name])
        print(f"{name} rate(s): median |forecast/measured - 1| {median(errors[name]):.1%}, worst {worst:.1%}")


if __name__ == "__main__":
    main()
