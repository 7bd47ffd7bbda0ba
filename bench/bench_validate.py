"""``datasets validate`` against ``datasets.load_dataset("json")`` on the same generated alpaca
JSON-lines file (1,000,000 rows by default), stage by stage, interleaved.

Each measurement runs in its own subprocess and reports the wall and CPU seconds of the call alone
(imports excluded), the RSS after its imports (``base``) and its peak RSS (VmHWM):

  validate        validate_dataset(file): datasets' JSON builder streamed + LLaMA-Factory's converter
                  and drop rule on every row
  loader          the streamed loader alone (``loader.stream_tables``), no converter
  load            datasets.load_dataset("json"), in a process with the same imports as validate
  load_bare       datasets.load_dataset("json"), in a process that imports datasets only
  lf_convert      load_dataset + LLaMA-Factory's own ``align_dataset`` (its converter over every row,
                  as ``get_dataset`` runs it before tokenizing; num_proc None)
  validate_small  validate on a file of a quarter of the rows: peak RSS should not grow with the file

The loads get a fresh cache_dir every run, so they really parse.

    python bench/bench_validate.py [--runs 3] [--rows 1000000] [--only validate,load,...]

The files are written to bench/out/ (git-ignored) and reused by later runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from _util import machine, median

OUT = Path(__file__).resolve().parent / "out"

_PRELUDE = """
import json, sys, time
def rss(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
"""
_SAME_IMPORTS = """
import datasets
from llamafactory_rocm.lf.text_only import text_only_llamafactory
from llamafactory_rocm.dataset import validate_dataset
from llamafactory_rocm.dataset.loader import stream_tables
from llamafactory_rocm.dataset.validate import CheckOptions, dataset_attr
with text_only_llamafactory():
    import llamafactory.data.converter, llamafactory.data.processor, llamafactory.hparams
"""
_TIMED = """
base = rss("VmRSS:")
wall, cpu = time.perf_counter(), time.process_time()
rows = run()
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({"seconds": wall, "cpu": cpu, "rows": rows, "base_mb": base, "peak_mb": rss("VmHWM:")}))
"""
_LOAD = """
def run():
    return len(datasets.load_dataset("json", data_files=[sys.argv[1]], cache_dir=sys.argv[2], split="train"))
"""
CODE = {
    "validate": _SAME_IMPORTS
    + """
def run():
    return validate_dataset(sys.argv[1], options=CheckOptions(progress=False)).rows
""",
    "loader": _SAME_IMPORTS
    + """
from pathlib import Path
def run():
    return sum(batch.table.num_rows for batch in stream_tables([Path(sys.argv[1])], progress=False))
""",
    "load": _SAME_IMPORTS + _LOAD,
    "load_bare": "import datasets\n" + _LOAD,
    "lf_convert": _SAME_IMPORTS
    + """
from pathlib import Path
from types import SimpleNamespace
from llamafactory.data.converter import align_dataset
from llamafactory.hparams import DataArguments
def run():
    data = datasets.load_dataset("json", data_files=[sys.argv[1]], cache_dir=sys.argv[2], split="train")
    attr = dataset_attr("bench", {"file_name": sys.argv[1]}, Path(sys.argv[1]).parent)
    args = DataArguments(overwrite_cache=True)
    return len(align_dataset(data, attr, args, SimpleNamespace(local_process_index=0)))
""",
}
CODE["validate_small"] = CODE["validate"]


def make_file(rows: int) -> Path:
    path = OUT / f"alpaca_{rows}.jsonl"
    if path.is_file():
        return path
    OUT.mkdir(exist_ok=True)
    rng = random.Random(0)
    words = ["the", "rocm", "gpu", "trains", "a", "lora", "adapter", "on", "amd", "hardware", "with", "bf16"]
    words += ["and", "flash", "attention"]
    with path.open("w", encoding="utf-8") as handle:
        for i in range(rows):
            text = lambda n: " ".join(rng.choice(words) for _ in range(n))  # noqa: E731
            row = {"instruction": text(12), "input": "" if i % 3 else text(6), "output": text(30)}
            handle.write(json.dumps(row) + "\n")
    return path


def child(mode: str, path: Path) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    with tempfile.TemporaryDirectory(dir=OUT) as cache:
        cmd = [sys.executable, "-c", _PRELUDE + CODE[mode] + _TIMED, str(path), cache]
        result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--only", default=",".join(CODE), help="comma-separated modes (default: all)")
    args = parser.parse_args()
    modes = [m for m in args.only.split(",") if m]
    unknown = [m for m in modes if m not in CODE]
    if unknown:
        raise SystemExit(f"unknown mode {unknown[0]!r}; modes: {', '.join(CODE)}")
    big, small = make_file(args.rows), make_file(args.rows // 4)
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    for _ in range(args.runs):  # interleaved: every mode sees the same machine load
        for mode in modes:
            runs[mode].append(child(mode, small if mode == "validate_small" else big))
    print(f"machine: {machine()}; file: {big.name} ({big.stat().st_size / 1e6:.0f} MB); {args.runs} runs, medians")
    print(f"{'':15s} {'wall s':>7s} {'cpu s':>7s} {'base MB':>8s} {'peak MB':>8s} {'peak-base':>9s}  rows")
    med = {}
    for mode, values in runs.items():
        med[mode] = {key: median([v[key] for v in values]) for key in ("seconds", "cpu", "base_mb", "peak_mb")}
        growth = median([v["peak_mb"] - v["base_mb"] for v in values])
        m = med[mode]
        walls = ", ".join(f"{v['seconds']:.2f}" for v in values)
        print(
            f"{mode:15s} {m['seconds']:7.2f} {m['cpu']:7.2f} {m['base_mb']:8.0f} {m['peak_mb']:8.0f} {growth:9.0f}"
            f"  {values[0]['rows']}   (walls: {walls})"
        )
    if "validate" in med and "load" in med:
        ratio = med["load"]["seconds"] / med["validate"]["seconds"]
        print(f"validate runs at {ratio:.2f}x the load's speed (>= 1 means not slower)")
    if "validate" in med and "loader" in med:
        per_million = (med["validate"]["cpu"] - med["loader"]["cpu"]) * 1e6 / args.rows
        print(f"converter + drop rule: {per_million:.2f} CPU s per 1M rows (validate cpu - loader cpu)")


if __name__ == "__main__":
    main()
