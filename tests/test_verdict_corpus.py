"""Issue 14's and issue 20's verdict-agreement corpus: ``check`` and the real trainer must give the same
verdict, for the same reason.

Every case is a small config for the tiny local model (1-2 steps on CPU). Each one is run through
``llamafactory-rocm check`` (in-process through the CLI's ``main``, the same code users run) and
through stock ``llamafactory-cli train`` (the venv's entry point, hook on: the default).

Each case records what the stock run does (``expect``): it ``trains``, or it ``fails`` and then with
which of the library's own words (``words``: a substring of what LLaMA-Factory, transformers, peft,
datasets or torch raise when the hook is off), and which of check's finding codes name that kind of
failure (``codes``). The stock run is asked in two ways:

- hook on (``llamafactory-cli train ARGS``, one subprocess each, two at a time): what a user with the
  package installed gets. Every case check passes with a rewrite (of the config or the environment) must
  finish here (exit 0, weights written), and the first case check passes of each category in
  ``HOOK_ARRIVALS``; every protective refusal, and the first refusal of each of those categories, must
  leave output_dir untouched (no weights, no checkpoint, what was there kept). The hook's other refusals
  are check's own by the same code, and where check passes a config and rewrites nothing the hook hands
  LLaMA-Factory that config as it is: those are asked of LLaMA-Factory alone (``VERDICT_CORPUS_HOOK_ALL=1``
  runs them all with the hook): that keeps the corpus inside CI's budget (a hook-on run: ~6 s of imports).
- hook off (``LLAMAFACTORY_ROCM=0``, ``run_exp`` exactly as ``llamafactory-cli train`` calls it, all those
  cases in one process so the imports are paid once): LLaMA-Factory's own verdict, for every case
  recorded as ``fails``, every case ``check`` refuses and every case check passes unchanged that the
  hook did not run (it must finish: exit 0, weights written). With the hook on, a refusal by ``check`` is also
  a refusal by the hook, so a wrong refusal would otherwise look like agreement. Its error must hold the
  recorded ``words``; if LLaMA-Factory alone trains a case ``check`` refuses, the refusal is wrong, except
  the refusals that protect checkpoints already on disk (``protective``: LLaMA-Factory would write over
  or rotate them away; the README promises they are kept).

They agree on the verdict when check exits 0 exactly when the stock run trains, and on the reason when,
both refusing, one of check's error codes is among the case's ``codes`` (and none of its ``forbid``).
A case whose stock run does not do what is recorded fails too: the record, or the library, changed.

Cases marked ``check_only`` have no stock run: a Llama-3-8B-shaped ``config.json`` with no weights. Their
oracle is peft's own ``get_peft_model`` on the model transformers builds from that config.json on the meta
device, with LoRA on the modules LLaMA-Factory targets (``peft_on_meta``): the library's answer to the one
question the case asks, not check's text.

Not here: memory cases. The estimate needs a device (on a CPU-only machine there is no device memory
to exceed), so ``MEMORY_OVER_DEVICE`` cannot be exercised by a run that trains on CPU. PPO beyond its
argument check: LLaMA-Factory 0.9.5's PPO workflow needs a reward model and trl's pre-0.12 PPOTrainer
API (its trainer pins trl>=0.8.6,<=0.9.6); its stock run is recorded as it fails here (``stage_ppo_*``),
the check must agree with that.

A disagreement is a bug in llamafactory-rocm, not in this file: such a case stays, marked
``xfail(strict=True)`` with the disagreement named, until the package is fixed. All cases are listed in
one table (case, check exit and finding codes, training exit and its error, LLaMA-Factory alone).
``VERDICT_CORPUS_JSON=path`` writes every case's outcome there; ``VERDICT_CORPUS_ONLY=regex`` runs only
the cases whose id matches (for working on the corpus; CI runs them all).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from llamafactory_rocm.resources import datasets_dir
from tests import stock_runner
from tests.conftest import offline_env, tiny_train_config

pytestmark = pytest.mark.trainer

LLAMAFACTORY_CLI = str(Path(sys.executable).parent / "llamafactory-cli")
WORKERS = 2
TRAIN_TIMEOUT_S = 400
DELETE = object()  # a change that removes the key from the base config
ADAPTER = "adapter_model.safetensors"
WEIGHTS = (ADAPTER, "model.safetensors")  # LoRA writes the first, freeze and full the second
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
    # the record: what the stock run does, in the library's words, and check's codes for that kind
    expect: str = "trains"  # "trains" or "fails"
    words: str = ""  # when it fails: a substring of the library's own error (hook off)
    codes: frozenset[str] = frozenset()  # when both refuse: check names it with one of these error codes
    forbid: frozenset[str] = frozenset()  # codes check must not give for this case
    notes: frozenset[str] = frozenset()  # when it trains: findings check must report on the way (e.g. VALUE_COERCED)
    config_name: str = "config.yaml"  # the config file's name (its suffix picks LLaMA-Factory's reader)
    tail: tuple[str, ...] = ()  # what follows the config file on the command line
    env: tuple[tuple[str, str | None], ...] = ()  # environment changes for both runs (None: unset)
    check_only: bool = False  # no stock run (no weights): check's verdict and words alone
    xfail: str = ""  # a known disagreement, named: check is wrong here until the package is fixed


def fails(words: str, *codes: str, **more: Any) -> dict[str, Any]:
    """The record of a stock run that fails: the library's words and check's codes for that kind."""
    return {"expect": "fails", "words": words, "codes": frozenset(codes), **more}


# --- dataset files ---------------------------------------------------------------------------------

ALPACA_COLUMNS = {"prompt": "instruction", "query": "input", "response": "output"}
RANKING_COLUMNS = {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"}
KTO_COLUMNS = {**ALPACA_COLUMNS, "kto_tag": "kto_tag"}


def qa_rows(n: int) -> list[dict[str, str]]:
    rows = json.loads((datasets_dir() / "amd_finetune_qa.json").read_text(encoding="utf-8"))
    return [dict(r) for r in rows[:n]]


def write_dataset(
    case_dir: Path,
    config: dict[str, Any],
    rows: list[dict[str, Any]],
    name: str = "local_qa",
    entry: dict[str, Any] | None = None,
) -> Path:
    data = case_dir / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / f"{name}.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    info_file = data / "dataset_info.json"
    info = json.loads(info_file.read_text()) if info_file.is_file() else {}
    info[name] = {"file_name": f"{name}.json", **(entry or {"formatting": "alpaca", "columns": ALPACA_COLUMNS})}
    info_file.write_text(json.dumps(info, indent=1), encoding="utf-8")
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


def entry_with_comment(case_dir: Path, config: dict[str, Any]) -> None:
    entry = {"formatting": "alpaca", "columns": ALPACA_COLUMNS, "comment": "AMD QA, first 40 rows"}
    write_dataset(case_dir, config, qa_rows(40), entry=entry)


def entry_with_misspelt_key(case_dir: Path, config: dict[str, Any]) -> None:
    # `colums`: LLaMA-Factory ignores it and maps alpaca's default columns, which this file has.
    write_dataset(case_dir, config, qa_rows(40), entry={"formatting": "alpaca", "colums": ALPACA_COLUMNS})


def sharegpt_entry_with_prompt(case_dir: Path, config: dict[str, Any]) -> None:
    # a sharegpt entry that also maps alpaca's prompt column: the sharegpt converter never reads it
    rows = [
        {"instruction": r["instruction"], "conversations": [{"from": "human", "value": r["instruction"]},
         {"from": "gpt", "value": r["output"]}]}
        for r in qa_rows(40)
    ]  # fmt: skip
    entry = {"formatting": "sharegpt", "columns": {"messages": "conversations", "prompt": "instruction"}}
    write_dataset(case_dir, config, rows, entry=entry)


def alpaca_entry_with_messages(case_dir: Path, config: dict[str, Any]) -> None:
    # an alpaca entry that also maps sharegpt's messages column: the alpaca converter never reads it
    rows = [{**r, "conversations": [{"from": "human", "value": r["instruction"]}]} for r in qa_rows(40)]
    entry = {"formatting": "alpaca", "columns": {**ALPACA_COLUMNS, "messages": "conversations"}}
    write_dataset(case_dir, config, rows, entry=entry)


def pairs(case_dir: Path, config: dict[str, Any]) -> None:
    """A preference dataset (ranking: true), as the DPO and RM workflows read it."""
    rows = [
        {"instruction": r["instruction"], "input": "", "chosen": r["output"], "rejected": "No idea."}
        for r in qa_rows(12)
    ]
    write_dataset(case_dir, config, rows, "pairs", {"ranking": True, "columns": RANKING_COLUMNS})


def kto_rows(case_dir: Path, config: dict[str, Any]) -> None:
    rows = [{**r, "kto_tag": i % 3 != 0} for i, r in enumerate(qa_rows(12))]
    write_dataset(case_dir, config, rows, "kto", {"formatting": "alpaca", "columns": KTO_COLUMNS})


def plain_text(case_dir: Path, config: dict[str, Any]) -> None:
    rows = [{"text": f"{r['instruction']} {r['output']}"} for r in qa_rows(12)]
    write_dataset(case_dir, config, rows, "text", {"columns": {"prompt": "text"}})


def two_datasets(probs: str) -> Builder:
    def build(case_dir: Path, config: dict[str, Any]) -> None:
        write_dataset(case_dir, config, qa_rows(20), "qa_a")
        write_dataset(case_dir, config, qa_rows(40)[20:], "qa_b")
        config.update(dataset="qa_a,qa_b", mix_strategy="interleave_under", interleave_probs=probs)

    return build


# --- models, adapters, tokenized data ----------------------------------------------------------------


def missing_model(case_dir: Path, config: dict[str, Any]) -> None:
    config["model_name_or_path"] = str(case_dir / "no-such-model")


def missing_adapter(case_dir: Path, config: dict[str, Any]) -> None:
    config["adapter_name_or_path"] = str(case_dir / "no-such-adapter")


_BUILT: dict[str, Path] = {}
_BUILT_LOCK = threading.Lock()


def _another_tokenizer(model: Path) -> Path:
    """A second tiny tokenizer, with a larger vocabulary, trained on the same rows (built once)."""
    with _BUILT_LOCK:
        if "tokenizer" not in _BUILT:
            from llamafactory_rocm.demo.tiny import build_tiny_model, texts_from_dataset

            folder = model.parent.parent / "another-tokenizer"
            _BUILT["tokenizer"] = build_tiny_model(
                folder, texts_from_dataset(datasets_dir() / "amd_finetune_qa.json"), vocab_size=1200
            )
        return _BUILT["tokenizer"]


def _save_tokenized(folder: Path, ids: list[list[int]]) -> None:
    from datasets import Dataset, DatasetDict

    rows = {"input_ids": ids, "attention_mask": [[1] * len(i) for i in ids], "labels": ids}
    DatasetDict({"train": Dataset.from_dict(rows)}).save_to_disk(str(folder))


def tokenized_by_another_tokenizer(case_dir: Path, config: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(_another_tokenizer(Path(config["model_name_or_path"])))
    ids = [tokenizer(r["instruction"] + " " + r["output"])["input_ids"][:48] for r in qa_rows(8)]
    _save_tokenized(case_dir / "tokenized", ids)
    config["tokenized_path"] = str(case_dir / "tokenized")


def tokenized_by_this_tokenizer(case_dir: Path, config: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config["model_name_or_path"])
    ids = [tokenizer(r["instruction"] + " " + r["output"])["input_ids"][:48] for r in qa_rows(8)]
    _save_tokenized(case_dir / "tokenized", ids)
    config["tokenized_path"] = str(case_dir / "tokenized")


def llama3_8b_shaped(lora_target: str) -> Builder:
    """A folder with a Llama-3-8B config.json and the tiny tokenizer: no weights, judged on the meta model."""

    def build(case_dir: Path, config: dict[str, Any]) -> None:
        from transformers import LlamaConfig

        import llamafactory_rocm.models as models_package

        shape = json.loads((Path(models_package.__file__).parent / "llama3_8b.json").read_text())["config"]
        folder = case_dir / "llama3-8b-shaped"
        LlamaConfig(**{k: v for k, v in shape.items() if k != "model_type"}).save_pretrained(folder)
        model = Path(config["model_name_or_path"])
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(model / name, folder / name)
        config.update(model_name_or_path=str(folder), lora_target=lora_target)

    return build


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


def output_dir_is_a_file(case_dir: Path, config: dict[str, Any]) -> None:
    Path(config["output_dir"]).write_text("a file where output_dir should be a folder\n")


def _rank8_checkpoint(model: Path) -> Path:
    """checkpoint-1 of a real 1-step LoRA rank-8 run by stock LLaMA-Factory (hook off), trained once."""
    with _BUILT_LOCK:
        if "rank8" not in _BUILT:
            work = model.parent.parent / "rank8-run"
            work.mkdir(parents=True, exist_ok=True)
            config = base_config(model, work / "out")
            config.update(lora_rank=8, save_steps=1)
            (work / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
            env = stock_runner.hook_off_env(work, **SUBPROCESS_ENV)
            proc = subprocess.run(
                [LLAMAFACTORY_CLI, "train", str(work / "config.yaml")],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=TRAIN_TIMEOUT_S,
            )
            ckpt = work / "out" / "checkpoint-1"
            assert proc.returncode == 0 and (ckpt / ADAPTER).is_file(), proc.stderr[-3000:]
            _BUILT["rank8"] = ckpt
        return _BUILT["rank8"]


def resume_rank8(case_dir: Path, config: dict[str, Any]) -> None:
    """output_dir holds checkpoint-1 of a rank-8 run: LLaMA-Factory resumes from it on its own."""
    shutil.copytree(_rank8_checkpoint(Path(config["model_name_or_path"])), Path(config["output_dir"]) / "checkpoint-1")
    config["max_steps"] = 2


def another_experiments_checkpoint(case_dir: Path, config: dict[str, Any]) -> None:
    """output_dir holds the run's own rank-8 checkpoint-2 (resumed) and checkpoint-1 of another base model."""
    out = Path(config["output_dir"])
    for name in ("checkpoint-1", "checkpoint-2"):
        shutil.copytree(_rank8_checkpoint(Path(config["model_name_or_path"])), out / name)
    adapter_config = out / "checkpoint-1" / "adapter_config.json"
    other = {**json.loads(adapter_config.read_text()), "base_model_name_or_path": "another/base-model"}
    adapter_config.write_text(json.dumps(other))
    config["max_steps"] = 2


