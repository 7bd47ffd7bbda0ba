"""What ``prepare`` saves the training run: the same tiny CPU fine-tune, interleaved,

  A  llamafactory-rocm train cfg.yaml                       (LLaMA-Factory loads and tokenizes the data)
  P  llamafactory-rocm prepare cfg.yaml tokenized_path=T    (the same preprocessing, on CPU, saved at T)
  B  llamafactory-rocm train cfg.yaml tokenized_path=T      (LLaMA-Factory loads T: no preprocessing)

on a generated alpaca file (20,000 rows by default) and a tiny Llama built on the spot, 2 training
steps, so preprocessing is most of A. A - B is the preprocessing time the GPU box no longer spends.
An empty ``torchaudio`` package is put on PYTHONPATH for every variant alike (as in bench_train.py).

    python bench/bench_prepare.py [--runs 3] [--rows 20000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import yaml
from _util import machine, median, timed
from bench_validate import make_file

from llamafactory_rocm.demo.tiny import build_tiny_model, texts_from_dataset
from llamafactory_rocm.resources import datasets_dir


def config(model: Path, data: Path, out: Path) -> dict:
    return {
        "model_name_or_path": str(model), "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "lora_rank": 8, "lora_target": "all", "template": "llama3", "dataset": "bench",
        "dataset_dir": str(data), "cutoff_len": 256, "per_device_train_batch_size": 4, "max_steps": 2,
        "logging_steps": 1, "save_steps": 2, "output_dir": str(out), "report_to": "none",
        "overwrite_cache": True, "bf16": True, "use_cpu": True, "seed": 0,
    }  # fmt: skip


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--runs", type=int, default=3)
    cli.add_argument("--rows", type=int, default=20_000)
    args = cli.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lfr-bench-prepare-"))
    try:
        model = build_tiny_model(work / "tiny", texts_from_dataset(datasets_dir() / "amd_finetune_qa.json"))
        data = work / "data"
        data.mkdir()
        shutil.copy(make_file(args.rows), data / "bench.jsonl")
        (data / "dataset_info.json").write_text('{"bench": {"file_name": "bench.jsonl"}}\n')
        stub = work / "site" / "torchaudio"
        stub.mkdir(parents=True)
        (stub / "__init__.py").write_text("")
        env = {**os.environ, "HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "PYTHONPATH": str(work / "site"), "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
        rocm = str(Path(sys.executable).parent / "llamafactory-rocm")
        times: dict[str, list[float]] = {"A train": [], "P prepare": [], "B train, tokenized_path": []}
        for run in range(args.runs):
            cfg = work / f"cfg-{run}.yaml"
            cfg.write_text(yaml.safe_dump(config(model, data, work / f"out-{run}")))
            tokenized = f"tokenized_path={work / f'tok-{run}'}"
            times["A train"].append(timed([rocm, "train", str(cfg)], env=env, cwd=str(work)))
            shutil.rmtree(work / f"out-{run}")
            times["P prepare"].append(timed([rocm, "prepare", str(cfg), tokenized], env=env, cwd=str(work)))
            times["B train, tokenized_path"].append(timed([rocm, "train", str(cfg), tokenized], env=env, cwd=str(work)))
        print(f"machine: {machine()}; {args.rows} alpaca rows, cutoff_len 256, 2 steps; {args.runs} runs, medians")
        for name, values in times.items():
            print(f"  {name:26} median {median(values):6.2f} s   runs {', '.join(f'{v:.2f}' for v in values)}")
        a, p, b = (median(v) for v in times.values())
        print(f"  saved on the training box (A - B):  {a - b:6.2f} s ({(a - b) / a:.0%} of A)")
        print(f"  prepare + train vs train alone:     {p + b:6.2f} s vs {a:.2f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
