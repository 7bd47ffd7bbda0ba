"""Every fix of a refusal check and LLaMA-Factory share names the key that is wrong, and its remedy, applied,
trains the stock run and keeps what the user asked for (issue 51 item 4).

The oracle is stock ``llamafactory-cli train`` with this package's hook off (tests/stock_runner.py): each
trigger config is refused by it in the words recorded below, ``check`` names the key and the remedy, and the
config with the remedy applied trains there (exit 0). Where the remedy keeps an intent the stock run can show
(a special token added, a tokenized dataset of another model kept), the run's own files are read. The earlier
fixes the issue found wrong are run too, and refused or silently different, so a revert fails here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.findings import Level
from llamafactory_rocm.lf.causes import cause_of
from tests.conftest import tiny_train_config
from tests.stock_runner import hook_off_env, run_alone

DELETE = object()


def _two_datasets(work: Path, config: dict[str, Any]) -> None:
    config["dataset"] = "amd_finetune_qa,my_custom_data"


def _other_vocabulary(work: Path, config: dict[str, Any]) -> None:
    """A tokenized dataset as LLaMA-Factory saves it (a DatasetDict with train), of a tokenizer whose ids go past
    the tiny model's vocabulary: a valid dataset of another model."""
    from datasets import Dataset, DatasetDict

    ids = [[1, 50_000, 7, 2]] * 8
    rows = {"input_ids": ids, "attention_mask": [[1] * 4] * 8, "labels": ids}
    DatasetDict({"train": Dataset.from_dict(rows)}).save_to_disk(str(work / "tokenized-other"))
    config["tokenized_path"] = str(work / "tokenized-other")


@dataclass(frozen=True)
class Case:
    changes: dict[str, Any]
    code: str
    key: str
    remedy: dict[str, Any]
    words: str  # the stock run's words for the trigger
    build: Callable[[Path, dict[str, Any]], None] | None = None
    said: tuple[str, ...] = ()  # in the fix
    not_said: tuple[str, ...] = ()  # never in the fix
    old_remedy: dict[str, Any] | None = None  # the fix the issue found wrong, and the stock run's words for it
    old_words: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