def resume_rank8_explicitly(case_dir: Path, config: dict[str, Any]) -> None:
    ckpt = case_dir / "earlier" / "checkpoint-1"
    shutil.copytree(_rank8_checkpoint(Path(config["model_name_or_path"])), ckpt)
    config.update(resume_from_checkpoint=str(ckpt), max_steps=2, lora_rank=8)


def missing_resume_checkpoint(case_dir: Path, config: dict[str, Any]) -> None:
    config["resume_from_checkpoint"] = str(case_dir / "earlier" / "checkpoint-7")


def deepspeed_zero3_checkpoint(with_deepspeed: bool) -> Builder:
    """checkpoint-10 as transformers + DeepSpeed ZeRO-3 save it (stage3_gather_16bit_weights_on_model_save:
    false): `latest`, global_step10/ with the sharded states, trainer_state.json, no gathered weights."""

    def build(case_dir: Path, config: dict[str, Any]) -> None:
        ckpt = Path(config["output_dir"]) / "checkpoint-10"
        step = ckpt / "global_step10"
        step.mkdir(parents=True)
        (ckpt / "latest").write_text("global_step10")
        (step / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"")
        (step / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"")
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 10, "max_steps": 30, "log_history": []}))
        (ckpt / "zero_to_fp32.py").write_text("")
        if with_deepspeed:
            zero3 = {
                "train_batch_size": "auto",
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": "auto",
                "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": False},
            }
            (case_dir / "ds_z3.json").write_text(json.dumps(zero3))
            config["deepspeed"] = str(case_dir / "ds_z3.json")

    return build


# --- issue 37: the launch parts the dry run builds since (dataloaders, workers, output_dir, Hub, FSDP, metric,
# trainer_state.json) -----------------------------------------------------------------------------------


def output_dir_under_a_file(case_dir: Path, config: dict[str, Any]) -> None:
    (case_dir / "run.log").write_text("a file where a folder of output_dir should be\n")
    config["output_dir"] = str(case_dir / "run.log" / "out")


def hub_dataset_not_downloaded(case_dir: Path, config: dict[str, Any]) -> None:
    data = case_dir / "data"
    data.mkdir(parents=True)
    (data / "dataset_info.json").write_text(json.dumps({"hub_qa": {"hf_hub_url": "lfrocm-test/not-downloaded"}}))
    config.update(dataset="hub_qa", dataset_dir=str(data))


def trainer_state_from_another_version(change: Callable[[dict[str, Any]], None], *, explicit: bool) -> Builder:
    """A real rank-8 checkpoint whose trainer_state.json another transformers version could have written:
    resumed by name (``explicit``) or found by LLaMA-Factory in output_dir."""

    def build(case_dir: Path, config: dict[str, Any]) -> None:
        ckpt = (case_dir / "earlier" if explicit else Path(config["output_dir"])) / "checkpoint-1"
        shutil.copytree(_rank8_checkpoint(Path(config["model_name_or_path"])), ckpt)
        state = json.loads((ckpt / "trainer_state.json").read_text())
        change(state)
        (ckpt / "trainer_state.json").write_text(json.dumps(state))
        config.update(max_steps=2, lora_rank=8)
        if explicit:
            config["resume_from_checkpoint"] = str(ckpt)

    return build


