"""Start-up cost of the .pth hook: ``python -c pass`` with and without ``llamafactory_rocm.pth``.

The .pth file is moved aside for the "without" runs and put back afterwards (also on Ctrl-C).
Runs are interleaved so that machine noise hits both sides alike. Target: ratio <= 1.05.

    python bench/bench_startup.py [--runs 60]
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
from pathlib import Path

from _util import machine, median, timed


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--runs", type=int, default=60)
    args = cli.parse_args()
    pth = Path(sysconfig.get_paths()["purelib"]) / "llamafactory_rocm.pth"
    if not pth.is_file():
        raise SystemExit(f"{pth} not found: install the package first (pip install -e .)")
    aside = pth.with_suffix(".pth.bench-disabled")
    cmd = [sys.executable, "-c", "pass"]
    with_hook: list[float] = []
    without: list[float] = []
    for _ in range(5):  # warm the page cache
        timed(cmd)
    try:
        for _ in range(args.runs):
            with_hook.append(timed(cmd))
            pth.rename(aside)
            try:
                without.append(timed(cmd))
            finally:
                aside.rename(pth)
    finally:
        if aside.exists() and not pth.exists():
            aside.rename(pth)
    a, b = median(with_hook), median(without)
    print(f"machine: {machine()}")
    print(f"python -c pass, {args.runs} runs each, interleaved")
    print(f"  with llamafactory_rocm.pth:    median {a * 1000:.1f} ms")
    print(f"  without:                       median {b * 1000:.1f} ms")
    print(f"  ratio: {a / b:.3f} (target <= 1.05)")


if __name__ == "__main__":
    main()