CASES: dict[str, Case] = {
    # not fixed: "all" is a name only freeze_trainable_modules takes
    "freeze_extra_modules typo": Case(
        {"finetuning_type": "freeze", "freeze_extra_modules": "embed_tokenz"},
        "MODEL_MODULES_REFUSED",
        "freeze_extra_modules",
        {"freeze_extra_modules": "embed_tokens"},
        "Module embed_tokenz is not found",
        said=("freeze_extra_modules: embed_tokens",),
        old_remedy={"freeze_extra_modules": "all"},
        old_words="Module all is not found",
    ),
    # harmful: the key turned off, never a plain install of a package that replaces torch
    "unsloth missing": Case(
        {"use_unsloth": True},
        "PACKAGE_MISSING",
        "use_unsloth",
        {"use_unsloth": None},
        "unsloth",
        said=("use_unsloth: false", "pip install --no-deps unsloth", "torch", "datasets>=2.16.0,<=4.0.0"),
        not_said=('pip install "unsloth"',),
    ),
    # wrong: the mix strategy, not the dataset entry
    "mix_strategy interleave_once": Case(
        {"mix_strategy": "interleave_once"},
        "DATA_PIPELINE_REFUSED",
        "mix_strategy",
        {"mix_strategy": "concat"},
        "all_exhausted_without_replacement is not supported",
        build=_two_datasets,
    ),
    # wrong: max_samples, not the data file (it has rows)
    "max_samples 0": Case(
        {"max_samples": 0},
        "DATASET_INVALID",
        "max_samples",
        {"max_samples": None},
        "StopIteration",
        not_said=("Add rows",),
    ),
    # wrong: the key, not pip install "0" (a transformers pin LLaMA-Factory's own start-up contradicts)
    "shift_attn": Case(
        {"shift_attn": True},
        "MODEL_MODULES_REFUSED",
        "shift_attn",
        {"shift_attn": False},
        "transformers>=4.45.0,<4.48.0 is required",
        said=("shift_attn: false",),
        not_said=('pip install "0"', "pip install"),
    ),
    # wrong: an unexpected scheduler kwarg answered "give the arguments it names"; cosine with a floor is its own type
    "min_lr for cosine": Case(
        {"lr_scheduler_type": "cosine", "lr_scheduler_kwargs": {"min_lr": 1.0e-6}},
        "SCHEDULER_REFUSED",
        "lr_scheduler_type",
        {"lr_scheduler_type": "cosine_with_min_lr"},
        "unexpected keyword argument 'min_lr'",
        said=("lr_scheduler_type: cosine_with_min_lr",),
        not_said=("Give the arguments it names",),
    ),
    # vague: rope_scaling answered "run it once and report the words"; LLaMA-Factory's float max_position_embeddings
    "rope_scaling past the model's length": Case(
        {"rope_scaling": "linear", "cutoff_len": 4096},
        "MODEL_MODULES_REFUSED",
        "rope_scaling",
        {"rope_scaling": None},
        "expected int, got float",
        said=("Remove rope_scaling", "transformers 5 refuses a float"),
        not_said=("report the words",),
    ),
    # poor cause: optim_args's words, not optim (the value already there)
    "optim_args malformed": Case(
        {"optim": "adamw_torch", "optim_args": "eps:1e-8, betas0.9"},
        "OPTIMIZER_REFUSED",
        "optim_args",
        {"optim_args": "eps=1e-8"},
        "values to unpack",
        not_said=("Set optim: adamw_torch",),
    ),
    # poor causes: the key the words are about
    "tool_format unknown": Case(
        {"tool_format": "qwne"},
        "TEMPLATE_REFUSED",
        "tool_format",
        {"tool_format": "qwen"},
        "Tool utils `qwne` not found",
        said=("tool_format: qwen",),
    ),
    "tool_format nothing close": Case(
        {"tool_format": "foo"},
        "TEMPLATE_REFUSED",
        "tool_format",
        {"tool_format": None},
        "Tool utils `foo` not found",
        said=("Remove tool_format",),
    ),
    "group_by_length": Case(
        {"group_by_length": True},
        "UNKNOWN_KEY",
        "group_by_length",
        {"group_by_length": None, "train_sampling_strategy": "group_by_length"},
        "group_by_length",
        said=("train_sampling_strategy: group_by_length",),
        not_said=("generation_max_length",),
    ),
    "accelerator_config key": Case(
        {"accelerator_config": {"split_batch": True, "even_batches": True}},
        "LLAMAFACTORY_REFUSED",
        "accelerator_config",
        {"accelerator_config": {"split_batches": True, "even_batches": True}},
        "unexpected keyword argument 'split_batch'",
        said=("split_batches",),
    ),
    "oft rank with the block size": Case(
        {"finetuning_type": "oft", "oft_rank": 8, "lora_rank": DELETE, "lora_target": DELETE},
        "MODEL_MODULES_REFUSED",
        "oft_block_size",
        {"oft_block_size": 0},
        "You can only specify either r (8) or oft_block_size (32)",
        said=("oft_block_size: 0",),
    ),
    # vague: the value that works
    "negative seed": Case(
        {"seed": -1}, "LLAMAFACTORY_REFUSED", "seed", {"seed": 42}, "Seed must be between 0 and 2**32 - 1"
    ),
    # intents: the token added, the template of the model's family, the other model's data kept
    "new_special_tokens": Case(
        {"new_special_tokens": "<tool_call>"},
        "UNKNOWN_KEY",
        "new_special_tokens",
        {"new_special_tokens": None, "add_special_tokens": "<tool_call>"},
        "new_special_tokens",
        not_said=("init_special_tokens",),
        old_remedy={"new_special_tokens": None, "init_special_tokens": "<tool_call>"},
    ),
    "template unknown": Case(
        {"template": "llama33"},
        "VALUE_INVALID",
        "template",
        {"template": "llama3"},
        "Template llama33 does not exist",
    ),
    "tokenized folder of another vocabulary": Case(
        {},
        "TOKENIZED_DATA_MISMATCH",
        "tokenized_path",
        {"tokenized_path": "<free>"},
        "IndexError",
        build=_other_vocabulary,
        said=("valid tokenized dataset of another model",),
        not_said=("remove the folder",),
    ),
}


def _config(model: Path, work: Path, case: Case) -> dict[str, Any]:
    config = tiny_train_config(model, work / "out", max_steps=1, max_samples=8, cutoff_len=64, plot_loss=False)
    if case.build is not None:
        case.build(work, config)
    for key, value in case.changes.items():
        if value is DELETE:
            config.pop(key, None)
        else:
            config[key] = value
    return config


