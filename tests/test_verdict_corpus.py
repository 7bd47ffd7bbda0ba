"""Issue 14's verdict-agreement corpus: ``check`` and the real trainer must give the same verdict.

Every case is a small config for the tiny local model (1-2 steps on CPU). Each one is run through
``llamafactory-rocm check`` (in-process through the CLI's ``main``, the same code users run) and
through stock ``llamafactory-cli train`` (the venv's entry point, hook on: the default). They agree when

- check exits 0 and training finished (exit 0, the adapter written), or
- check exits 1 (an error finding) and training did not start (non-zero exit, no adapter and no
  checkpoint written, what was in output_dir untouched).

With the hook on, a refusal by ``check`` is also a refusal by the hook, so a wrong refusal would look
like agreement. For every case ``check`` refuses, LLaMA-Factory's own verdict is therefore also asked:
the same config through ``run_exp`` exactly as ``llamafactory-cli train`` calls it, with the hook
switched off (``LLAMAFACTORY_ROCM=0``; all those cases in one process, so the imports are paid once).
If LLaMA-Factory alone trains it, the refusal is wrong, except for the refusals that protect
checkpoints already on disk (``protective``: LLaMA-Factory would write over or rotate them away; the
README promises they are kept).

Not here: memory cases. The estimate needs a device (on a CPU-only machine there is no device memory
to exceed), so ``MEMORY_OVER_DEVICE`` cannot be exercised by a run that trains on CPU.

Disagreements are bugs in llamafactory-rocm, not in this file: they are listed in one table (case,
check exit and finding codes, training exit and its last error line).
``VERDICT_CORPUS_JSON=path`` writes every case's outcome there (``/tmp/corpus_report.py`` reads it).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from llamafactory_rocm.resources import datasets_dir
from tests.conftest import offline_env, tiny_train_config

pytestmark = pytest.mark.trainer

LLAMAFACTORY_CLI = str(Path(sys.executable).parent / "llamafactory-cli")
WORKERS = 2
TRAIN_TIMEOUT_S = 400
DELETE = object()  # a change that removes the key from the base config
ADAPTER = "adapter_model.safetensors"
# One thread per training process: two run at once on a 2-core machine.
SUBPROCESS_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

Builder = Callable[[Path, dict[str, Any]], None]


@dataclass(frozen=True)
class Case:
    id: str
    category: str
    reason: str
    changes: dict[str, Any] = field(default_factory=dict)
    build: Builder | None = None  # writes the files the case needs into its folder, may edit the config
    raw_yaml: Callable[[dict[str, Any]], str] | None = None  # the config file's text, when YAML dump cannot say it
    flags: bool = False  # given as a `--key value` list instead of a YAML file
    extra_flags: tuple[str, ...] = ()  # appended verbatim to the flag list
    protective: bool = False  # a refusal that keeps checkpoints on disk, which LLaMA-Factory alone would lose


# --- dataset files ---------------------------------------------------------------------------------

ALPACA_COLUMNS = {"prompt": "instruction", "query": "input", "response": "output"}


def qa_rows(n: int) -> list[dict[str, str]]:
    rows = json.loads((datasets_dir() / "amd_finetune_qa.json").read_text(encoding="utf-8"))
    return [dict(r) for r in rows[:n]]


def write_dataset(case_dir: Path, config: dict[str, Any], rows: list[dict[str, Any]], name: str = "local_qa") -> Path:
    data = case_dir / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / f"{name}.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    info = {name: {"file_name": f"{name}.json", "formatting": "alpaca", "columns": ALPACA_COLUMNS}}
    (data / "dataset_info.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
    config.update(dataset=name, dataset_dir=str(data))
    return data


def good_local_dataset(case_dir: Path, config: dict[str, Any]) -> None:
    write_dataset(case_dir, config, qa_rows(40))


def good_local_jsonl(case_dir: Path, config: dict[str, Any]) -> None:
    data = write_dataset(case_dir, config, qa_rows(40))
    (data / "local_qa.json").unlink()
    lines = "".join(json.dumps(r) + "\n" for r in qa_rows(40))
    (data / "local_qa.jsonl").write_text(lines, encoding="utf-8")
    info = {"local_qa": {"file_name": "local_qa.jsonl", "formatting": "alpaca", "columns": ALPACA_COLUMNS}}
    (data / "dataset_info.json").write_text(json.dumps(info), encoding="utf-8")


def relative_dataset_dir(case_dir: Path, config: dict[str, Any]) -> None:
    write_dataset(case_dir, config, qa_rows(40))
    config["dataset_dir"] = "data"  # relative to the working directory, as most configs write it


def malformed_dataset_info(case_dir: Path, config: dict[str, Any]) -> None:
    data = write_dataset(case_dir, config, qa_rows(40))
    (data / "dataset_info.json").write_text('{"local_qa": {"file_name": "local_qa.json",', encoding="utf-8")


def missing_dataset_file(case_dir: Path, config: dict[str, Any]) -> None:
    data = write_dataset(case_dir, config, qa_rows(40))
    (data / "local_qa.json").unlink()


def every_response_empty(case_dir: Path, config: dict[str, Any]) -> None:
    write_dataset(case_dir, config, [{**r, "output": ""} for r in qa_rows(40)])


def three_of_forty_without_output(case_dir: Path, config: dict[str, Any]) -> None:
    rows = qa_rows(40)
    for i in (1, 4, 6):  # inside the first max_samples rows, so the loader meets them
        del rows[i]["output"]
    write_dataset(case_dir, config, rows)


def column_not_in_file(case_dir: Path, config: dict[str, Any]) -> None:
    data = write_dataset(case_dir, config, qa_rows(40))
    columns = {**ALPACA_COLUMNS, "prompt": "question"}
    info = {"local_qa": {"file_name": "local_qa.json", "formatting": "alpaca", "columns": columns}}
    (data / "dataset_info.json").write_text(json.dumps(info), encoding="utf-8")


# --- output directories ----------------------------------------------------------------------------


def earlier_checkpoint(case_dir: Path, config: dict[str, Any]) -> None:
    ckpt = Path(config["output_dir"]) / "checkpoint-5"
    ckpt.mkdir(parents=True)
    (ckpt / ADAPTER).write_bytes(b"an earlier run's adapter")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 5, "log_history": []}))


def interrupted_checkpoint(case_dir: Path, config: dict[str, Any]) -> None:
    (Path(config["output_dir"]) / "checkpoint-3").mkdir(parents=True)  # a save cut short: the folder only


def final_adapter_present(case_dir: Path, config: dict[str, Any]) -> None:
    out = Path(config["output_dir"])
    out.mkdir(parents=True)
    (out / ADAPTER).write_bytes(b"an earlier run's final adapter")
    (out / "adapter_config.json").write_text("{}")


def unrelated_file_present(case_dir: Path, config: dict[str, Any]) -> None:
    out = Path(config["output_dir"])
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("what this run is for\n")


# --- raw YAML text ---------------------------------------------------------------------------------


def lr_without_a_dot(config: dict[str, Any]) -> str:
    # PyYAML reads `1e-4` (no dot) as a string; LLaMA-Factory reads YAML with OmegaConf, which says float.
    body = {k: v for k, v in config.items() if k != "learning_rate"}
    return yaml.safe_dump(body, sort_keys=False) + "learning_rate: 1e-4\n"


def empty_file(config: dict[str, Any]) -> str:
    return ""


def comments_only(config: dict[str, Any]) -> str:
    return "# model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct\n# stage: sft\n# do_train: true\n"


# --- the corpus ------------------------------------------------------------------------------------

BLOG_COMMAND = ("--backend", "pt", "--compute_dtype", "bfloat16", "--fp16")
EVAL = {"val_size": 0.25, "do_eval": True, "eval_strategy": "steps", "eval_steps": 1, "per_device_eval_batch_size": 2}

CASES: tuple[Case, ...] = (
    # good configs: LLaMA-Factory trains each; check must say ok
    Case("good_base", "good", "the tiny demo config as it is"),
    Case(
        "good_rank8_alpha16_dropout",
        "good",
        "another LoRA rank, alpha and dropout",
        {"lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.1},
    ),
    Case(
        "good_target_qv_default_template",
        "good",
        "LoRA on q_proj,v_proj only, the default template",
        {"lora_target": "q_proj,v_proj", "template": "default"},
    ),
    Case("good_bf16_use_cpu", "good", "bf16 with use_cpu, as on CPU it must be", {"bf16": True, "use_cpu": True}),
    Case(
        "good_grad_accum_fp32",
        "good",
        "gradient accumulation, fp32 written out, adamw_torch with weight decay",
        {"gradient_accumulation_steps": 2, "bf16": False, "fp16": False, "optim": "adamw_torch", "weight_decay": 0.01},
    ),
    Case(
        "good_two_steps_cosine",
        "good",
        "two steps, logging and saving each, cosine schedule with warmup",
        {"max_steps": 2, "save_steps": 1, "lr_scheduler_type": "cosine", "warmup_ratio": 0.1},
    ),
    Case("good_val_size_do_eval", "good", "val_size with do_eval and step evaluation", EVAL),
    Case(
        "good_chat_sharegpt",
        "good",
        "the bundled sharegpt chat set with llama3",
        {"dataset": "amd_finetune_chat", "template": "llama3"},
    ),
    Case("good_epochs", "good", "num_train_epochs instead of max_steps", {"max_steps": DELETE, "num_train_epochs": 1}),
    Case("good_plot_loss", "good", "plot_loss: matplotlib is a dependency", {"plot_loss": True}),
    Case("good_local_dataset", "good", "an own alpaca dataset with its dataset_info.json", build=good_local_dataset),
    Case(
        "good_relative_dataset_dir", "good", "dataset_dir relative to the working directory", build=relative_dataset_dir
    ),
    Case("good_save_total_limit_fresh", "good", "save_total_limit in a fresh output_dir", {"save_total_limit": 1}),
    # blog-style: check rewrites them, then they train
    Case("blog_fp16", "blog", "fp16: true on a machine where bf16 is the real choice", {"fp16": True}),
    Case(
        "blog_compute_dtype",
        "blog",
        "compute_dtype: bfloat16, a key LLaMA-Factory lacks",
        {"compute_dtype": "bfloat16"},
    ),
    Case("blog_backend_pt", "blog", "backend: pt, a key LLaMA-Factory lacks", {"backend": "pt"}),
    Case(
        "blog_all_three",
        "blog",
        "the blog trio fp16 + compute_dtype + backend",
        {"fp16": True, "compute_dtype": "bfloat16", "backend": "pt"},
    ),
    Case("blog_tf32", "blog", "tf32: true, which needs an Ampere CUDA GPU", {"tf32": True}),
    Case("blog_flash_attn_fa2", "blog", "flash_attn: fa2 where flash-attn is not installed", {"flash_attn": "fa2"}),
    Case("blog_lr_without_dot", "blog", "learning_rate: 1e-4 written without a dot", raw_yaml=lr_without_a_dot),
    # type errors: a value LLaMA-Factory's parser or trainer cannot use
    Case("type_max_steps_abc", "type", "max_steps is an int", {"max_steps": "abc"}),
    Case("type_learning_rate_abc", "type", "learning_rate is a float", {"learning_rate": "abc"}),
    Case("type_bf16_maybe", "type", "bf16 is a bool", {"bf16": "maybe"}),
    Case("type_lora_rank_float", "type", "lora_rank is an int", {"lora_rank": 1.5}),
    Case("type_lr_list", "type", "a list where a scalar is expected", {"learning_rate": [1.0e-4, 2.0e-4]}),
    Case("type_scheduler_wavy", "type", "lr_scheduler_type is a choice", {"lr_scheduler_type": "wavy"}),
    Case("type_stage_foo", "type", "stage is a Literal", {"stage": "foo"}),
    Case("type_template_unknown", "type", "a template LLaMA-Factory does not have", {"template": "llama99"}),
    # key errors
    Case("key_learning_rat", "key", "a typo of learning_rate", {"learning_rat": 1.0e-4}),
    Case("key_rocm_arch", "key", "rocm_arch is not a LLaMA-Factory key", {"rocm_arch": "gfx942"}),
    Case("key_lora_rnk", "key", "a typo of lora_rank", {"lora_rnk": 8}),
    Case("key_batch_size", "key", "per_device_batch_size is not a key", {"per_device_batch_size": 2}),
    # cross-field rules of get_train_args / TrainingArguments
    Case(
        "cross_pwg_stage_pt",
        "cross",
        "predict_with_generate with stage pt",
        {"stage": "pt", "predict_with_generate": True},
    ),
    Case("cross_do_predict_no_pwg", "cross", "do_predict without predict_with_generate", {"do_predict": True, **EVAL}),
    Case(
        "cross_quant_full",
        "cross",
        "quantization_bit with finetuning_type full",
        {"quantization_bit": 4, "finetuning_type": "full"},
    ),
    Case("cross_empty_config", "cross", "an empty config file", raw_yaml=empty_file),
    Case("cross_comment_only", "cross", "a config of comments only", raw_yaml=comments_only),
    Case("cross_no_model", "cross", "no model_name_or_path", {"model_name_or_path": DELETE}),
    Case("cross_no_dataset", "cross", "do_train without a dataset", {"dataset": DELETE}),
    Case("cross_do_eval_no_data", "cross", "do_eval without val_size or eval_dataset", {"do_eval": True}),
    Case(
        "cross_eval_strategy_no_data",
        "cross",
        "eval_strategy steps turns do_eval on, no eval data",
        {"eval_strategy": "steps"},
    ),
    Case("cross_fp16_and_bf16", "cross", "fp16 and bf16 both true", {"fp16": True, "bf16": True}),
    Case("cross_pure_bf16_cpu", "cross", "pure_bf16 where bf16 is not a GPU's", {"pure_bf16": True}),
    Case("cross_neat_packing_rm", "cross", "neat_packing with stage rm", {"stage": "rm", "neat_packing": True}),
    Case(
        "cross_train_on_prompt_pt", "cross", "train_on_prompt with stage pt", {"stage": "pt", "train_on_prompt": True}
    ),
    Case(
        "cross_streaming_no_max_steps",
        "cross",
        "streaming without max_steps",
        {"streaming": True, "max_steps": DELETE, "max_samples": DELETE},
    ),
    Case("cross_qlora_no_bnb", "cross", "quantization_bit 4 without bitsandbytes", {"quantization_bit": 4}),
    # data
    Case("data_unknown_name", "data", "a dataset name not in dataset_info.json", {"dataset": "amd_finetune_qaa"}),
    Case("data_info_malformed", "data", "a dataset_info.json that is not JSON", build=malformed_dataset_info),
    Case("data_file_missing", "data", "the entry's file is not there", build=missing_dataset_file),
    Case("data_all_empty", "data", "every response empty (LLaMA-Factory keeps such rows)", build=every_response_empty),
    Case(
        "data_three_missing_output",
        "data",
        "3 of 40 rows lack output: LLaMA-Factory drops them",
        build=three_of_forty_without_output,
    ),
    Case("data_column_missing", "data", "a mapped column the file does not have", build=column_not_in_file),
    # output directory
    Case(
        "out_overwrite_checkpoint",
        "output",
        "overwrite_output_dir: true over an existing checkpoint",
        {"overwrite_output_dir": True},
        build=earlier_checkpoint,
        protective=True,
    ),
    Case(
        "out_rotate_checkpoint",
        "output",
        "save_total_limit that would rotate an existing checkpoint away",
        {"save_total_limit": 1, "max_steps": 6},
        build=earlier_checkpoint,
        protective=True,
    ),
    Case("out_final_adapter", "output", "output_dir already holds a final adapter", build=final_adapter_present),
    Case(
        "out_interrupted_checkpoint",
        "output",
        "an empty checkpoint-3 left by a cut-short save",
        build=interrupted_checkpoint,
    ),
    Case("out_unrelated_file", "output", "output_dir holds only an unrelated file", build=unrelated_file_present),
    # flag form: the same configs as a `--key value` list
    Case("flags_good_base", "flags", "the good base config as flags", flags=True),
    Case(
        "flags_blog_command",
        "flags",
        "the blog command: --backend pt --compute_dtype bfloat16 --fp16",
        {"lora_target": "q_proj,v_proj"},
        flags=True,
        extra_flags=BLOG_COMMAND,
    ),
    Case(
        "flags_bare_booleans",
        "flags",
        "--do_train and --plot_loss with no value",
        {"do_train": DELETE},
        flags=True,
        extra_flags=("--do_train", "--plot_loss"),
    ),
    Case("flags_no_form", "flags", "a --no_... boolean", flags=True, extra_flags=("--no_use_reentrant_gc",)),
    Case("flags_typo", "flags", "--lora_rnk, a typo of --lora_rank", flags=True, extra_flags=("--lora_rnk", "8")),
    Case(
        "flags_prefix",
        "flags",
        "--learning_rat: argparse takes a unique prefix of --learning_rate",
        flags=True,
        extra_flags=("--learning_rat", "1e-4"),
    ),
    Case("flags_max_steps_abc", "flags", "--max_steps abc", {"max_steps": "abc"}, flags=True),
    Case("flags_bf16_maybe", "flags", "--bf16 maybe", {"bf16": "maybe"}, flags=True),
    Case(
        "flags_pwg_stage_pt",
        "flags",
        "--stage pt --predict_with_generate",
        {"stage": "pt", "predict_with_generate": True},
        flags=True,
    ),
    Case(
        "flags_unknown_dataset",
        "flags",
        "--dataset with a name not in dataset_info.json",
        {"dataset": "nope"},
        flags=True,
    ),
)


# --- running ---------------------------------------------------------------------------------------


def base_config(model: Path, output_dir: Path) -> dict[str, Any]:
    return tiny_train_config(
        model, output_dir, max_steps=1, max_samples=8, cutoff_len=64, per_device_train_batch_size=2
    )


def as_flags(config: dict[str, Any]) -> list[str]:
    flags = []
    for key, value in config.items():
        flags += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return flags


@dataclass
class Prepared:
    case: Case
    case_dir: Path
    output_dir: Path
    args: list[str]  # what follows `check` / `train`
    before: dict[str, str]  # output_dir's files and their digests before the run


def digests(folder: Path) -> dict[str, str]:
    if not folder.is_dir():
        return {}
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    } | {str(p.relative_to(folder)) + "/": "" for p in folder.rglob("*") if p.is_dir()}


def prepare(case: Case, model: Path, case_dir: Path) -> Prepared:
    case_dir.mkdir(parents=True)
    output_dir = case_dir / "out"
    config = base_config(model, output_dir)
    for key, value in case.changes.items():
        if value is DELETE:
            config.pop(key, None)
        else:
            config[key] = value
    if case.build is not None:
        case.build(case_dir, config)
    if case.flags:
        args = [*as_flags(config), *case.extra_flags]
    else:
        text = case.raw_yaml(config) if case.raw_yaml else yaml.safe_dump(config, sort_keys=False)
        path = case_dir / "config.yaml"
        path.write_text(text, encoding="utf-8")
        args = [str(path)]
    return Prepared(case, case_dir, output_dir, args, digests(output_dir))


@dataclass
class CheckResult:
    exit: int
    errors: list[str]
    codes: list[str]
    text: str


CODE = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]{2,}\b")


def run_check(prep: Prepared) -> CheckResult:
    """``llamafactory-rocm check ARGS --json`` in this process, from the case's folder."""
    from llamafactory_rocm.cli.main import main

    env = offline_env(prep.case_dir, **SUBPROCESS_ENV)
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(prep.case_dir)
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "FORCE_TORCHRUN", "LLAMAFACTORY_ROCM_CHECKED"):
            mp.delenv(key, raising=False)
        for key in ("HF_HOME", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TOKENIZERS_PARALLELISM", "WANDB_DISABLED"):
            mp.setenv(key, env[key])
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["check", *prep.args, "--json"])
            except SystemExit as stop:  # argparse's usage errors
                code = stop.code if isinstance(stop.code, int) else 1
    text = out.getvalue() + err.getvalue()
    try:
        report = json.loads(out.getvalue())
        findings = report["findings"]
        errors = [f["code"] for f in findings if f["level"] == "error"]
        codes = [f["code"] for f in findings]
    except (ValueError, KeyError, TypeError):
        errors, codes = [], sorted(set(CODE.findall(text)))
    return CheckResult(int(code), errors, codes, text)