def a_field_of_a_newer_version(state: dict[str, Any]) -> None:
    state["a_field_of_a_newer_version"] = 1


def no_stateful_callbacks(state: dict[str, Any]) -> None:
    state.pop("stateful_callbacks")  # transformers before 4.41 wrote none


# --- raw YAML text ---------------------------------------------------------------------------------


def lr_without_a_dot(config: dict[str, Any]) -> str:
    # PyYAML reads `1e-4` (no dot) as a string; LLaMA-Factory reads YAML with OmegaConf, which says float.
    body = {k: v for k, v in config.items() if k != "learning_rate"}
    return yaml.safe_dump(body, sort_keys=False) + "learning_rate: 1e-4\n"


def empty_file(config: dict[str, Any]) -> str:
    return ""


def comments_only(config: dict[str, Any]) -> str:
    return "# model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct\n# stage: sft\n# do_train: true\n"


def yaml_list(config: dict[str, Any]) -> str:
    return yaml.safe_dump([config], sort_keys=False)  # the whole config one item down, a YAML list


def yaml_scalar(config: dict[str, Any]) -> str:
    return "llamafactory-cli train with this model\n"


def as_json(config: dict[str, Any]) -> str:
    return json.dumps(config, indent=1)


def quoted_lr(value: str) -> Callable[[dict[str, Any]], str]:
    """learning_rate quoted in the YAML text (PyYAML would write 5e-5 bare, which OmegaConf reads as a float)."""

    def text(config: dict[str, Any]) -> str:
        body = {k: v for k, v in config.items() if k != "learning_rate"}
        return yaml.safe_dump(body, sort_keys=False) + f'learning_rate: "{value}"\n'

    return text


# --- the records' shared words ------------------------------------------------------------------------

ONE_LINE = "exit 2"  # check's one-line refusal of a config LLaMA-Factory cannot read (no findings)
NOT_APPLICABLE = "The dataset is not applicable in the current training stage."