def _applied(config: dict[str, Any], remedy: dict[str, Any]) -> dict[str, Any]:
    fixed = dict(config)
    for key, value in remedy.items():
        if value is None:
            fixed.pop(key, None)
        else:
            fixed[key] = value
    return fixed


def _stock_runs(runs: dict[str, dict[str, Any]], work: Path, name: str) -> tuple[dict[str, Any], Any]:
    """Every config run by stock ``llamafactory-cli train`` (hook off), in one child process."""
    cases = []
    for run_id, config in runs.items():
        path = work / f"{len(cases)}.yaml"
        path.write_text(yaml.safe_dump(config))
        cases.append({"id": run_id, "dir": str(work), "args": [str(path)]})
    return run_alone(cases, work, hook_off_env(work), name=name, timeout=1800)


def _first_error(config: dict[str, Any]):
    return next(f for f in check_config(config, plan_without_gpu=False).findings if f.level is Level.ERROR)


@pytest.fixture(scope="module")
def judged(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each case checked, its remedy applied and checked again, and every config (as given, fixed, with the old
    fix) run by stock LLaMA-Factory in one child process (hook off)."""
    import os

    work = tmp_path_factory.mktemp("intent")
    here = os.getcwd()
    found: dict[str, Any] = {}
    runs: dict[str, dict[str, Any]] = {}
    try:
        for name, case in CASES.items():
            folder = work / name.replace(" ", "_")
            folder.mkdir()
            os.chdir(folder)
            config = _config(tiny_model, folder, case)
            first = _first_error(config)
            remedy = dict(first.remedy or {})
            fixed = _applied(config, remedy)
            fixed["output_dir"] = str(folder / "fixed-out")
            again = [f for f in check_config(fixed, plan_without_gpu=False).findings if f.level is Level.ERROR]
            found[name] = {"first": first, "again": again, "folder": folder, "fixed": fixed}
            runs[f"{name}: given"] = config
            runs[f"{name}: fixed"] = fixed
            if case.old_remedy is not None:
                runs[f"{name}: old fix"] = {**_applied(config, case.old_remedy), "output_dir": str(folder / "old-out")}
    finally:
        os.chdir(here)
    results, proc = _stock_runs(runs, work, "intent")
    found["__stock__"] = results
    found["__log__"] = proc.stderr[-3000:]
    return found


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_fix_names_the_key_and_its_remedy_trains_the_stock_run(name: str, judged: dict[str, Any]) -> None:
    case = CASES[name]
    got = judged[name]
    first = got["first"]
    stock = judged["__stock__"]
    given, fixed = stock.get(f"{name}: given"), stock.get(f"{name}: fixed")
    assert given is not None and fixed is not None, judged["__log__"]
    # the trigger is refused by the stock run, in the words recorded
    assert given["exit"] != 0 and case.words in given["error"], (name, given)
    assert (first.code, first.key) == (case.code, case.key), first.line()
    expected = dict(case.remedy)
    if expected.get("tokenized_path") == "<free>":
        expected["tokenized_path"] = str(got["folder"] / "tokenized-other-2")
    assert first.remedy == expected, first.line()
    for text in case.said:
        assert text in first.fix, (text, first.fix)
    for text in case.not_said:
        assert text.lower() not in first.fix.lower(), (text, first.fix)
    # the fixed config: check says no error, and stock LLaMA-Factory trains it
    assert not got["again"], [f.line() for f in got["again"]]
    assert fixed["exit"] == 0, (name, fixed, judged["__log__"])


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.old_words))
def test_the_old_fix_is_refused_by_the_stock_run(name: str, judged: dict[str, Any]) -> None:
    old = judged["__stock__"][f"{name}: old fix"]
    assert old["exit"] != 0 and CASES[name].old_words in old["error"], old


def _added_tokens(folder: Path) -> set[str]:
    tokenizer = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    return {t["content"] for t in tokenizer.get("added_tokens", [])}


def test_the_special_token_is_added(judged: dict[str, Any]) -> None:
    """add_special_tokens adds the token the user named to the tokenizer the run saves; the old rename to
    init_special_tokens (how new embeddings start) trains too, and adds none: the intent lost silently."""
    folder = judged["new_special_tokens"]["folder"]
    assert "<tool_call>" in _added_tokens(folder / "fixed-out")
    old = judged["__stock__"]["new_special_tokens: old fix"]
    assert old["exit"] == 0, old
    assert "<tool_call>" not in _added_tokens(folder / "old-out")


def test_the_other_models_tokenized_data_is_kept(judged: dict[str, Any]) -> None:
    """The fix writes the new tokenized data beside the other model's, which stays as it was."""
    folder = judged["tokenized folder of another vocabulary"]["folder"]
    assert (folder / "tokenized-other" / "dataset_dict.json").is_file()
    assert (folder / "tokenized-other-2" / "dataset_dict.json").is_file()


def test_a_malformed_optim_args_names_optim_args() -> None:
    """transformers' own parse of optim_args refuses ``eps:1e-8, betas0.9``; its words choose optim_args, with
    the pairs it can read kept (``eps=1e-8``), and that value parses. (lf/dry_trainer.py raises this refusal
    with its own fixed remedy until it asks cause_of: the words' cause is held here.)"""
    from transformers.trainer_optimizer import _parse_optim_args

    config = {"optim": "adamw_torch", "optim_args": "eps:1e-8, betas0.9"}
    with pytest.raises(ValueError) as refused:
        _parse_optim_args(config["optim_args"])
    cause = cause_of("OPTIMIZER_REFUSED", str(refused.value), config)
    assert (cause.case, cause.key, cause.remedy) == ("optim_args", "optim_args", {"optim_args": "eps=1e-8"})
    assert _parse_optim_args(cause.remedy["optim_args"]) == {"eps": "1e-8"}


def test_image_rows_on_a_text_only_model_name_the_dataset(tiny_model: Path, tmp_path: Path, monkeypatch) -> None:
    """Rows with images on a text-only model: the words name the template, but the template is the model's;
    what is wrong is the dataset's images for this model, and the fix says both ways out."""
    from PIL import Image

    monkeypatch.chdir(tmp_path)
    Image.new("RGB", (16, 16), (200, 10, 10)).save(tmp_path / "red.png")
    turn = [{"role": "user", "content": "<image>What colour?"}, {"role": "assistant", "content": "Red."}]
    (tmp_path / "mm.json").write_text(json.dumps([{"messages": turn, "images": ["red.png"]}] * 8))
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    entry = {"file_name": "mm.json", "formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"}}
    (tmp_path / "dataset_info.json").write_text(json.dumps({"mm": {**entry, "tags": tags}}))
    config = tiny_train_config(tiny_model, tmp_path / "out", max_steps=1, dataset="mm", dataset_dir=str(tmp_path))
    first = _first_error(config)
    assert (first.code, first.key) == ("DATA_PIPELINE_REFUSED", "dataset"), first.line()
    assert "does not support image input" in first.message
    assert 'remove the "images" column' in first.fix and "vision-language model" in first.fix, first.fix