@dataclass
class TrainResult:
    exit: int
    state: str  # "finished", "not started" or "partial"
    last_error: str


def train_state(prep: Prepared, exit_code: int, output_dir: Path | None = None) -> str:
    out = output_dir or prep.output_dir
    after = digests(out)
    adapter_written = ADAPTER in after and after[ADAPTER] != prep.before.get(ADAPTER)
    earlier_kept = all(after.get(name) == digest for name, digest in prep.before.items())
    new_checkpoint = any(name.startswith("checkpoint-") and name not in prep.before for name in after)
    if exit_code == 0 and adapter_written:
        return "finished"
    if exit_code != 0 and not adapter_written and not new_checkpoint and earlier_kept:
        return "not started"
    return "partial"


def last_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    marked = [line for line in lines if re.search(r"error|refus|not ok|exit", line, re.IGNORECASE)]
    return ((marked or lines or [""])[-1])[:200]


def run_training(prep: Prepared) -> TrainResult:
    """Stock ``llamafactory-cli train ARGS``, hook on, from the case's folder."""
    try:
        proc = subprocess.run(
            [LLAMAFACTORY_CLI, "train", *prep.args],
            cwd=prep.case_dir,
            env=offline_env(prep.case_dir, **SUBPROCESS_ENV),
            capture_output=True,
            text=True,
            timeout=TRAIN_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return TrainResult(-1, train_state(prep, -1), f"timed out after {TRAIN_TIMEOUT_S}s")
    (prep.case_dir / "train.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    return TrainResult(proc.returncode, train_state(prep, proc.returncode), last_error_line(proc.stderr or proc.stdout))


# LLaMA-Factory alone (hook off): each case as `llamafactory-cli train ARGS` runs it, one process for all.
ALONE_RUNNER = r"""
import json, os, sys
manifest, results_file = sys.argv[1], sys.argv[2]
cases = json.load(open(manifest))
results = {}
for case in cases:
    os.chdir(case["dir"])
    sys.argv = ["llamafactory-cli", *case["args"]]
    code, last = 0, ""
    try:
        from llamafactory.train.tuner import run_exp
        run_exp()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
        last = f"SystemExit: {stop.code}"
    except BaseException as exc:
        code, last = 1, (f"{type(exc).__name__}: {exc}".splitlines() or [""])[0][:200]
    results[case["id"]] = {"exit": code, "last_error": last}
    with open(results_file, "w") as f:
        json.dump(results, f)
"""


def run_alone(items: list[tuple[Prepared, Prepared]], work: Path) -> dict[str, TrainResult]:
    if not items:
        return {}
    stub = work / "site" / "torchaudio"  # LLaMA-Factory imports torchaudio; the hook's stand-in is off
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("")
    manifest = work / "alone_cases.json"
    results_file = work / "alone_results.json"
    manifest.write_text(json.dumps([{"id": a.case.id, "dir": str(a.case_dir), "args": a.args} for _, a in items]))
    env = offline_env(work, LLAMAFACTORY_ROCM="0", PYTHONPATH=str(work / "site"), **SUBPROCESS_ENV)
    proc = subprocess.run(
        [sys.executable, "-c", ALONE_RUNNER, str(manifest), str(results_file)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=TRAIN_TIMEOUT_S * 2,
    )
    (work / "alone.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    raw = json.loads(results_file.read_text()) if results_file.is_file() else {}
    results = {}
    for _, alone in items:
        got = raw.get(alone.case.id)
        if got is None:  # the runner died before this case: say so, never guess
            results[alone.case.id] = TrainResult(-1, "partial", last_error_line(proc.stderr) or "runner died")
        else:
            results[alone.case.id] = TrainResult(got["exit"], train_state(alone, got["exit"]), got["last_error"])
    return results


@dataclass
class Outcome:
    case: Case
    check: CheckResult
    train: TrainResult
    alone: TrainResult | None  # LLaMA-Factory with the hook off, for the cases check refuses

    @property
    def problem(self) -> str | None:
        """Why the verdicts disagree, or None when they agree."""
        if self.check.exit == 0 and self.train.state != "finished":
            return "check ok, training did not finish"
        if self.check.exit == 1 and self.train.state != "not started":
            return f"check refused, training {self.train.state}"
        if self.check.exit not in (0, 1):
            return f"check exit {self.check.exit} (neither ok nor a finding)"
        if self.alone is not None and self.alone.state == "finished":
            return "check refused a run LLaMA-Factory alone trains"
        return None

    def row(self) -> str:
        check_codes = ",".join(self.check.errors) or (
            "(" + ",".join(self.check.codes) + ")" if self.check.codes else "-"
        )
        if self.check.exit not in (0, 1):
            check_codes = last_error_line(self.check.text)[:80]
        train = f"{self.train.exit} {self.train.state}: {self.train.last_error[:110]}"
        alone = f" | LF alone: {self.alone.exit} {self.alone.state}" if self.alone else ""
        return f"{self.case.id:<30} | check {self.check.exit} {check_codes:<40} | train {train}{alone} | {self.problem}"

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.case.id,
            "category": self.case.category,
            "reason": self.case.reason,
            "agree": self.problem is None,
            "problem": self.problem,
            "check": self.check.__dict__,
            "train": self.train.__dict__,
            "alone": None if self.alone is None else self.alone.__dict__,
        }


def table(outcomes: list[Outcome]) -> str:
    bad = [o for o in outcomes if o.problem]
    head = f"{len(outcomes) - len(bad)} of {len(outcomes)} agree"
    return "\n".join([head, *(o.row() for o in bad)])


@pytest.fixture(scope="module")
def corpus(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Outcome]]:
    root = tmp_path_factory.mktemp("corpus")
    prepared = [prepare(case, tiny_model, root / case.id) for case in CASES]
    checks = {p.case.id: run_check(p) for p in prepared}  # before any training touches an output_dir
    refused = [p for p in prepared if checks[p.case.id].exit == 1 and not p.case.protective]
    alone_pairs = [(p, prepare(p.case, tiny_model, root / "alone" / p.case.id)) for p in refused]
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        alone_future = pool.submit(run_alone, alone_pairs, root / "alone")
        trainings: dict[str, Future[TrainResult]] = {p.case.id: pool.submit(run_training, p) for p in prepared}
        alone = alone_future.result()
        outcomes = {
            p.case.id: Outcome(p.case, checks[p.case.id], trainings[p.case.id].result(), alone.get(p.case.id))
            for p in prepared
        }
    if os.environ.get("VERDICT_CORPUS_JSON"):
        Path(os.environ["VERDICT_CORPUS_JSON"]).write_text(
            json.dumps([o.as_json() for o in outcomes.values()], indent=1, default=str), encoding="utf-8"
        )
    yield outcomes


def test_corpus_covers_every_category() -> None:
    counts: dict[str, int] = {}
    for case in CASES:
        counts[case.category] = counts.get(case.category, 0) + 1
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)
    assert set(counts) == {"good", "blog", "type", "key", "cross", "data", "output", "flags"}, counts
    assert all(n >= 4 for n in counts.values()), counts


@pytest.mark.parametrize("case_id", [c.id for c in CASES])
def test_check_and_training_agree(case_id: str, corpus: dict[str, Outcome]) -> None:
    outcome = corpus[case_id]
    assert outcome.problem is None, f"{outcome.case.reason}\n{outcome.row()}"


def test_every_verdict_agrees(corpus: dict[str, Outcome]) -> None:
    outcomes = list(corpus.values())
    assert all(o.problem is None for o in outcomes), table(outcomes)
