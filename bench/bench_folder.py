"""What checking a folder as parallel processes load it costs: ``validate_entry`` on a folder of
many small JSON-lines files with the loading processes known to be one (no run model:
``loader_processes=1``) against not known (every file a run of its own, the CLI's default),
interleaved, for plain alpaca rows and for rows whose keys are ids (a new column every row, the
worst case: every row is news to the types of the whole folder and of its run).

    python bench/bench_folder.py [--runs 3] [--files 200] [--rows 500]

The folders are written to bench/out/ (git-ignored) and reused.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _util import machine, median

OUT = Path(__file__).resolve().parent / "out"


def write_folder(root: Path, kind: str, files: int, rows: int) -> Path:
    folder = root / f"folder_{kind}_{files}x{rows}"
    if folder.is_dir():
        return folder
    part = folder.with_suffix(".part")
    part.mkdir(parents=True, exist_ok=True)
    for number in range(files):
        lines = []
        for i in range(rows):
            row: dict = {"instruction": f"q{number}-{i}", "input": "", "output": "an answer of a few words"}
            if kind == "idkeys":
                row["meta"] = {f"id{number * rows + i}": i}
            lines.append(json.dumps(row))
        (part / f"part{number:04d}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    part.rename(folder)
    return folder


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--runs", type=int, default=3)
    cli.add_argument("--files", type=int, default=200)
    cli.add_argument("--rows", type=int, default=500)
    args = cli.parse_args()
    from llamafactory_rocm.dataset_check import _ScanOptions, validate_entry

    OUT.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}")
    print(f"folders of {args.files} files x {args.rows} rows; medians of {args.runs} runs, interleaved")
    for kind in ("plain", "idkeys"):
        folder = write_folder(OUT, kind, args.files, args.rows)
        seconds: dict[int | None, list[float]] = {1: [], None: []}
        for _ in range(args.runs):
            for processes in seconds:
                options = _ScanOptions(progress=False, loader_processes=processes)
                start = time.perf_counter()
                validate_entry("bench", {"file_name": folder.name}, OUT, options=options)
                seconds[processes].append(time.perf_counter() - start)
        one, unknown = median(seconds[1]), median(seconds[None])
        print(f"  {kind:6}: one process {one:.2f} s, processes not known {unknown:.2f} s: ratio {unknown / one:.2f}")


if __name__ == "__main__":
    main()