# --- vague fixes made concrete: the row, the line of dataset_info.json ---------------------------------------

OPENAI_TAGS_MISSING = {"file_name": "chat.json", "formatting": "sharegpt", "columns": {"messages": "messages"}}


def _rows(kind: str) -> list[dict[str, Any]]:
    turn = [{"role": "user", "content": "What is ROCm?"}, {"role": "assistant", "content": "AMD's GPU stack."}]
    if kind == "numeric":
        rows = [{"instruction": f"Question {i}?", "input": "", "output": "An answer."} for i in range(8)]
        rows[3]["output"] = 42
        return rows
    if kind == "developer":
        return [{"messages": [{"role": "developer", "content": "Be brief."}, *turn]}] * 8
    if kind == "tools":
        tool = {"name": "get_weather", "description": "The weather", "parameters": {"type": "object", "properties": {}}}
        asked = [{"from": "human", "value": "Weather?"}, {"from": "gpt", "value": "Sunny."}]
        return [{"conversations": asked, "tools": [tool]}] * 8
    return [{"messages": turn}] * 8


VAGUE: dict[str, tuple[str, dict[str, Any], str]] = {
    # id -> (rows, the dataset_info.json entry, the stock run's words)
    "a number in a text column": ("numeric", {"file_name": "chat.json"}, "DatasetGenerationError"),
    "sharegpt rows without tags": ("openai", OPENAI_TAGS_MISSING, "KeyError"),
    "the developer role": ("developer", {**OPENAI_TAGS_MISSING, "tags": {"role_tag": "role", "content_tag": "content",
                           "user_tag": "user", "assistant_tag": "assistant"}}, "Cannot find valid samples"),
    "tools as an array": ("tools", {"file_name": "chat.json", "formatting": "sharegpt",
                          "columns": {"messages": "conversations", "tools": "tools"}}, "must be str"),
    "a split the file lacks": ("numeric-fixed", {"file_name": "chat.json", "split": "validation"}, "Unknown split"),
}  # fmt: skip


