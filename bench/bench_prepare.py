"""``prepare`` against LLaMA-Factory's own tokenize-and-save of the same rows, interleaved pairs:

  S  stock LLaMA-Factory, hook off (``LLAMAFACTORY_ROCM=0``): the first lines of its ``run_sft``
     (``get_train_args``, ``load_tokenizer``, ``get_template_and_fix_tokenizer``, ``get_dataset``) with a
     new ``tokenized_path`` and ``overwrite_cache: true``, in a fresh Python process, imports included.
     LLaMA-Factory 0.9.5's ``get_dataset`` saves the tokenized dataset and returns ("Tokenized dataset is
     saved at ..."); ``llamafactory-cli train`` would then go on to load the model and train, so the
     stock command is cut where the saving ends (``llamafactory/data/loader.py``, ``get_dataset``).
  P  ``llamafactory-rocm prepare cfg.yaml tokenized_path=T`` (dataset checks, the same ``get_dataset``,
     the counts and the summary), in a fresh process.

on a generated alpaca file (20,000 rows by default), a tiny Llama built on the spot, cutoff_len 256.
Pairs run S, P, S, P, ... (the order alternates each pair); the ratio is median(P) / median(S), with
each pair's own ratio, the load average before and after, and the same ratio in CPU seconds (user +
system of each child process), which other engineers' load on the machine disturbs less. The last
pair's two saved datasets are compared row by row (they must be equal). An empty ``torchaudio``
package is put on PYTHONPATH for both.

    cd bench && python bench_prepare.py [--pairs 3] [--rows 20000]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
from pathlib import Path

import yaml
from _util import machine, median, timed, tiny_model
from bench_validate import make_file

STOCK = """
import sys, yaml
from llamafactory.hparams import get_train_args
from llamafactory.model import load_tokenizer
from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
config = yaml.safe_load(open(sys.argv[1]))
config["tokenized_path"] = sys.argv[2]
model_args, data_args, training_args, finetuning_args, _ = get_train_args(config)
tokenizer_module = load_tokenizer(model_args)
template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
get_dataset(template, model_args, data_args, training_args, stage="sft", **tokenizer_module)
"""


def config(model: Path, data: Path, out: Path) -> dict:
    return {
        "model_name_or_path": str(model), "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "lora_rank": 8, "lora_target": "all", "template": "llama3", "dataset": "bench",
        "dataset_dir": str(data), "cutoff_len": 256, "per_device_train_batch_size": 4, "max_steps": 2,
        "output_dir": str(out), "report_to": "none", "overwrite_cache": True, "use_cpu": True, "seed": 0,
    }  # fmt: skip


def same_rows(a: Path, b: Path) -> bool:
    from datasets import load_from_disk

    left, right = load_from_disk(str(a)), load_from_disk(str(b))
    return sorted(left) == sorted(right) and all(left[k].to_dict() == right[k].to_dict() for k in left)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--pairs", type=int, default=3)
    cli.add_argument("--rows", type=int, default=20_000)
    args = cli.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lfr-bench-prepare-"))
    try:
        model = tiny_model(work / "tiny")
        data = work / "data"
        data.mkdir()
        shutil.copy(make_file(args.rows), data / "bench.jsonl")
        (data / "dataset_info.json").write_text('{"bench": {"file_name": "bench.jsonl"}}\n')
        stub = work / "site" / "torchaudio"
        stub.mkdir(parents=True)
        (stub / "__init__.py").write_text("")
        (work / "stock.py").write_text(STOCK)
        env = {**os.environ, "HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "PYTHONPATH": str(work / "site"), "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
        stock_env = {**env, "LLAMAFACTORY_ROCM": "0"}
        rocm = str(Path(sys.executable).parent / "llamafactory-rocm")
        before = loadavg()
        stock: list[float] = []
        prep: list[float] = []
        cpu: dict[str, list[float]] = {"stock": [], "prepare": []}  # user + system of the child process
        for pair in range(args.pairs):
            cfg = work / f"cfg-{pair}.yaml"
            cfg.write_text(yaml.safe_dump(config(model, data, work / f"out-{pair}")))
            commands = {
                "stock": ([sys.executable, str(work / "stock.py"), str(cfg), str(work / f"stock-{pair}")], stock_env),
                "prepare": ([rocm, "prepare", str(cfg), f"tokenized_path={work / f'prep-{pair}'}"], env),
            }
            for name in ("stock", "prepare") if pair % 2 == 0 else ("prepare", "stock"):
                command, its_env = commands[name]
                cpu_before = children_cpu()
                (stock if name == "stock" else prep).append(timed(command, env=its_env, cwd=str(work)))
                cpu[name].append(children_cpu() - cpu_before)
            ratio = prep[-1] / stock[-1]
            print(
                f"  pair {pair + 1}: stock {stock[-1]:6.2f} s  prepare {prep[-1]:6.2f} s  ratio {ratio:.2f}"
                f"   (CPU s: stock {cpu['stock'][-1]:.2f}, prepare {cpu['prepare'][-1]:.2f})"
            )
        last = args.pairs - 1
        equal = same_rows(work / f"stock-{last}", work / f"prep-{last}")
        print(f"machine: {machine()}; load average {before} before, {loadavg()} after")
        print(f"{args.rows} alpaca rows, cutoff_len 256, {args.pairs} interleaved pairs, medians:")
        print(f"  S stock tokenize-and-save  {median(stock):6.2f} s   runs {', '.join(f'{v:.2f}' for v in stock)}")
        print(f"  P prepare                  {median(prep):6.2f} s   runs {', '.join(f'{v:.2f}' for v in prep)}")
        ratios = [p / s for p, s in zip(prep, stock, strict=True)]
        print(f"  ratio P / S: {median(prep) / median(stock):.2f} (medians); per pair median {median(ratios):.2f}")
        cpu_ratio = median(cpu["prepare"]) / median(cpu["stock"])
        print(f"  CPU seconds, medians: stock {median(cpu['stock']):.2f}, prepare {median(cpu['prepare']):.2f}")
        print(f"  ratio P / S in CPU seconds (less sensitive to other load): {cpu_ratio:.2f}")
        print(f"  saved datasets equal (last pair): {equal}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
