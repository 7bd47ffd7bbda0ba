"""check against stock LLaMA-Factory on a larger sample of generated configs (issue 20, item 5).

The same generator and oracle as tests/test_resolution_property.py (tests/property_oracle.py): each
config for a tiny local model, one step on CPU; check ok => stock LLaMA-Factory (hook off) trains the
resolved config; check refuses => it fails on the input. Prints the agreement counts and every
disagreement with both reasons.

    python bench/bench_property.py --examples 60 [--seed 1] [--processes 2] [--json out.json]

Without --seed the sample is hypothesis' derandomized one (the CI test's first examples are its first).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _util import machine, tiny_model

from tests.property_oracle import run_oracle, sample, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=60)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--processes", type=int, default=2, help="stock runs side by side (one thread each)")
    parser.add_argument("--json", type=Path, default=None, help="write every example's outcome here")
    args = parser.parse_args()

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_property_") as tmp:
        work = Path(tmp)
        model = tiny_model(work / "tiny-llama")
        choices = sample(args.examples, args.seed)
        examples = run_oracle(choices, model, work / "runs", args.processes)
        print(f"machine: {machine()}")
        print(f"sample: --examples {args.examples} (seed {args.seed if args.seed is not None else 'derandomized'})")
        print(summary(examples))
        print(f"wall time: {time.monotonic() - started:.0f} s")
        if args.json:
            rows = [
                {
                    "id": e.id,
                    "input": e.input,
                    "check_ok": e.check_ok,
                    "check_errors": list(e.check_errors),
                    "check_words": e.check_words,
                    "stock_exit": e.stock_exit,
                    "stock_trained": e.stock_trained,
                    "stock_words": e.stock_words,
                    "agrees": e.agrees,
                }
                for e in examples
            ]
            args.json.write_text(json.dumps(rows, indent=1, default=str))
    return 0 if all(e.agrees is not False for e in examples) else 1


if __name__ == "__main__":
    raise SystemExit(main())