def _follow(name: str, rows: list[dict[str, Any]], entry: dict[str, Any], fix: str) -> None:
    """Do what the fix says to the data or its entry (its concrete line), as a user would."""
    import re

    if name == "a number in a text column":
        row, text = re.search(r"row (\d+) \(line \d+\) as text, \"output\": (\"[^\"]*\")", fix).groups()
        rows[int(row) - 1] = {**rows[int(row) - 1], "output": json.loads(text)}
    elif name in ("sharegpt rows without tags", "the developer role"):
        entry["tags"] = json.loads(re.search(r'set "tags": (\{[^}]*\})', fix).group(1))
    elif name == "tools as an array":
        assert "json.dumps" in fix, fix
        rows[:] = [{**row, "tools": json.dumps(row["tools"])} for row in rows]
    elif name == "a split the file lacks":
        entry["split"] = re.search(r'set "split": "(\w+)"', fix).group(1)


def test_a_vague_data_refusal_gets_a_line_that_trains(tiny_model: Path, tmp_path: Path, monkeypatch) -> None:
    """Each data refusal's fix names the row or the entry's line to change; done as it says, the stock run
    (hook off) trains where the data as given is refused."""
    monkeypatch.chdir(tmp_path)
    runs: dict[str, dict[str, Any]] = {}
    for name, (kind, entry, _) in VAGUE.items():
        for state in ("given", "fixed"):
            folder = tmp_path / name.replace(" ", "_") / state
            folder.mkdir(parents=True)
            rows = _rows("numeric" if kind == "numeric-fixed" else kind)
            if kind == "numeric-fixed":
                rows[3]["output"] = "42"
            entry_now = json.loads(json.dumps(entry))
            config = tiny_train_config(tiny_model, folder / "out", max_steps=1, dataset="chat", dataset_dir=str(folder))
            if state == "fixed":
                first = _first_error(runs[f"{name}: given"])
                assert (first.code, first.key) == (VAGUE_CODES[name], "dataset"), first.line()
                _follow(name, rows, entry_now, first.fix)
            (folder / "chat.json").write_text(json.dumps(rows))
            (folder / "dataset_info.json").write_text(json.dumps({"chat": entry_now}))
            runs[f"{name}: {state}"] = config
        fixed = runs[f"{name}: fixed"]
        again = [f for f in check_config(fixed, plan_without_gpu=False).findings if f.level is Level.ERROR]
        assert not again, (name, [f.line() for f in again])
    results, proc = _stock_runs(runs, tmp_path, "vague")
    for name, (_, _, words) in VAGUE.items():
        given, fixed = results.get(f"{name}: given"), results.get(f"{name}: fixed")
        assert given is not None and fixed is not None, proc.stderr[-3000:]
        assert given["exit"] != 0 and words in given["error"], (name, given)
        assert fixed["exit"] == 0, (name, fixed)


VAGUE_CODES = {
    "a number in a text column": "DATASET_INVALID",
    "sharegpt rows without tags": "DATASET_INVALID",
    "the developer role": "DATASET_INVALID",
    "tools as an array": "DATA_PIPELINE_REFUSED",
    "a split the file lacks": "DATA_PIPELINE_REFUSED",
}


def test_planned_for_a_rocm_card_unsloth_is_never_a_plain_install(tiny_model: Path, tmp_path: Path) -> None:
    """Planned for an MI300X, use_unsloth without unsloth here is the target's requirement: its fix turns the key
    off and names the install only with --no-deps, as unsloth's requirements pull pip's (CUDA) torch builds."""
    config = tiny_train_config(tiny_model, tmp_path / "out", max_steps=1, use_unsloth=True)
    report = check_config(config, gpu="mi300x")
    (found,) = [f for f in report.findings if f.code == "PACKAGE_REQUIRED" and f.key == "use_unsloth"]
    assert "use_unsloth: false" in found.fix and "pip install --no-deps unsloth" in found.fix, found.fix
    assert 'pip install "unsloth"' not in found.fix and "install it on the target" not in found.message