# Known disagreements: none at present. A new one is recorded as ``xfail="<what disagrees>"`` on its case.


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
    Case(
        "type_max_steps_abc",
        "type",
        "max_steps is an int",
        {"max_steps": "abc"},
        **fails("not supported between instances of 'str' and 'int'", "VALUE_INVALID"),
    ),
    Case(
        "type_learning_rate_abc",
        "type",
        "learning_rate is a float",
        {"learning_rate": "abc"},
        **fails("not supported between instances of 'float' and 'str'", "VALUE_INVALID"),
    ),
    Case(
        "type_bf16_maybe", "type", "bf16 is a bool", {"bf16": "maybe"}, **fails("doesn't support bf16", "VALUE_INVALID")
    ),
    Case(
        "type_lora_rank_float",
        "type",
        "lora_rank is an int",
        {"lora_rank": 1.5},
        **fails("must be tuple of ints, but found element of type float", "VALUE_INVALID"),
    ),
    Case(
        "type_lr_list",
        "type",
        "a list where a scalar is expected",
        {"learning_rate": [1.0e-4, 2.0e-4]},
        **fails("not supported between instances of 'float' and 'list'", "VALUE_INVALID"),
    ),
    Case(
        "type_scheduler_wavy",
        "type",
        "lr_scheduler_type is a choice",
        {"lr_scheduler_type": "wavy"},
        **fails("wavy is not a valid SchedulerType", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "type_stage_foo", "type", "stage is a Literal", {"stage": "foo"}, **fails("Unknown task: foo.", "STAGE_UNKNOWN")
    ),
    # choices: parse_dict checks none; some of these train, others stop in the library's own words
    Case(
        "choice_galore_unused",
        "type",
        "a GaLore choice outside its Literal, GaLore off",
        {"galore_proj_type": "sideways"},
        notes=frozenset({"VALUE_NOT_A_CHOICE"}),
    ),
    Case(
        "choice_mix_strategy",
        "type",
        "mix_strategy outside its Literal, one dataset",
        {"mix_strategy": "shuffle"},
        notes=frozenset({"VALUE_NOT_A_CHOICE"}),
    ),
    Case(
        "choice_log_level",
        "type",
        "log_level outside its choices (a dict lookup in Trainer.__init__)",
        {"log_level": "loud"},
        **fails("KeyError: 'loud'", "TRAINER_SETUP_REFUSED"),
    ),
    Case(
        "type_optim_args_int",
        "type",
        "a string field given a number (transformers' _parse_optim_args calls .replace on it)",
        {"optim_args": 7},
        **fails("'int' object has no attribute 'replace'", "VALUE_TYPE_STOPS_LAUNCH"),
    ),
    Case(
        "type_report_to_mapping",
        "type",
        "a string field given a mapping (transformers looks it up among its reporters)",
        {"report_to": {"a": 1}},
        **fails("unhashable type: 'dict'", "VALUE_TYPE_STOPS_LAUNCH"),
    ),
    Case(
        "choice_flash_attn",
        "type",
        "flash_attn outside its Literal",
        {"flash_attn": "fa9"},
        **fails("Unknown attention type: fa9", "MODEL_MODULES_REFUSED"),
    ),
    Case(
        "choice_finetuning_type",
        "type",
        "finetuning_type outside its Literal",
        {"finetuning_type": "lroa"},
        **fails("Invalid fine-tuning method.", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "type_template_unknown",
        "type",
        "a template LLaMA-Factory does not have",
        {"template": "llama99"},
        **fails("Template llama99 does not exist.", "VALUE_INVALID", "TEMPLATE_REFUSED"),
    ),
    # key errors
    Case(
        "key_learning_rat",
        "key",
        "a typo of learning_rate",
        {"learning_rat": 1.0e-4},
        **fails("Some keys are not used by the HfArgumentParser: ['learning_rat']", "UNKNOWN_KEY"),
    ),
    Case(
        "key_rocm_arch",
        "key",
        "rocm_arch is not a LLaMA-Factory key",
        {"rocm_arch": "gfx942"},
        **fails("Some keys are not used by the HfArgumentParser: ['rocm_arch']", "UNKNOWN_KEY"),
    ),
    Case(
        "key_lora_rnk",
        "key",
        "a typo of lora_rank",
        {"lora_rnk": 8},
        **fails("Some keys are not used by the HfArgumentParser: ['lora_rnk']", "UNKNOWN_KEY"),
    ),
    Case(
        "key_batch_size",
        "key",
        "per_device_batch_size is not a key",
        {"per_device_batch_size": 2},
        **fails("Some keys are not used by the HfArgumentParser: ['per_device_batch_size']", "UNKNOWN_KEY"),
    ),
    # cross-field rules of get_train_args / TrainingArguments
    Case(
        "cross_pwg_stage_pt",
        "cross",
        "predict_with_generate with stage pt",
        {"stage": "pt", "predict_with_generate": True},
        **fails("`predict_with_generate` cannot be set as True except SFT.", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "cross_do_predict_no_pwg",
        "cross",
        "do_predict without predict_with_generate",
        {"do_predict": True, **EVAL},
        **fails("Please enable `predict_with_generate` to save model predictions.", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "cross_quant_full",
        "cross",
        "quantization_bit with finetuning_type full",
        {"quantization_bit": 4, "finetuning_type": "full"},
        **fails("Quantization is only compatible with the LoRA or OFT method.", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "cross_empty_config",
        "cross",
        "an empty config file",
        raw_yaml=empty_file,
        **fails("Please provide `model_name_or_path`.", ONE_LINE),
    ),
    Case(
        "cross_comment_only",
        "cross",
        "a config of comments only",
        raw_yaml=comments_only,
        **fails("Please provide `model_name_or_path`.", ONE_LINE),
    ),
    Case(
        "cross_no_model",
        "cross",
        "no model_name_or_path",
        {"model_name_or_path": DELETE},
        **fails("Please provide `model_name_or_path`.", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "cross_no_dataset",
        "cross",
        "do_train without a dataset",
        {"dataset": DELETE},
        **fails("Please specify dataset for training.", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "cross_do_eval_no_data",
        "cross",
        "do_eval without val_size or eval_dataset",
        {"do_eval": True},
        **fails("Please make sure eval_dataset be provided or val_size", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "cross_eval_strategy_no_data",
        "cross",
        "eval_strategy steps turns do_eval on, no eval data",
        {"eval_strategy": "steps"},
        **fails("Please make sure eval_dataset be provided or val_size", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "cross_fp16_and_bf16",
        "cross",
        "fp16 and bf16 both true",
        {"fp16": True, "bf16": True},
        **fails("doesn't support bf16", "PRECISION_CONFLICT", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "cross_pure_bf16_cpu",
        "cross",
        "pure_bf16 where bf16 is not a GPU's",
        {"pure_bf16": True},
        **fails("This device does not support `pure_bf16`.", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "cross_neat_packing_rm",
        "cross",
        "neat_packing with stage rm",
        {"stage": "rm", "neat_packing": True},
        **fails("`neat_packing` cannot be set as True except SFT.", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "cross_train_on_prompt_pt",
        "cross",
        "train_on_prompt with stage pt",
        {"stage": "pt", "train_on_prompt": True},
        **fails("`train_on_prompt` or `mask_history` cannot be set as True except SFT.", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "cross_streaming_no_max_steps",
        "cross",
        "streaming without max_steps",
        {"streaming": True, "max_steps": DELETE, "max_samples": DELETE},
        **fails("Please specify `max_steps` in streaming mode.", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "cross_qlora_no_bnb",
        "cross",
        "quantization_bit 4 without bitsandbytes",
        {"quantization_bit": 4},
        **fails("'bitsandbytes>=0.39.0' distribution was not found", "PACKAGE_MISSING", "QLORA_BITSANDBYTES"),
    ),
    # data
    Case(
        "data_unknown_name",
        "data",
        "a dataset name not in dataset_info.json",
        {"dataset": "amd_finetune_qaa"},
        **fails("Undefined dataset amd_finetune_qaa in dataset_info.json.", "DATASET_UNKNOWN"),
    ),
    Case(
        "data_info_malformed",
        "data",
        "a dataset_info.json that is not JSON",
        build=malformed_dataset_info,
        **fails("Expecting property name enclosed in double quotes", "DATASET_INVALID"),
    ),
    Case(
        "data_file_missing",
        "data",
        "the entry's file is not there",
        build=missing_dataset_file,
        **fails("local_qa.json not found.", "DATASET_INVALID"),
    ),
    Case("data_all_empty", "data", "every response empty (LLaMA-Factory keeps such rows)", build=every_response_empty),
    Case(
        "data_three_missing_output",
        "data",
        "3 of 40 rows lack output: LLaMA-Factory drops them",
        build=three_of_forty_without_output,
    ),
    Case(
        "data_column_missing",
        "data",
        "a mapped column the file does not have",
        build=column_not_in_file,
        **fails("KeyError: 'question'", "DATASET_INVALID"),
    ),
    # output directory
    Case(
        "out_overwrite_checkpoint",
        "output",
        "overwrite_output_dir: true over an existing checkpoint (asked for: a warning naming it)",
        {"overwrite_output_dir": True},
        build=earlier_checkpoint,
        notes=frozenset({"CHECKPOINT_OVERWRITE"}),
    ),
    Case(
        "out_rotate_own_checkpoints",
        "output",
        "save_total_limit on a relaunch that resumes the run's own rank-8 checkpoint-1",
        {"save_total_limit": 1, "lora_rank": 8},
        build=resume_rank8,
        notes=frozenset({"CHECKPOINT_ROTATION", "RESUMES_FROM_CHECKPOINT"}),
    ),
    Case(
        "out_rotate_other_experiment",
        "output",
        "save_total_limit that would rotate away another base model's checkpoint-1",
        {"save_total_limit": 1, "lora_rank": 8},
        build=another_experiments_checkpoint,
        protective=True,
        **fails("", "CHECKPOINT_ROTATION"),
    ),
    Case(
        "out_final_adapter",
        "output",
        "output_dir already holds a final adapter",
        build=final_adapter_present,
        **fails("Output directory already exists and is not empty.", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "out_interrupted_checkpoint",
        "output",
        "an empty checkpoint-3 left by a cut-short save",
        build=interrupted_checkpoint,
        **fails("Can't find a valid checkpoint at", "CHECKPOINT_NOT_LOADABLE"),
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
    Case(
        "flags_typo",
        "flags",
        "--lora_rnk, a typo of --lora_rank",
        flags=True,
        extra_flags=("--lora_rnk", "8"),
        **fails("Some specified arguments are not used by the HfArgumentParser: ['--lora_rnk', '8']", "UNKNOWN_KEY"),
    ),
    Case(
        "flags_prefix",
        "flags",
        "--learning_rat: argparse takes a unique prefix of --learning_rate",
        flags=True,
        extra_flags=("--learning_rat", "1e-4"),
    ),
    Case(
        "flags_max_steps_abc",
        "flags",
        "--max_steps abc",
        {"max_steps": "abc"},
        flags=True,
        **fails("argument --max_steps/--max-steps: invalid int value: 'abc'", "VALUE_INVALID"),
    ),
    Case(
        "flags_bf16_maybe",
        "flags",
        "--bf16 maybe",
        {"bf16": "maybe"},
        flags=True,
        **fails("argument --bf16: Truthy value expected: got maybe", "VALUE_INVALID"),
    ),
    Case(
        "flags_pwg_stage_pt",
        "flags",
        "--stage pt --predict_with_generate",
        {"stage": "pt", "predict_with_generate": True},
        flags=True,
        **fails("`predict_with_generate` cannot be set as True except SFT.", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "flags_unknown_dataset",
        "flags",
        "--dataset with a name not in dataset_info.json",
        {"dataset": "nope"},
        flags=True,
        **fails("Undefined dataset nope in dataset_info.json.", "DATASET_UNKNOWN"),
    ),
    # every stage, with the data it needs and with data it cannot use (DPO and RM read ranking pairs,
    # KTO a kto_tag column, PT plain text; the DPO workflow passes stage="rm" to the data pipeline)
    Case(
        "stage_sft_on_pairs",
        "stage",
        "sft on a ranking dataset",
        build=pairs,
        **fails(NOT_APPLICABLE, "DATA_PIPELINE_REFUSED", "DATASET_INVALID"),
    ),
    Case("stage_pt_text", "stage", "pt on a plain-text dataset", {"stage": "pt"}, build=plain_text),
    Case("stage_pt_alpaca", "stage", "pt on the bundled alpaca rows", {"stage": "pt"}),
    Case(
        "stage_pt_on_pairs",
        "stage",
        "pt on a ranking dataset",
        {"stage": "pt"},
        build=pairs,
        **fails(NOT_APPLICABLE, "DATA_PIPELINE_REFUSED", "DATASET_INVALID"),
    ),
    Case("stage_rm_pairs", "stage", "rm on a ranking dataset", {"stage": "rm"}, build=pairs),
    Case(
        "stage_rm_on_sft_data",
        "stage",
        "rm on alpaca rows",
        {"stage": "rm"},
        **fails(NOT_APPLICABLE, "DATA_PIPELINE_REFUSED", "DATASET_INVALID"),
    ),
    Case("stage_dpo_pairs", "stage", "dpo on a ranking dataset (hook on: trains)", {"stage": "dpo"}, build=pairs),
    Case("stage_dpo_orpo_loss", "stage", "dpo with pref_loss orpo", {"stage": "dpo", "pref_loss": "orpo"}, build=pairs),
    Case(
        "stage_dpo_on_sft_data",
        "stage",
        "dpo on alpaca rows",
        {"stage": "dpo"},
        **fails(NOT_APPLICABLE, "DATA_PIPELINE_REFUSED", "DATASET_INVALID"),
    ),
    Case(
        "stage_dpo_loss_unknown",
        "stage",
        "pref_loss is a choice",
        {"stage": "dpo", "pref_loss": "hinge2"},
        build=pairs,
        notes=frozenset({"VALUE_NOT_A_CHOICE"}),
    ),
    Case("stage_kto_tagged", "stage", "kto on rows with a kto_tag column", {"stage": "kto"}, build=kto_rows),
    Case(
        "stage_kto_untagged",
        "stage",
        "kto on alpaca rows without kto_tag",
        {"stage": "kto"},
        **fails("Cannot find valid samples", "DATASET_INVALID", "DATA_PIPELINE_REFUSED"),
    ),
    Case(
        "stage_kto_on_pairs",
        "stage",
        "kto on a ranking dataset",
        {"stage": "kto"},
        build=pairs,
        **fails(NOT_APPLICABLE, "DATA_PIPELINE_REFUSED", "DATASET_INVALID"),
    ),
    Case(
        "stage_ppo_no_reward_model",
        "stage",
        "ppo without reward_model",
        {"stage": "ppo"},
        **fails("`reward_model` is necessary for PPO training.", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "stage_ppo_reward_model",
        "stage",
        "ppo with the tiny model as a full reward model",
        {"stage": "ppo", "reward_model_type": "full"},
        build=lambda d, c: c.update(reward_model=c["model_name_or_path"]),
        **fails("trl>=0.8.6,<=0.9.6 is required", "STAGE_PACKAGE_VERSION"),
    ),
    # values as LLaMA-Factory receives them from YAML (parse_dict converts nothing)
    Case(
        "value_lr_quoted",
        "value",
        'learning_rate: "5e-5" quoted: coerced, trains',
        raw_yaml=quoted_lr("5e-5"),
        notes=frozenset({"VALUE_COERCED"}),
    ),
    Case(
        "value_cutoff_quoted",
        "value",
        'cutoff_len: "1024" quoted: coerced, trains',
        {"cutoff_len": "1024"},
        notes=frozenset({"VALUE_COERCED"}),
    ),
    Case(
        "value_max_steps_float",
        "value",
        "max_steps: 2.0, a whole number written as a float",
        {"max_steps": 2.0},
        notes=frozenset({"VALUE_COERCED"}),
    ),
    Case(
        "value_lora_rank_float",
        "value",
        "lora_rank: 8.0, a whole number written as a float",
        {"lora_rank": 8.0},
        notes=frozenset({"VALUE_COERCED"}),
    ),
    Case(
        "value_lr_quoted_junk",
        "value",
        'learning_rate: "5e-5x": no number',
        raw_yaml=quoted_lr("5e-5x"),
        **fails("not supported between instances of 'float' and 'str'", "VALUE_INVALID"),
    ),
    Case(
        "value_batch_zero",
        "value",
        "per_device_train_batch_size: 0",
        {"per_device_train_batch_size": 0},
        **fails("batch_size should be a positive integer value, but got batch_size=0", "BATCH_REFUSED"),
    ),
    Case(
        "value_lora_rank_zero",
        "value",
        "lora_rank: 0",
        {"lora_rank": 0},
        **fails(
            "`r` should be a positive integer value but the value passed is 0", "MODEL_MODULES_REFUSED", "VALUE_INVALID"
        ),
    ),
    Case(
        "value_val_size_over_rows",
        "value",
        "val_size 100 of 8 rows",
        {"val_size": 100},
        **fails(
            "test_size=100 should be either positive and smaller than the number of samples 8", "DATA_SPLIT_REFUSED"
        ),
    ),
    Case(
        "value_interleave_probs_bad",
        "value",
        "interleave probabilities summing to 0.6",
        build=two_datasets("0.3,0.3"),
        **fails("Probabilities do not sum to 1", "DATA_PIPELINE_REFUSED", "DATA_SPLIT_REFUSED"),
    ),
    Case(
        "value_interleave_probs_good", "value", "interleave probabilities summing to 1", build=two_datasets("0.5,0.5")
    ),
    Case(
        "value_optim_bnb",
        "value",
        "optim adamw_bnb_8bit without bitsandbytes",
        {"optim": "adamw_bnb_8bit"},
        **fails("You need to install `bitsandbytes` in order to use bitsandbytes optimizers", "OPTIMIZER_UNAVAILABLE"),
    ),
    Case(
        "value_report_to_wandb",
        "value",
        "report_to wandb without wandb",
        {"report_to": "wandb"},
        **fails("WandbCallback requires wandb to be installed.", "REPORTER_UNAVAILABLE"),
    ),
    Case(
        "value_warmup_quoted",
        "value",
        'warmup_steps: "1" quoted',
        {"warmup_steps": "1"},
        notes=frozenset({"VALUE_COERCED"}),
    ),
    # the model, its modules, the template, adapters and tokenized data
    Case(
        "model_lora_target_c_attn",
        "model",
        "lora_target c_attn on a Llama",
        {"lora_target": "c_attn"},
        **fails("Target modules {'c_attn'} not found in the base model", "MODEL_MODULES_REFUSED"),
    ),
    Case("model_lora_target_q_proj", "model", "lora_target q_proj", {"lora_target": "q_proj"}),
    Case(
        "model_freeze_self_attention",
        "model",
        "freeze_trainable_modules self_attention on a Llama",
        {"finetuning_type": "freeze", "freeze_trainable_modules": "self_attention"},
        **fails("Module self_attention is not found", "MODEL_MODULES_REFUSED"),
    ),
    Case(
        "model_freeze_good",
        "model",
        "freeze the last layer's mlp",
        {"finetuning_type": "freeze", "freeze_trainable_layers": 1, "freeze_trainable_modules": "mlp"},
    ),
    Case(
        "model_full",
        "model",
        "full fine-tuning of the tiny model",
        {"finetuning_type": "full", "learning_rate": 1.0e-4},
    ),
    Case(
        "model_template_list",
        "model",
        "template: [llama3], a list",
        {"template": ["llama3"]},
        **fails("unhashable type: 'list'", "TEMPLATE_REFUSED", "VALUE_INVALID"),
    ),
    Case(
        "model_glm4_train_on_prompt",
        "model",
        "train_on_prompt with glm4 (efficient_eos)",
        {"template": "glm4", "train_on_prompt": True},
        **fails("Current template does not support `train_on_prompt`.", "TEMPLATE_REFUSED"),
    ),
    Case(
        "model_path_missing",
        "model",
        "a model folder that does not exist",
        build=missing_model,
        **fails("Failed to load tokenizer.", "MODEL_NOT_FOUND"),
    ),
    Case(
        "model_adapter_missing",
        "model",
        "an adapter folder that does not exist",
        build=missing_adapter,
        **fails("Can't find 'adapter_config.json'", "MODEL_NOT_FOUND"),
    ),
    Case(
        "model_tokenized_other_tokenizer",
        "model",
        "tokenized_path saved from another tokenizer",
        build=tokenized_by_another_tokenizer,
        **fails("index out of range", "TOKENIZED_DATA_MISMATCH"),
    ),
    Case(
        "model_tokenized_this_tokenizer",
        "model",
        "tokenized_path saved from this tokenizer",
        build=tokenized_by_this_tokenizer,
    ),
    Case(
        "model_8b_shaped_good",
        "model",
        "Llama-3-8B config.json, no weights, lora_target all",
        build=llama3_8b_shaped("all"),
        check_only=True,
    ),
    Case(
        "model_8b_shaped_c_attn",
        "model",
        "Llama-3-8B config.json, no weights, lora_target c_attn",
        build=llama3_8b_shaped("c_attn"),
        check_only=True,
        **fails("Target modules {'c_attn'} not found", "MODEL_MODULES_REFUSED"),
    ),
    # resuming, and output_dir itself
    Case(
        "resume_same_rank",
        "resume",
        "output_dir holds a rank-8 checkpoint-1, resumed with rank 8",
        {"lora_rank": 8},
        build=resume_rank8,
        notes=frozenset({"RESUMES_FROM_CHECKPOINT"}),
    ),
    Case(
        "resume_other_rank",
        "resume",
        "output_dir holds a rank-8 checkpoint-1, resumed with rank 16",
        {"lora_rank": 16},
        build=resume_rank8,
        **fails("size mismatch for base_model.model.model.layers.0", "CHECKPOINT_MISMATCH"),
    ),
    Case(
        "resume_explicit",
        "resume",
        "resume_from_checkpoint naming a rank-8 checkpoint elsewhere",
        build=resume_rank8_explicitly,
        notes=frozenset({"RESUMES_FROM_CHECKPOINT"}),
    ),
    Case(
        "resume_missing",
        "resume",
        "resume_from_checkpoint that does not exist",
        build=missing_resume_checkpoint,
        **fails("Can't find a valid checkpoint at", "CHECKPOINT_NOT_LOADABLE"),
    ),
    Case(
        "resume_output_dir_is_file",
        "resume",
        "output_dir is a file",
        build=output_dir_is_a_file,
        **fails("File exists", "OUTPUT_DIR_NOT_A_FOLDER"),
    ),
    Case(
        "resume_zero3_with_deepspeed",
        "resume",
        "a ZeRO-3 checkpoint folder, deepspeed: set (not installed here)",
        build=deepspeed_zero3_checkpoint(True),
        **fails(
            "'deepspeed>=0.9.3' distribution was not found",
            "LLAMAFACTORY_REFUSED",
            "PACKAGE_MISSING",
            forbid=frozenset({"CHECKPOINT_NOT_LOADABLE"}),
        ),
    ),
    Case(
        "resume_zero3_without_deepspeed",
        "resume",
        "a ZeRO-3 checkpoint folder, no deepspeed: no weights transformers can load",
        build=deepspeed_zero3_checkpoint(False),
        **fails("Can't find a valid checkpoint", "CHECKPOINT_NOT_LOADABLE"),
    ),
    # the config file's form, as LLaMA-Factory's read_args reads it
    Case(
        "form_file_then_flags",
        "form",
        "cfg.yaml --lora_rank 8",
        tail=("--lora_rank", "8"),
        **fails("Some keys are not used by the HfArgumentParser: ['--lora_rank', '8']", ONE_LINE),
    ),
    Case("form_file_then_dotlist", "form", "cfg.yaml lora_rank=8 (OmegaConf's override form)", tail=("lora_rank=8",)),
    Case(
        "form_yaml_list",
        "form",
        "a YAML list",
        raw_yaml=yaml_list,
        **fails("Cannot merge incompatible container types", ONE_LINE),
    ),
    Case(
        "form_yaml_scalar",
        "form",
        "a YAML scalar",
        raw_yaml=yaml_scalar,
        **fails("Please provide `model_name_or_path`.", ONE_LINE, "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "form_json_file",
        "form",
        "the config as a .json file",
        raw_yaml=as_json,
        config_name="config.json",
        **fails("'PosixPath' object has no attribute 'read'", ONE_LINE),
    ),
    Case("form_yml_suffix", "form", "the config as a .yml file", config_name="config.yml"),
    # dataset_info.json entries
    Case("data_entry_comment", "data", "an entry with a comment key LLaMA-Factory ignores", build=entry_with_comment),
    Case(
        "data_entry_misspelt_key",
        "data",
        "an entry with `colums` (ignored; alpaca's defaults apply)",
        build=entry_with_misspelt_key,
    ),
    Case(
        "data_entry_sharegpt_with_prompt",
        "data",
        "a sharegpt entry that also maps a prompt column (its converter ignores it)",
        build=sharegpt_entry_with_prompt,
        notes=frozenset({"DATASET_ENTRY_IGNORED"}),
    ),
    Case(
        "data_entry_alpaca_with_messages",
        "data",
        "an alpaca entry that also maps a messages column (its converter ignores it)",
        build=alpaca_entry_with_messages,
        notes=frozenset({"DATASET_ENTRY_IGNORED"}),
    ),
    Case(
        "cross_neat_packing_rm_pairs",
        "cross",
        "neat_packing with stage rm, on a ranking dataset: the parser's refusal alone",
        {"stage": "rm", "neat_packing": True},
        build=pairs,
        **fails("`neat_packing` cannot be set as True except SFT.", "LLAMAFACTORY_REFUSED"),
    ),
    # --- issue 37: launch parts the dry run skipped; each record is the stock run's (hook off), run for it ---
    Case(
        "value_dataloader_workers_negative",
        "value",
        "dataloader_num_workers: -1 (torch's DataLoader refuses it when the trainer builds it)",
        {"dataloader_num_workers": -1},
        **fails("num_workers option should be non-negative", "DATALOADER_REFUSED"),
    ),
    Case(
        "value_dataloader_persistent_without_workers",
        "value",
        "dataloader_persistent_workers: true without dataloader workers",
        {"dataloader_persistent_workers": True},
        **fails("persistent_workers option needs num_workers > 0", "DATALOADER_REFUSED"),
    ),
    Case(
        "value_eval_batch_size_zero",
        "value",
        "per_device_eval_batch_size: 0 with step evaluation (the eval dataloader)",
        {**EVAL, "per_device_eval_batch_size": 0},
        **fails("batch_size should be a positive integer value, but got batch_size=0", "BATCH_REFUSED"),
    ),
    Case(
        "value_preprocessing_workers_zero",
        "value",
        "preprocessing_num_workers: 0 (datasets' num_proc)",
        {"preprocessing_num_workers": 0},
        **fails("num_proc must be an integer > 0.", "DATA_WORKERS_REFUSED"),
    ),
    Case(
        "value_metric_for_best_model_not_reported",
        "value",
        "metric_for_best_model: accuracy in sft without compute_accuracy (evaluated each step)",
        {**EVAL, "metric_for_best_model": "accuracy", "save_steps": 1},
        **fails(
            "The `metric_for_best_model` training argument is set to 'eval_accuracy', which is not found",
            "METRIC_NOT_REPORTED",
        ),
    ),
    Case(
        "value_metric_for_best_model_accuracy_computed",
        "value",
        "metric_for_best_model: accuracy with compute_accuracy: true (the fix of the case above)",
        {**EVAL, "metric_for_best_model": "accuracy", "save_steps": 1, "compute_accuracy": True},
    ),
    Case(
        "value_metric_for_best_model_pt_accuracy",
        "value",
        "metric_for_best_model: accuracy in pt (its workflow computes no metric)",
        {**EVAL, "stage": "pt", "metric_for_best_model": "accuracy", "save_steps": 1},
        **fails("set to 'eval_accuracy', which is not found in the evaluation metrics", "METRIC_NOT_REPORTED"),
    ),
    Case(
        "value_metric_for_best_model_rm_accuracy",
        "value",
        "metric_for_best_model: accuracy in rm (its workflow's ComputeAccuracy reports it)",
        {**EVAL, "stage": "rm", "metric_for_best_model": "accuracy", "save_steps": 1},
        build=pairs,
    ),
    Case(
        "value_fsdp_single_process",
        "value",
        "fsdp: full_shard in one process on this CPU-only machine",
        {"fsdp": "full_shard"},
        **fails("There are currently no available devices found", "FSDP_REFUSED"),
    ),
    Case(
        "output_dir_parent_is_a_file",
        "output",
        "output_dir under a file (os.makedirs: Not a directory)",
        build=output_dir_under_a_file,
        **fails("Not a directory", "OUTPUT_DIR_NOT_CREATABLE"),
    ),
    Case(
        "output_dir_in_proc",
        "output",
        "output_dir in /proc, where no folder can be made",
        {"output_dir": "/proc/lfrocm-verdict-out"},
        **fails("No such file or directory: '/proc/lfrocm-verdict-out'", "OUTPUT_DIR_NOT_CREATABLE"),
    ),
    Case(
        "model_hub_id_offline_not_cached",
        "model",
        "a Hub model id never downloaded, HF_HUB_OFFLINE=1 (the corpus's environment)",
        {"model_name_or_path": "lfrocm-test/not-downloaded-model"},
        **fails("Failed to load tokenizer.", "MODEL_NOT_FOUND"),
    ),
    Case(
        "data_hub_dataset_offline_not_cached",
        "data",
        "a dataset_info.json entry with hf_hub_url never downloaded, HF_DATASETS_OFFLINE=1",
        build=hub_dataset_not_downloaded,
        **fails(
            "Couldn't reach 'lfrocm-test/not-downloaded' on the Hub (OfflineModeIsEnabled)",
            "DATASET_NOT_IN_CACHE_OFFLINE",
        ),
    ),
    Case(
        "resume_state_field_of_a_newer_version",
        "resume",
        "resume_from_checkpoint whose trainer_state.json has a field this transformers lacks",
        build=trainer_state_from_another_version(a_field_of_a_newer_version, explicit=True),
        **fails("got an unexpected keyword argument 'a_field_of_a_newer_version'", "CHECKPOINT_STATE_INCOMPATIBLE"),
    ),
    Case(
        "resume_state_without_stateful_callbacks",
        "resume",
        "output_dir's checkpoint-1 with a trainer_state.json of transformers < 4.41 (no stateful_callbacks)",
        build=trainer_state_from_another_version(no_stateful_callbacks, explicit=False),
        **fails("KeyError: 'TrainerControl'", "CHECKPOINT_STATE_INCOMPATIBLE"),
    ),
)


# --- running ---------------------------------------------------------------------------------------


def base_config(model: Path, output_dir: Path) -> dict[str, Any]:
    # plot_loss: false, written out: check would add it (PLOT_LOSS_ADDED), and each run would draw a plot.
    return tiny_train_config(
        model, output_dir, max_steps=1, max_samples=8, cutoff_len=64, per_device_train_batch_size=2, plot_loss=False
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
        path = case_dir / case.config_name
        path.write_text(text, encoding="utf-8")
        args = [str(path), *case.tail]
    return Prepared(case, case_dir, output_dir, args, digests(output_dir))


def case_env(case: Case, folder: Path, **extra: str) -> dict[str, str]:
    env = offline_env(folder, **SUBPROCESS_ENV, **extra)
    for key, value in case.env:
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@dataclass
class CheckResult:
    exit: int
    errors: list[str]  # error codes (exit 2: ONE_LINE)
    codes: list[str]
    text: str  # what check printed, and every finding's message
    rewrote: bool = True  # the resolved config or the environment differs from the input (unknown: True)

    @property
    def refused(self) -> bool:
        return self.exit in (1, 2)


CODE = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]{2,}\b")


def run_check(prep: Prepared) -> CheckResult:
    """``llamafactory-rocm check ARGS --json`` in this process, from the case's folder."""
    from llamafactory_rocm.cli.main import main

    env = case_env(prep.case, prep.case_dir)
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(prep.case_dir)
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "FORCE_TORCHRUN", "LLAMAFACTORY_ROCM_CHECKED"):
            mp.delenv(key, raising=False)
        for key in ("HF_HOME", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TOKENIZERS_PARALLELISM", "WANDB_DISABLED"):
            if key in env:
                mp.setenv(key, env[key])
            else:
                mp.delenv(key, raising=False)
        for key, value in prep.case.env:
            if value is None:
                mp.delenv(key, raising=False)
            else:
                mp.setenv(key, value)
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
        text = text + "\n" + "\n".join(str(f.get("message", "")) for f in findings)
        # compared as JSON text: 8.0 == 8 in Python, and coercing a float lora_rank to 8 is a rewrite
        written = json.dumps(input_config(prep), sort_keys=True, default=str)
        rewrote = bool(report["env_changes"]) or json.dumps(report["config"], sort_keys=True, default=str) != written
    except (ValueError, KeyError, TypeError):
        errors, codes, rewrote = [], sorted(set(CODE.findall(text))), True
        if code == 2:  # the one-line refusal of a config LLaMA-Factory cannot read
            errors, codes = [ONE_LINE], [ONE_LINE]
    return CheckResult(int(code), errors, codes, text, rewrote)


def input_config(prep: Prepared) -> dict[str, Any] | None:
    """The config as the user wrote it, where it is a plain YAML file and nothing else (no flags after it, no
    environment of its own); None otherwise (then check's resolved config is not compared: asked with the hook)."""
    if prep.case.flags or prep.case.tail or prep.case.env or not prep.args[0].endswith((".yaml", ".yml")):
        return None
    loaded = yaml.safe_load(Path(prep.args[0]).read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else None


@dataclass
class TrainResult:
    exit: int
    state: str  # "finished", "not started" or "partial"
    last_error: str


def train_state(prep: Prepared, exit_code: int, output_dir: Path | None = None) -> str:
    out = output_dir or prep.output_dir
    after = digests(out)
    weights_written = any(name in after and after[name] != prep.before.get(name) for name in WEIGHTS)
    earlier_kept = all(after.get(name) == digest for name, digest in prep.before.items())
    new_checkpoint = any(name.startswith("checkpoint-") and name not in prep.before for name in after)
    return state_of(exit_code, weights_written, new_checkpoint, earlier_kept)


def state_of(exit_code: int, weights_written: bool, new_checkpoint: bool, earlier_kept: bool) -> str:
    """ "finished" (exit 0, weights written), "not started" (refused with nothing written and what was there
    kept), else "partial"."""
    if exit_code == 0 and weights_written:
        return "finished"
    if exit_code != 0 and not weights_written and not new_checkpoint and earlier_kept:
        return "not started"
    return "partial"


def last_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    marked = [line for line in lines if re.search(r"error|refus|not ok|exit", line, re.IGNORECASE)]
    return ((marked or lines or [""])[-1])[:200]


def run_training(prep: Prepared, env: dict[str, str]) -> TrainResult:
    """Stock ``llamafactory-cli train ARGS``, hook on, from the case's folder."""
    try:
        proc = subprocess.run(
            [LLAMAFACTORY_CLI, "train", *prep.args],
            cwd=prep.case_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=TRAIN_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return TrainResult(-1, train_state(prep, -1), f"timed out after {TRAIN_TIMEOUT_S}s")
    (prep.case_dir / "train.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    return TrainResult(proc.returncode, train_state(prep, proc.returncode), last_error_line(proc.stderr or proc.stdout))


# LLaMA-Factory alone (hook off): each case as `llamafactory-cli train ARGS` runs it, one process for all
# (tests/stock_runner.py, the same runner as the property oracle's).
# A case's stock outcome may be the recorded one (tests/stock_runner.py: recorded with the installed versions,
# keyed by every file the run reads; a rotating share and every case without a record run for real).
def run_alone(items: list[tuple[Prepared, Prepared]], work: Path, env: dict[str, str]) -> dict[str, TrainResult]:
    if not items:
        return {}
    cases = [{"id": a.case.id, "dir": str(a.case_dir), "args": a.args, "env": a.case.env} for _, a in items]
    raw, proc = stock_runner.run_alone(cases, work, env, name="alone", timeout=TRAIN_TIMEOUT_S * 3, replay=True)
    results = {}
    for _, alone in items:
        got = raw.get(alone.case.id)
        if got is None:  # the runner died before this case: say so, never guess
            results[alone.case.id] = TrainResult(-1, "partial", last_error_line(proc.stderr) or "runner died")
        else:
            state = changes_state(alone, got["exit"], got["wrote"], got["removed"])
            if not got.get("replayed"):  # what a recorded run's state is read from gives the disk's answer
                assert state == train_state(alone, got["exit"]), (alone.case.id, got["wrote"], got["removed"])
            results[alone.case.id] = TrainResult(got["exit"], state, got["error"])
    return results


def changes_state(prep: Prepared, exit_code: int, wrote: list[str], removed: list[str]) -> str:
    """``train_state`` from what the run wrote and removed in its case's folder (a recorded run's files are
    not on this disk); the same answer as ``train_state`` from the output folder's digests."""
    out = prep.output_dir.relative_to(prep.case_dir)
    inside = {str(Path(p).relative_to(out)) for p in wrote if Path(p).is_relative_to(out)}
    gone = {str(Path(p).relative_to(out)) for p in removed if Path(p).is_relative_to(out)}
    weights_written = any(name in inside for name in WEIGHTS)
    earlier_kept = not (set(prep.before) & (inside | gone))
    new_checkpoint = any(name.startswith("checkpoint-") and name not in prep.before for name in inside)
    return state_of(exit_code, weights_written, new_checkpoint, earlier_kept)


def peft_on_meta(prep: Prepared) -> TrainResult:
    """The oracle of a check-only case (a model shape, no weights): peft's ``get_peft_model`` on the model
    transformers builds from its config.json on the meta device, LoRA on the modules LLaMA-Factory targets
    (its own ``find_all_linear_modules`` for ``all``). "finished" here: peft adapted the model."""
    import torch
    from llamafactory.model.model_utils.misc import find_all_linear_modules
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = yaml.safe_load(Path(prep.args[0]).read_text(encoding="utf-8"))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config["model_name_or_path"]))
    target = str(config.get("lora_target", "all"))
    modules = find_all_linear_modules(model, True) if target == "all" else [t.strip() for t in target.split(",")]
    try:
        get_peft_model(model, LoraConfig(r=int(config.get("lora_rank", 8)), target_modules=modules))
    except Exception as err:  # peft's refusal, in its words
        return TrainResult(1, "not started", f"{type(err).__name__}: {err}")
    return TrainResult(0, "finished", "")


def alone_env(work: Path) -> dict[str, str]:
    return stock_runner.hook_off_env(work, **SUBPROCESS_ENV)


@dataclass
class Outcome:
    case: Case
    check: CheckResult
    train: TrainResult | None  # stock, hook on (None: a check-only case, or a refusal not run with the hook)
    alone: TrainResult | None  # LLaMA-Factory with the hook off, for the cases recorded to fail or refused

    @property
    def stock(self) -> str:
        """What the stock run did: "trains" or "fails" (a check-only case: what is recorded)."""
        runs = [r for r in (self.train, self.alone) if r is not None]
        return "trains" if any(r.state == "finished" for r in runs) else "fails"

    @property
    def stock_words(self) -> str:
        run = self.alone or self.train
        return run.last_error if run is not None else ""

    @property
    def record_problem(self) -> str | None:
        """The stock run did not do what the case records (the record, or the library, changed)."""
        if self.stock != self.case.expect:
            return f"stock run {self.stock}, recorded {self.case.expect}"
        if self.case.expect == "fails" and self.case.words and self.case.words not in self.stock_words:
            return f"stock failed without the words {self.case.words!r}"
        return None

    @property
    def verdict_problem(self) -> str | None:
        """Why the verdicts disagree, or None when they agree."""
        if self.check.exit not in (0, 1, 2):
            return f"check exit {self.check.exit} (neither ok nor a refusal)"
        if self.train is not None:
            if self.check.exit == 0 and self.train.state != "finished":
                return "check ok, training did not finish"
            if self.check.refused and self.train.state != "not started":
                return f"check refused, training {self.train.state}"
            if self.check.refused and self.alone is not None and self.alone.state == "finished":
                return "check refused a run LLaMA-Factory alone trains"
        if (self.check.exit == 0) != (self.stock == "trains"):
            return f"check {'ok' if self.check.exit == 0 else 'refused'}, stock {self.stock}"
        return None

    @property
    def kind_problem(self) -> str | None:
        """Both refuse but check names another kind of failure (neither one of the case's codes nor the
        library's words in its messages), or check says ok without a finding the case expects."""
        bad = sorted(self.case.forbid & set(self.check.codes))
        if bad:
            return f"check gave {bad}, which this case must not be called"
        if self.check.refused and self.stock == "fails" and self.case.codes:
            by_code = bool(self.case.codes & set(self.check.errors))
            by_words = bool(self.case.words) and self.case.words in self.check.text
            if not (by_code or by_words):
                return f"check refused with {self.check.errors}, not one of {sorted(self.case.codes)}"
        if self.check.exit == 0 and not self.case.notes <= set(self.check.codes):
            return f"check did not report {sorted(self.case.notes - set(self.check.codes))}"
        return None

    @property
    def problem(self) -> str | None:
        return self.verdict_problem or self.kind_problem or self.record_problem

    def row(self) -> str:
        check_codes = ",".join(self.check.errors) or (
            "(" + ",".join(self.check.codes) + ")" if self.check.codes else "-"
        )
        if self.check.exit not in (0, 1):
            check_codes = last_error_line(self.check.text)[:80]
        if self.case.check_only:
            train = "not run (check only)"
        elif self.train is None:
            why = "check's own refusal" if self.check.refused else "check passed it unchanged"
            train = f"hook on: not run ({why}; LF alone asked)"
        else:
            train = f"{self.train.exit} {self.train.state}: {self.train.last_error[:110]}"
        alone = (
            f" | LF alone: {self.alone.exit} {self.alone.state}: {self.alone.last_error[:160]}" if self.alone else ""
        )
        return f"{self.case.id:<30} | check {self.check.exit} {check_codes:<40} | train {train}{alone} | {self.problem}"

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.case.id,
            "category": self.case.category,
            "reason": self.case.reason,
            "expect": self.case.expect,
            "words": self.case.words,
            "codes": sorted(self.case.codes),
            "xfail": self.case.xfail,
            "stock": self.stock,
            "agree": self.problem is None,
            "verdict_agree": self.verdict_problem is None,
            "kind_agree": self.kind_problem is None,
            "record_ok": self.record_problem is None,
            "problem": self.problem,
            "check": self.check.__dict__,
            "train": None if self.train is None else self.train.__dict__,
            "alone": None if self.alone is None else self.alone.__dict__,
        }


def table(outcomes: list[Outcome]) -> str:
    bad = [o for o in outcomes if o.problem]
    refused_both = [o for o in outcomes if o.check.refused and o.stock == "fails"]
    head = (
        f"{len(outcomes) - len(bad)} of {len(outcomes)} agree; verdict "
        f"{sum(o.verdict_problem is None for o in outcomes)}/{len(outcomes)}, kind of failure "
        f"{sum(o.kind_problem is None for o in refused_both)}/{len(refused_both)} of those both refuse"
    )
    return "\n".join([head, *(o.row() for o in bad)])


# The categories whose first pass and first refusal the hook runs too: where the config reaches the hook
# another way than a YAML file read in place (flags, a file then flags or key=value, data files found from the
# launcher's folder) or the hook meets what is on disk (outputs, a checkpoint to resume). In the others (type,
# key, cross, stage, value, model) a YAML file arrives as check reads it, check's verdict is compared with
# LLaMA-Factory alone, and the hook runs every rewrite among them.
HOOK_ARRIVALS = {"good", "flags", "form", "data", "output", "resume"}


def wants_hook_run(case: Case, check: CheckResult, hooked: set[tuple[str, bool]]) -> bool:
    """Stock ``llamafactory-cli train`` with the hook on, for: every case check passes with a rewrite (the
    rewritten config must train), every protective refusal (what was on disk must be kept), and the first
    case check passes and the first it refuses of each category in HOOK_ARRIVALS (the hook trains it; the hook
    stops the run before anything is written). The hook's other refusals are check's own, by the same code, and
    a config check passes unchanged is handed to LLaMA-Factory as it is: LLaMA-Factory alone is asked about each of
    them. ``VERDICT_CORPUS_HOOK_ALL=1`` runs the hook on all."""
    if case.check_only:
        return False
    if os.environ.get("VERDICT_CORPUS_HOOK_ALL") or case.protective or (not check.refused and check.rewrote):
        return True
    if case.category not in HOOK_ARRIVALS or (case.category, check.refused) in hooked:
        return False
    hooked.add((case.category, check.refused))
    return True


def selected_cases() -> tuple[Case, ...]:
    only = os.environ.get("VERDICT_CORPUS_ONLY")
    return tuple(c for c in CASES if not only or re.search(only, c.id))


@pytest.fixture(scope="module")
def corpus(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Outcome]]:
    import time

    started = time.monotonic()
    root = tmp_path_factory.mktemp("corpus")
    cases = selected_cases()
    prepared = [prepare(case, tiny_model, root / case.id) for case in cases]
    stock = [p for p in prepared if not p.case.check_only]
    # LLaMA-Factory alone for every case recorded to fail, from the start, beside the hook-on runs
    first = [(p, prepare(p.case, tiny_model, root / "alone" / p.case.id)) for p in stock if p.case.expect == "fails"]
    first = [(p, a) for p, a in first if not p.case.protective]
    checks: dict[str, CheckResult] = {}
    trainings: dict[str, Future[TrainResult]] = {}
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        alone_futures = [pool.submit(run_alone, first, root / "alone", alone_env(root / "alone"))]
        hooked: set[tuple[str, bool]] = set()
        for p in prepared:  # each check before its own case's training touches that output_dir
            checks[p.case.id] = run_check(p)
            if wants_hook_run(p.case, checks[p.case.id], hooked):
                # envs are made here: only this thread changes os.environ
                trainings[p.case.id] = pool.submit(run_training, p, case_env(p.case, p.case_dir))
        # and for every other case check refuses: a wrong refusal would look like agreement with the hook on
        asked = {p.case.id for p, _ in first}
        more = [
            (p, prepare(p.case, tiny_model, root / "alone-refused" / p.case.id))
            for p in stock
            if checks[p.case.id].refused and not p.case.protective and p.case.id not in asked
        ]
        alone_futures.append(pool.submit(run_alone, more, root / "alone-refused", alone_env(root / "alone-refused")))
        # and every case check passed unchanged that the hook did not run: LLaMA-Factory alone must train it
        unchanged = [
            (p, prepare(p.case, tiny_model, root / "alone-passed" / p.case.id))
            for p in stock
            if not checks[p.case.id].refused and p.case.id not in trainings and p.case.id not in asked
        ]
        alone_futures.append(pool.submit(run_alone, unchanged, root / "alone-passed", alone_env(root / "alone-passed")))
        alone = {p.case.id: peft_on_meta(p) for p in prepared if p.case.check_only}
        for future in alone_futures:
            alone.update(future.result())
        outcomes = {
            p.case.id: Outcome(
                p.case,
                checks[p.case.id],
                trainings[p.case.id].result() if p.case.id in trainings else None,
                alone.get(p.case.id),
            )
            for p in prepared
        }
    elapsed = time.monotonic() - started
    if os.environ.get("VERDICT_CORPUS_JSON"):
        Path(os.environ["VERDICT_CORPUS_JSON"]).write_text(
            json.dumps(
                {"seconds": round(elapsed, 1), "cases": [o.as_json() for o in outcomes.values()]},
                indent=1,
                default=str,
            ),
            encoding="utf-8",
        )
    print(f"\nverdict corpus: {len(outcomes)} cases in {elapsed:.0f} s\n{table(list(outcomes.values()))}")
    yield outcomes


STAGES = ("sft", "pt", "rm", "dpo", "kto", "ppo")


def case_stage(case: Case) -> str:
    return str(case.changes.get("stage", "sft"))


def test_every_code_the_corpus_names_is_a_registered_code() -> None:
    """A code nothing emits makes a case's "codes" an empty promise: each is in the registry (tests/test_codes.py
    ties the registry to the codes the package emits)."""
    from llamafactory_rocm.findings.registry import load_codes

    known = set(load_codes().codes) | {ONE_LINE}
    named = {code for case in CASES for code in case.codes | case.forbid | case.notes}
    assert named <= known, sorted(named - known)


def test_corpus_covers_every_category() -> None:
    counts: dict[str, int] = {}
    for case in CASES:
        counts[case.category] = counts.get(case.category, 0) + 1
    assert len(CASES) >= 110 and len({c.id for c in CASES}) == len(CASES)
    assert set(counts) == {
        "good",
        "blog",
        "type",
        "key",
        "cross",
        "data",
        "output",
        "flags",
        "stage",
        "value",
        "model",
        "resume",
        "form",
    }, counts
    assert all(n >= 4 for n in counts.values()), counts
    # both directions, and the reason recorded for every failure
    assert sum(c.expect == "trains" for c in CASES) >= 40 and sum(c.expect == "fails" for c in CASES) >= 50
    assert all(c.expect in ("trains", "fails") for c in CASES)
    assert all(c.codes for c in CASES if c.expect == "fails"), [
        c.id for c in CASES if c.expect == "fails" and not c.codes
    ]
    assert all(c.words for c in CASES if c.expect == "fails" and not c.protective), [
        c.id for c in CASES if c.expect == "fails" and not c.protective and not c.words
    ]
    # every stage with data it trains on and data it refuses (ppo: refused, see the module's docstring)
    for stage in STAGES:
        outcomes = {c.expect for c in CASES if case_stage(c) == stage}
        assert outcomes == ({"fails"} if stage == "ppo" else {"trains", "fails"}), (stage, outcomes)


def _marks(case: Case) -> list[pytest.MarkDecorator]:
    return [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []


@pytest.mark.parametrize("case_id", [pytest.param(c.id, marks=_marks(c)) for c in CASES])
def test_check_and_training_agree(case_id: str, corpus: dict[str, Outcome]) -> None:
    if case_id not in corpus:
        pytest.skip("not selected by VERDICT_CORPUS_ONLY")
    outcome = corpus[case_id]
    assert outcome.problem is None, f"{outcome.case.reason}\n{outcome.row()}"


def test_every_verdict_agrees_but_the_named_disagreements(corpus: dict[str, Outcome]) -> None:
    outcomes = list(corpus.values())
    unexpected = [o for o in outcomes if (o.problem is None) == bool(o.case.xfail)]
    assert not unexpected, table(outcomes)
