"""Wall time of one tiny CPU fine-tune through three entry points, side by side, interleaved:

  A  llamafactory-rocm train cfg.yaml                    (check + record + LLaMA-Factory)
  B  llamafactory-cli train cfg.yaml                     (stock CLI, hook active)
  C  LLAMAFACTORY_ROCM=0 llamafactory-cli train cfg.yaml (stock CLI, hook off)

The config is already valid (nothing to rewrite), so the differences are the cost of the check.
Stock LLaMA-Factory imports torchaudio unconditionally; for C to run here at all, an empty
``torchaudio`` package is put on PYTHONPATH for every variant alike. Also times ``check``.

    python bench/bench_train.py [--runs 5] [--rows 50000 --max-steps 2]

With ``--rows N`` the data is N alpaca rows (the bundled questions repeated with a row number), so the
data pass, LLaMA-Factory's dry run and its own tokenization weigh what they weigh on a real dataset.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import yaml
from _util import machine, median, timed, tiny_model

from llamafactory_rocm.resources import datasets_dir


def config(model: Path, out: Path, data: Path | None = None, max_steps: int = 30) -> dict:
    return {
        "model_name_or_path": str(model), "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "lora_rank": 16, "lora_target": "all", "template": "llama3",
        "dataset": "amd_finetune_qa" if data is None else "rows",
        "dataset_dir": str(datasets_dir() if data is None else data), "cutoff_len": 256,
        **({"max_samples": 120} if data is None else {}),
        "per_device_train_batch_size": 4, "learning_rate": 5e-3, "max_steps": max_steps, "logging_steps": 10,
        "save_steps": max_steps, "output_dir": str(out), "report_to": "none", "overwrite_cache": True,
        "bf16": True, "use_cpu": True, "seed": 0, "plot_loss": False,
    }  # fmt: skip


def rows_dataset(folder: Path, rows: int) -> Path:
    """``rows`` alpaca rows: the bundled questions, repeated, each with its row number."""
    import json

    source = json.loads((datasets_dir() / "amd_finetune_qa.json").read_text())
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "rows.jsonl").open("w") as out:
        for i in range(rows):
            row = source[i % len(source)]
            out.write(json.dumps({**row, "instruction": f"{row['instruction']} ({i})"}) + "\n")
    (folder / "dataset_info.json").write_text(json.dumps({"rows": {"file_name": "rows.jsonl"}}))
    return folder


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--runs", type=int, default=5)
    cli.add_argument("--rows", type=int, default=0, help="train on this many generated rows (0: 120 bundled)")
    cli.add_argument("--max-steps", type=int, default=30)
    args = cli.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lfr-bench-"))
    try:
        model = tiny_model(work / "tiny")
        data = rows_dataset(work / "data", args.rows) if args.rows else None
        stub = work / "site" / "torchaudio"
        stub.mkdir(parents=True)
        (stub / "__init__.py").write_text("")
        env = {**os.environ, "HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "PYTHONPATH": str(work / "site")}  # fmt: skip
        bindir = Path(sys.executable).parent
        variants = {
            "A llamafactory-rocm train": ([str(bindir / "llamafactory-rocm"), "train"], env),
            "B llamafactory-cli train (hook)": ([str(bindir / "llamafactory-cli"), "train"], env),
            "C llamafactory-cli train (LLAMAFACTORY_ROCM=0)": (
                [str(bindir / "llamafactory-cli"), "train"], {**env, "LLAMAFACTORY_ROCM": "0"}),
        }  # fmt: skip
        times: dict[str, list[float]] = {k: [] for k in variants}
        check_times: list[float] = []
        for run in range(args.runs + 1):  # run 0 warms caches and is not counted
            for name, (cmd, run_env) in variants.items():
                out = work / f"out-{name[0]}-{run}"
                cfg = work / f"cfg-{name[0]}-{run}.yaml"
                cfg.write_text(yaml.safe_dump(config(model, out, data, args.max_steps)))
                elapsed = timed([*cmd, str(cfg)], env=run_env, cwd=str(work))
                if run:
                    times[name].append(elapsed)
            check_cfg = work / "cfg-A-0.yaml"
            elapsed = timed([str(bindir / "llamafactory-rocm"), "check", str(check_cfg)], env=env, cwd=str(work))
            if run:
                check_times.append(elapsed)
        rows = f"{args.rows} generated rows" if args.rows else "120 bundled rows"
        print(f"machine: {machine()}; {rows}, {args.max_steps} steps; {args.runs} runs each (interleaved, 1 warm-up)")
        for name, values in times.items():
            print(f"  {name:48} median {median(values):6.2f} s   runs {', '.join(f'{v:.2f}' for v in values)}")
        a, b, c = (median(v) for v in times.values())
        print(f"  ratio A/C (llamafactory-rocm train vs stock):      {a / c:.3f}")
        print(f"  ratio B/C (stock CLI, hook on vs off):             {b / c:.3f}")
        print(f"  llamafactory-rocm check (same config):             median {median(check_times):.2f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
