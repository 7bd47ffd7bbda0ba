"""LLaMA-Factory's launch run dry (lf/dry_run.py): each refusal has the library's own words, and each
oracle is the library's own answer: stock ``run_exp`` with the hook off (one subprocess for five cases),
or the very LLaMA-Factory / transformers / torch / datasets call the real run makes, on real weights."""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import offline_env, tiny_train_config

import llamafactory_rocm.models as models_package
from llamafactory_rocm.findings import Level
from llamafactory_rocm.lf.dry_resume import checkpoint_loadable
from llamafactory_rocm.lf.dry_run import dry_launch
from llamafactory_rocm.lf.stages import NoWorkflow, UnknownStage, adds_valuehead, data_stage, trainer_requirements
from llamafactory_rocm.lf.text_only import text_only_llamafactory


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def errors(run) -> dict[str, str]:
    return {f.code: f.message for f in run.findings if f.level is Level.ERROR}


def write_data(folder: Path, name: str, rows: list[dict], entry: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    info = folder / "dataset_info.json"
    current = json.loads(info.read_text()) if info.exists() else {}
    info.write_text(json.dumps({**current, name: {"file_name": f"{name}.jsonl", **(entry or {})}}))
    return folder


ALPACA = [{"instruction": f"question {i}", "input": "", "output": f"answer {i}"} for i in range(300)]
RANKING = {
    "ranking": True,
    "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"},
}
PAIRS = [{"instruction": f"q{i}", "input": "", "chosen": "good", "rejected": "bad"} for i in range(12)]
KTO = {"columns": {"prompt": "instruction", "query": "input", "response": "output", "kto_tag": "kto_tag"}}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    write_data(folder, "alpaca", ALPACA)
    write_data(folder, "pairs", PAIRS, RANKING)
    write_data(folder, "kto", [{**r, "kto_tag": bool(i % 2)} for i, r in enumerate(ALPACA[:12])], KTO)
    write_data(
        folder, "text", [{"text": f"plain text number {i} " * 8} for i in range(40)], {"columns": {"prompt": "text"}}
    )
    return folder


def config(tiny_model: Path, tmp_path: Path, data: Path, **overrides) -> dict:
    base = tiny_train_config(tiny_model, tmp_path / "out", dataset="alpaca", dataset_dir=str(data))
    base.update(overrides)
    return base


# -- the data stage is LLaMA-Factory's -----------------------------------------------------------
def test_data_stage_is_what_each_workflow_passes_to_get_dataset():
    # Fails when LLaMA-Factory changes a workflow's get_dataset(..., stage=...) call.
    assert {s: data_stage(s) for s in ("sft", "pt", "rm", "dpo", "kto", "ppo")} == {
        "sft": "sft",
        "pt": "pt",
        "rm": "rm",
        "dpo": "rm",
        "kto": "kto",
        "ppo": "ppo",
    }
    with pytest.raises(NoWorkflow):
        data_stage("orpo")
    assert issubclass(NoWorkflow, UnknownStage)


STAGES = ("sft", "pt", "rm", "dpo", "kto", "ppo")


def stage_source(stage: str, name: str) -> str:
    """The installed LLaMA-Factory's train/<stage>/<name>, as text."""
    with text_only_llamafactory():
        spec = importlib.util.find_spec("llamafactory")
    root = Path(next(iter(spec.submodule_search_locations)))
    return (root / "train" / stage / name).read_text(encoding="utf-8")


def test_trainer_requirements_are_the_pins_the_trainers_pass_to_require_version():
    """The oracle is the trainer's own source: each constant its require_version call receives."""
    for stage in STAGES:
        source = stage_source(stage, "trainer.py")
        pins = re.findall(r'require_version\(\s*"([^"]+)"', source)
        assert list(trainer_requirements(stage)) == pins
    assert trainer_requirements("foo") == ()


def test_the_stages_that_load_a_value_head_are_read_from_their_workflows():
    for stage in STAGES:
        source = stage_source(stage, "workflow.py")
        loads = re.search(r"model = load_model\([^)]*add_valuehead=True", source) is not None
        assert adds_valuehead(stage) is loads, stage
    assert {s for s in STAGES if adds_valuehead(s)} == {"rm", "ppo"}


def test_an_unknown_stage_and_a_stage_pin_are_refused_as_the_run_refuses(tiny_model, tmp_path, data):
    from transformers.utils.versions import require_version

    run = dry_launch(config(tiny_model, tmp_path, data, stage="foo"))
    assert "Unknown task: foo." in errors(run)["STAGE_UNKNOWN"]
    pins = trainer_requirements("ppo")
    if not pins:
        pytest.skip("this LLaMA-Factory's PPO trainer pins nothing")
    try:
        require_version(pins[0])
    except ImportError as real:
        ppo = config(tiny_model, tmp_path, data, stage="ppo", reward_model=str(tiny_model), reward_model_type="full")
        assert " ".join(str(real).split())[:80] in errors(dry_launch(ppo))["STAGE_PACKAGE_VERSION"]
    else:
        pytest.skip(f"{pins[0]} is installed here")


def test_a_log_level_outside_its_choices_is_the_trainers_keyerror(tiny_model, tmp_path, data):
    from transformers import TrainingArguments

    with pytest.raises(KeyError) as real:  # what Trainer.__init__ calls
        TrainingArguments(output_dir=str(tmp_path / "o"), log_level="loud").get_process_log_level()
    run = dry_launch(config(tiny_model, tmp_path, data, log_level="loud"))
    assert str(real.value) in errors(run)["TRAINER_SETUP_REFUSED"]
    assert "log_level 'loud'" in errors(run)["TRAINER_SETUP_REFUSED"]


# -- good configs of every stage: no error ---------------------------------------------------------
@pytest.mark.parametrize(
    ("stage", "dataset", "extra"),
    [
        ("sft", "alpaca", {}),
        ("dpo", "pairs", {}),
        ("kto", "kto", {}),
        ("rm", "pairs", {}),
        ("pt", "text", {}),
    ],
)
def test_good_configs_of_every_stage_pass(tiny_model, tmp_path, data, stage, dataset, extra):
    run = dry_launch(config(tiny_model, tmp_path, data, stage=stage, dataset=dataset, **extra))
    assert run.ok, run.findings
    assert run.data_stage == data_stage(stage) and run.rows and run.rows["train"] > 0
    assert not run.not_checked
    assert {"parse", "tokenizer", "data", "model", "trainer"} <= set(run.timings)
    assert not (tmp_path / "out").exists()  # nothing written where the user looks


def test_nothing_is_saved_into_the_users_tokenized_path(tiny_model, tmp_path, data):
    target = tmp_path / "out" / "tokenized"
    run = dry_launch(config(tiny_model, tmp_path, data, tokenized_path=str(target)))
    assert run.ok, run.findings
    assert not (tmp_path / "out").exists()


# -- stock LLaMA-Factory with the hook off, in one subprocess: the oracle for three refusals ----------
STOCK_RUNNER = """
import json, sys, traceback
from llamafactory.train.tuner import run_exp
results = {}
for name, args in json.loads(open(sys.argv[1]).read()):
    try:
        run_exp(args=args)
        results[name] = "trained"
    except BaseException as exc:
        results[name] = " ".join(f"{type(exc).__name__}: {exc}".split())
json.dump(results, open(sys.argv[2], "w"))
"""


META_ADAPTER = "saves/meta-llama-lora-run1"  # relative: missing in the stock run's folder and here


@pytest.fixture(scope="module")
def stock(tiny_model, data, tmp_path_factory) -> tuple[dict[str, str], Path]:
    """(stock LLaMA-Factory's last error per case, the output_dir holding a rank-8 checkpoint-1)."""
    work = tmp_path_factory.mktemp("stock")
    resumed = work / "resumed"
    cases = [
        ("rank8", config(tiny_model, work, data, output_dir=str(resumed), lora_rank=8, max_steps=1, save_steps=1)),
        ("rank16", config(tiny_model, work, data, output_dir=str(resumed), lora_rank=16, max_steps=2)),
        ("c_attn", config(tiny_model, work, data, output_dir=str(work / "c"), lora_target="c_attn", max_steps=1)),
        ("dpo_sft", config(tiny_model, work, data, output_dir=str(work / "d"), stage="dpo", max_steps=1)),
        # an adapter folder that does not exist, with "meta" in its name (issue 31: not a meta-device limit)
        (
            "meta_adapter",
            config(tiny_model, work, data, output_dir=str(work / "m"), max_steps=1, adapter_name_or_path=META_ADAPTER),
        ),
    ]
    for _, case in cases:
        case["cache_dir"] = str(work / "cache")
    stub = work / "site" / "torchaudio"  # LLaMA-Factory imports torchaudio; the hook's stand-in is off
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("")
    (work / "cases.json").write_text(json.dumps(cases))
    env = offline_env(work, LLAMAFACTORY_ROCM="0", PYTHONPATH=str(work / "site"))
    proc = subprocess.run(
        [sys.executable, "-c", STOCK_RUNNER, str(work / "cases.json"), str(work / "results.json")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert (work / "results.json").is_file(), proc.stderr[-3000:]
    return json.loads((work / "results.json").read_text()), resumed


def test_wrong_lora_target_is_peft_own_words_as_stock_llamafactory_says(stock, tiny_model, tmp_path, data):
    results, _ = stock
    run = dry_launch(config(tiny_model, tmp_path, data, lora_target="c_attn"))
    words = "Target modules {'c_attn'} not found in the base model"
    assert words in results["c_attn"]
    assert words in errors(run)["MODEL_MODULES_REFUSED"]
    assert next(f.key for f in run.findings if f.code == "MODEL_MODULES_REFUSED") == "lora_target"


def test_dpo_on_an_sft_dataset_is_refused_as_stock_llamafactory_refuses(stock, tiny_model, tmp_path, data):
    results, _ = stock
    words = "The dataset is not applicable in the current training stage."
    assert words in results["dpo_sft"]
    assert words in errors(dry_launch(config(tiny_model, tmp_path, data, stage="dpo")))["DATA_PIPELINE_REFUSED"]


def test_a_missing_adapter_named_meta_is_refused_as_stock_llamafactory_refuses(stock, tiny_model, tmp_path, data):
    results, _ = stock
    assert results["meta_adapter"] != "trained"
    run = dry_launch(config(tiny_model, tmp_path, data, adapter_name_or_path=META_ADAPTER))
    refused = errors(run)["MODEL_MODULES_REFUSED"]
    assert "adapter_config.json" in results["meta_adapter"] and "adapter_config.json" in refused
    assert not run.not_checked


def test_the_meta_devices_limits_are_told_from_refusals_by_where_they_are_raised():
    """torch's own refusals on meta tensors (no data to read) are limits of the dry run; an exception a
    library raises itself is a refusal, whatever its words."""
    import torch

    from llamafactory_rocm.lf.dry_parts import _meta_limitation

    meta = torch.empty(3, device="meta")

    def caught(action) -> BaseException:
        try:
            action()
        except Exception as exc:
            return exc
        raise AssertionError("no exception")

    def library_refusal():
        raise RuntimeError("the meta-llama adapter is missing")

    assert _meta_limitation(caught(lambda: meta.sum().item()))  # RuntimeError from torch's meta kernel
    assert not _meta_limitation(caught(lambda: meta @ torch.empty(4, device="meta")))  # a shape refusal
    assert _meta_limitation(caught(meta.tolist))  # NotImplementedError from the native op
    assert _meta_limitation(caught(lambda: torch.nonzero(meta)))  # NotImplementedError in torch's Python
    assert not _meta_limitation(caught(library_refusal))
    assert not _meta_limitation(caught(lambda: json.loads("{meta")))  # a ValueError is never a meta limit


def test_resuming_another_lora_rank_dies_in_load_state_dict_and_is_refused(stock, tiny_model, tmp_path, data):
    results, resumed = stock
    assert results["rank8"] == "trained" and (resumed / "checkpoint-1").is_dir()
    assert "size mismatch" in results["rank16"]  # stock: resume dies in load_state_dict
    run = dry_launch(config(tiny_model, tmp_path, data, output_dir=str(resumed), lora_rank=16, max_steps=2))
    assert "CHECKPOINT_MISMATCH" in errors(run)
    assert run.resume is not None and run.resume.checkpoint.endswith("checkpoint-1")
    # The same checkpoint with the same adapter resumes: said, with its step and the steps left.
    run = dry_launch(config(tiny_model, tmp_path, data, output_dir=str(resumed), lora_rank=8, max_steps=5))
    assert run.ok, run.findings
    assert (run.resume.global_step, run.resume.total_steps, run.resume.steps_left) == (1, 5, 4)
    assert "RESUMES_FROM_CHECKPOINT" in {f.code for f in run.findings}
    # A full fine-tune cannot load an adapter-only checkpoint.
    run = dry_launch(config(tiny_model, tmp_path, data, output_dir=str(resumed), finetuning_type="full"))
    assert "CHECKPOINT_MISMATCH" in errors(run)


# -- oracles: the library call the real run makes, called here on real objects ---------------------
def _lf_template_error(tiny_model: Path, data: Path, tmp_path: Path, **overrides) -> str:
    with text_only_llamafactory():
        from llamafactory.data import get_template_and_fix_tokenizer
        from llamafactory.hparams import get_train_args
        from llamafactory.model import load_tokenizer
    model_args, data_args, *_ = get_train_args(config(tiny_model, tmp_path, data, **overrides))
    with pytest.raises(Exception) as caught:
        get_template_and_fix_tokenizer(load_tokenizer(model_args)["tokenizer"], data_args)
    return " ".join(str(caught.value).split())


@pytest.mark.parametrize(
    "overrides", [{"template": ["llama3"]}, {"template": "glm4", "train_on_prompt": True}], ids=["list", "glm4"]
)
def test_template_refusals_are_llamafactorys_own(tiny_model, tmp_path, data, overrides):
    words = _lf_template_error(tiny_model, data, tmp_path, **overrides)
    assert words in errors(dry_launch(config(tiny_model, tmp_path, data, **overrides)))["TEMPLATE_REFUSED"]


def test_freeze_modules_the_model_lacks_are_refused_as_load_model_refuses_on_real_weights(tiny_model, tmp_path, data):
    overrides = {"finetuning_type": "freeze", "freeze_trainable_modules": "self_attention"}
    with text_only_llamafactory():
        from llamafactory.hparams import get_train_args
        from llamafactory.model import load_model, load_tokenizer
    model_args, _, _, finetuning_args, _ = get_train_args(config(tiny_model, tmp_path, data, **overrides))
    with pytest.raises(ValueError) as real:  # the real load, real weights
        load_model(load_tokenizer(model_args)["tokenizer"], model_args, finetuning_args, is_trainable=True)
    run = dry_launch(config(tiny_model, tmp_path, data, **overrides))
    assert str(real.value) in errors(run)["MODEL_MODULES_REFUSED"]


def test_val_size_is_split_on_the_full_rows_as_datasets_splits_them(tiny_model, tmp_path, data):
    from datasets import load_dataset

    rows = load_dataset("json", data_files=str(data / "alpaca.jsonl"), split="train", cache_dir=str(tmp_path / "c"))
    with pytest.raises(ValueError) as real:
        rows.train_test_split(test_size=400, seed=0)
    run = dry_launch(config(tiny_model, tmp_path, data, max_samples=None, val_size=400), rows_cap=64)
    assert " ".join(str(real.value).split()) in errors(run)["DATA_SPLIT_REFUSED"]
    # A fraction: the row counts are the full split's, not the capped one's (300 rows, cap 64).
    full = rows.train_test_split(test_size=0.1, seed=0)
    run = dry_launch(config(tiny_model, tmp_path, data, max_samples=None, val_size=0.1), rows_cap=64)
    assert run.ok and run.rows_estimated
    assert run.rows == {"train": len(full["train"]), "eval": len(full["test"])}


def test_llamafactory_lines_the_data_step_relies_on_are_still_there():
    with text_only_llamafactory():
        import llamafactory.data.loader as loader
        import llamafactory.model.loader as model_loader
    single = inspect.getsource(loader._load_single_dataset)
    assert "min(data_args.max_samples, len(dataset))" in single  # _RecordingCap sees len(dataset) there
    assert "dataset.select(range(max_samples))" in single  # the one call _strided_rows spreads over the rows
    assert "split_dataset(dataset, eval_dataset, data_args, seed=training_args.seed)" in inspect.getsource(
        loader.get_dataset
    )
    load = inspect.getsource(model_loader.load_model)
    assert "if model_args.train_from_scratch:" in load and "load_class.from_config(" in load


def test_optimizer_and_reporter_packages_are_the_trainers_own_words(tiny_model, tmp_path, data):
    import torch
    from transformers.integrations import WandbCallback

    if importlib.util.find_spec("bitsandbytes") or importlib.util.find_spec("wandb"):
        pytest.skip("bitsandbytes or wandb is installed here")
    run = dry_launch(config(tiny_model, tmp_path, data, optim="adamw_bnb_8bit", report_to="wandb"))
    with pytest.raises(RuntimeError) as real:
        WandbCallback()
    assert str(real.value) in errors(run)["REPORTER_UNAVAILABLE"]
    assert "bitsandbytes" in errors(run)["OPTIMIZER_UNAVAILABLE"]
    with pytest.raises(TypeError) as real:
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr="5e-5")
    run = dry_launch(config(tiny_model, tmp_path, data, learning_rate="5e-5"))
    assert str(real.value) in errors(run)["OPTIMIZER_REFUSED"]


def test_scheduler_and_batch_values_only_the_trainer_refuses(tiny_model, tmp_path, data):
    import torch
    from transformers.optimization import get_scheduler

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))])
    with pytest.raises(ValueError) as real:
        get_scheduler("cosine_with_min_lr", optimizer=opt, num_warmup_steps=0, num_training_steps=10)
    run = dry_launch(config(tiny_model, tmp_path, data, lr_scheduler_type="cosine_with_min_lr"))
    assert str(real.value) in errors(run)["SCHEDULER_REFUSED"]
    with pytest.raises(ValueError) as real:
        torch.utils.data.DataLoader(range(4), batch_size=0)
    run = dry_launch(config(tiny_model, tmp_path, data, per_device_train_batch_size=0))
    assert str(real.value) in errors(run)["BATCH_REFUSED"]


def test_a_tokenized_dataset_from_another_tokenizer_is_refused(tiny_model, tmp_path, data):
    import torch
    from transformers import AutoModelForCausalLM

    from datasets import Dataset, DatasetDict

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    too_big = model.get_input_embeddings().num_embeddings + 10
    with pytest.raises(IndexError):  # the real first forward
        model(input_ids=torch.tensor([[1, too_big]]))
    rows = {"input_ids": [[1, too_big]], "attention_mask": [[1, 1]], "labels": [[1, too_big]]}
    DatasetDict({"train": Dataset.from_dict(rows)}).save_to_disk(str(tmp_path / "tok"))
    run = dry_launch(config(tiny_model, tmp_path, data, tokenized_path=str(tmp_path / "tok")))
    assert "TOKENIZED_DATA_MISMATCH" in errors(run) and run.rows == {"train": 1, "eval": 0}
    rows = {k: [[1, 2]] for k in rows}
    DatasetDict({"train": Dataset.from_dict(rows)}).save_to_disk(str(tmp_path / "tok_ok"))
    assert dry_launch(config(tiny_model, tmp_path, data, tokenized_path=str(tmp_path / "tok_ok"))).ok


# -- what cannot be reached, paths that do not exist --------------------------------------------------
def online(monkeypatch) -> None:
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)


def test_a_hub_model_not_in_the_cache_is_not_checked_online_and_refused_offline(
    tiny_model, tmp_path, data, monkeypatch
):
    # Offline, the stock run stops with 'Failed to load tokenizer.' (the corpus's model_hub_id_offline_not_cached).
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf"))
    hub_id = config(tiny_model, tmp_path, data, model_name_or_path="meta-llama/Meta-Llama-3-8B")
    offline = dry_launch(hub_id)
    assert "HF_HUB_OFFLINE is set" in errors(offline)["MODEL_NOT_FOUND"]
    (finding,) = [f for f in offline.findings if f.code == "MODEL_NOT_FOUND"]
    assert "huggingface-cli download meta-llama/Meta-Llama-3-8B" in finding.fix
    assert dry_launch({**hub_id, "model_name_or_path": str(tiny_model)}).ok  # the fix's local folder
    online(monkeypatch)
    run = dry_launch(hub_id)
    assert run.ok
    (line,) = run.not_checked  # the Hub is tests/conftest.py's closed port: asked, it does not answer
    assert line.startswith(
        "not checked: tokenizer, template, data pipeline and model modules "
        "(meta-llama/Meta-Llama-3-8B is not local and not in the Hugging Face cache; the Hugging Face Hub did not "
        "answer (LocalEntryNotFoundError: "
    ), line


def test_a_hub_dataset_not_in_the_cache_is_refused_offline_only(tiny_model, tmp_path, data, monkeypatch):
    from datasets import load_dataset

    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf"))
    folder = tmp_path / "hub-data"
    folder.mkdir()
    (folder / "dataset_info.json").write_text(json.dumps({"hub": {"hf_hub_url": "lfrocm-test/not-downloaded"}}))
    hub = config(tiny_model, tmp_path, data, dataset="hub", dataset_dir=str(folder))
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # as the run's datasets reads the environment
    with pytest.raises(ConnectionError) as real:  # what LLaMA-Factory's loader calls
        load_dataset("lfrocm-test/not-downloaded", split="train")
    assert str(real.value) in errors(dry_launch(hub))["DATASET_NOT_IN_CACHE_OFFLINE"]
    assert dry_launch({**hub, "dataset": "alpaca", "dataset_dir": str(data)}).ok  # the fix's local dataset
    online(monkeypatch)
    run = dry_launch(hub)
    assert run.ok and any("lfrocm-test/not-downloaded is not a local file" in line for line in run.not_checked)


def fixed(finding) -> dict:
    """The ``key: value`` a finding's fix names, as YAML reads it."""
    import yaml

    match = re.search(r"(\w+): ([^ ,)]+?)\.?(?:$|[ ,)])", finding.fix)
    assert match, finding.fix
    return {match.group(1): yaml.safe_load(match.group(2))}


def the(run, code: str):
    (finding,) = [f for f in run.findings if f.code == code]
    return finding


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"dataloader_num_workers": -1}, "DATALOADER_REFUSED"),
        ({"dataloader_persistent_workers": True}, "DATALOADER_REFUSED"),
        (
            {"val_size": 0.1, "eval_strategy": "steps", "eval_steps": 1, "per_device_eval_batch_size": 0},
            "BATCH_REFUSED",
        ),
    ],
)
def test_the_dataloaders_are_built_as_the_trainer_builds_them(tiny_model, tmp_path, data, change, code):
    import torch

    params = {
        "batch_size": change.get("per_device_eval_batch_size", 2),
        "num_workers": change.get("dataloader_num_workers", 0),
        "persistent_workers": change.get("dataloader_persistent_workers", False),
    }
    with pytest.raises(ValueError) as real:  # torch's own refusal of these arguments
        torch.utils.data.DataLoader(range(4), **params)
    run = dry_launch(config(tiny_model, tmp_path, data, **change))
    assert str(real.value) in errors(run)[code]
    fix = fixed(the(run, code))
    assert set(fix) <= set(change), fix  # names the key the config set
    assert code not in errors(dry_launch(config(tiny_model, tmp_path, data, **{**change, **fix})))


def test_preprocessing_workers_as_datasets_takes_them(tiny_model, tmp_path, data):
    from datasets import Dataset

    with pytest.raises(ValueError) as real:
        Dataset.from_dict({"a": [1, 2]}).map(lambda r: r, num_proc=0)
    run = dry_launch(config(tiny_model, tmp_path, data, preprocessing_num_workers=0))
    assert str(real.value) in errors(run)["DATA_WORKERS_REFUSED"]
    fix = fixed(the(run, "DATA_WORKERS_REFUSED"))
    assert fix == {"preprocessing_num_workers": 1}
    assert dry_launch(config(tiny_model, tmp_path, data, **fix)).ok


def test_an_output_dir_that_cannot_be_created(tiny_model, tmp_path, data, monkeypatch):
    import os

    (tmp_path / "run.log").write_text("x")
    for out in (tmp_path / "run.log" / "out", Path("/proc/lfrocm-dry-out")):
        with pytest.raises(OSError) as real:  # what the trainer's makedirs meets
            os.makedirs(out, exist_ok=True)
        before = sorted(p.name for p in tmp_path.iterdir())
        run = dry_launch(config(tiny_model, tmp_path, data, output_dir=str(out)))
        assert real.value.strerror in errors(run)["OUTPUT_DIR_NOT_CREATABLE"]
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # the probe leaves nothing
        monkeypatch.chdir(tmp_path)
        fix = fixed(the(run, "OUTPUT_DIR_NOT_CREATABLE"))
        assert fix == {"output_dir": "saves/out" if out.name == "out" else "saves/lfrocm-dry-out"}
        assert "OUTPUT_DIR_NOT_CREATABLE" not in errors(dry_launch(config(tiny_model, tmp_path, data, **fix)))


def test_fsdp_as_the_trainer_starts_it(tiny_model, tmp_path, data):
    """On this CPU-only machine accelerate's FSDP plugin refuses first (the corpus's value_fsdp_single_process);
    with the GPU answers patched in (hardware that cannot exist here), transformers' real Trainer refuses one
    process, and so does the dry run."""
    from unittest import mock

    import accelerate.utils.dataclasses as accelerate_dataclasses
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    run = dry_launch(config(tiny_model, tmp_path, data, fsdp="full_shard"))
    assert "There are currently no available devices found" in errors(run)["FSDP_REFUSED"]
    assert "fsdp:" in the(run, "FSDP_REFUSED").fix
    assert dry_launch(config(tiny_model, tmp_path, data, fsdp="")).ok
    gpu = (
        mock.patch.object(accelerate_dataclasses, "is_cuda_available", return_value=True),
        mock.patch.object(torch.cuda, "current_device", return_value=0),
    )
    with gpu[0], gpu[1]:
        args = TrainingArguments(output_dir=str(tmp_path / "t"), fsdp="full_shard", report_to=[])
        with pytest.raises(ValueError) as real:
            Trainer(model=AutoModelForCausalLM.from_pretrained(tiny_model), args=args)
        run = dry_launch(config(tiny_model, tmp_path, data, fsdp="full_shard"))
    assert str(real.value) in errors(run)["FSDP_REFUSED"]


def test_metric_for_best_model_against_what_the_evaluation_reports(tiny_model, tmp_path, data):
    # The stock runs: the corpus's value_metric_for_best_model_* (KeyError without compute_accuracy, trains with it).
    evaluated = {"val_size": 0.1, "eval_strategy": "steps", "eval_steps": 1, "metric_for_best_model": "accuracy"}
    run = dry_launch(config(tiny_model, tmp_path, data, **evaluated))
    assert "not eval_accuracy" in errors(run)["METRIC_NOT_REPORTED"]
    assert "compute_accuracy: true" in the(run, "METRIC_NOT_REPORTED").fix
    assert dry_launch(config(tiny_model, tmp_path, data, **evaluated, compute_accuracy=True)).ok
    assert dry_launch(config(tiny_model, tmp_path, data, **{**evaluated, "metric_for_best_model": "loss"})).ok
    assert "METRIC_NOT_REPORTED" in errors(
        dry_launch(config(tiny_model, tmp_path, data, **{**evaluated, "metric_for_best_model": "rouge-1"}))
    )


@pytest.mark.parametrize(
    ("change", "raised"),
    [
        (lambda s: s.update(a_field_of_a_newer_version=1), TypeError),
        (lambda s: s.pop("train_batch_size"), TypeError),
        (lambda s: s.pop("stateful_callbacks"), KeyError),
    ],
)
def test_a_trainer_state_another_transformers_wrote(tiny_model, tmp_path, data, change, raised):
    from transformers import TrainerControl, TrainerState
    from transformers.trainer_utils import compare_trainer_and_checkpoint_args

    ckpt = tmp_path / "earlier" / "checkpoint-1"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"")  # a file transformers' loader looks for
    state = TrainerState(global_step=1, train_batch_size=2, stateful_callbacks=[TrainerControl()])
    state.save_to_json(str(ckpt / "trainer_state.json"))  # as this transformers writes it
    saved = json.loads((ckpt / "trainer_state.json").read_text())
    change(saved)
    (ckpt / "trainer_state.json").write_text(json.dumps(saved))
    cfg = config(tiny_model, tmp_path, data, finetuning_type="full", resume_from_checkpoint=str(ckpt))
    run = dry_launch(cfg)
    with pytest.raises(raised) as real:  # what the trainer does with it when it resumes, then saves
        loaded = TrainerState.load_from_json(str(ckpt / "trainer_state.json"))
        compare_trainer_and_checkpoint_args(run_args(cfg), loaded)
        loaded.stateful_callbacks["TrainerControl"]
    assert _words_of(real.value) in errors(run)["CHECKPOINT_STATE_INCOMPATIBLE"]
    assert "Remove resume_from_checkpoint" in the(run, "CHECKPOINT_STATE_INCOMPATIBLE").fix
    cfg.pop("resume_from_checkpoint")
    assert "CHECKPOINT_STATE_INCOMPATIBLE" not in errors(dry_launch(cfg))


def test_a_trainer_state_another_transformers_wrote_found_in_output_dir(tiny_model, tmp_path, data, monkeypatch):
    """LLaMA-Factory resumes from output_dir's checkpoint on its own: the fix is a new output_dir, which keeps it
    (the stock run: the corpus's resume_state_without_stateful_callbacks)."""
    ckpt = tmp_path / "out" / "checkpoint-1"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 1, "train_batch_size": 2}))  # < 4.41
    cfg = config(tiny_model, tmp_path, data, finetuning_type="full")
    run = dry_launch(cfg)
    assert "KeyError: 'TrainerControl'" in errors(run)["CHECKPOINT_STATE_INCOMPATIBLE"]
    fix = fixed(the(run, "CHECKPOINT_STATE_INCOMPATIBLE"))
    assert list(fix) == ["output_dir"]
    monkeypatch.chdir(tmp_path)
    assert "CHECKPOINT_STATE_INCOMPATIBLE" not in errors(dry_launch({**cfg, **fix}))
    assert (ckpt / "trainer_state.json").is_file()  # kept


def run_args(cfg: dict):
    from llamafactory_rocm.lf.patching import Patches

    with text_only_llamafactory():
        from llamafactory.hparams import get_train_args
    with Patches() as patches:
        patches.environ()  # get_train_args sets environment variables
        return get_train_args(dict(cfg))[2]


def _words_of(exc: BaseException) -> str:
    from llamafactory_rocm.errors import one_line

    return one_line(exc)


def test_paths_that_do_not_exist(tiny_model, tmp_path, data):
    run = dry_launch(config(tiny_model, tmp_path, data, model_name_or_path=str(tmp_path / "no" / "model")))
    assert "MODEL_NOT_FOUND" in errors(run)
    run = dry_launch(config(tiny_model, tmp_path, data, resume_from_checkpoint=str(tmp_path / "no-ckpt")))
    assert "CHECKPOINT_NOT_LOADABLE" in errors(run)
    (tmp_path / "file").write_text("x")
    assert "OUTPUT_DIR_NOT_A_FOLDER" in errors(
        dry_launch(config(tiny_model, tmp_path, data, output_dir=str(tmp_path / "file")))
    )


# -- checkpoints: transformers' and DeepSpeed's file checks -----------------------------------------
def test_checkpoint_file_names_are_transformers_own():
    import transformers.trainer as trainer
    import transformers.utils as hf_utils
    from transformers.integrations import deepspeed

    from llamafactory_rocm.lf import dry_resume

    assert (dry_resume.TRAINER_STATE_NAME, dry_resume.FSDP_MODEL_NAME) == (
        trainer.TRAINER_STATE_NAME,
        trainer.FSDP_MODEL_NAME,
    )
    source = inspect.getsource(trainer.Trainer._load_from_checkpoint)
    for name in (
        "WEIGHTS_NAME",
        "SAFE_WEIGHTS_NAME",
        "WEIGHTS_INDEX_NAME",
        "SAFE_WEIGHTS_INDEX_NAME",
        "ADAPTER_WEIGHTS_NAME",
        "ADAPTER_SAFE_WEIGHTS_NAME",
        "FSDP_MODEL_NAME",
    ):
        assert (name in source and getattr(hf_utils, name, None) is not None) or name == "FSDP_MODEL_NAME"
    assert "Can't find a valid checkpoint" in source
    assert 'glob.glob(f"{checkpoint_path}/global_step*")' in inspect.getsource(deepspeed.deepspeed_load_checkpoint)
    assert "TrainerState.load_from_json(os.path.join(resume_from_checkpoint, TRAINER_STATE_NAME))" in (
        inspect.getsource(trainer.Trainer.train)
    )


def deepspeed_zero3_checkpoint(folder: Path) -> Path:
    """The layout transformers + DeepSpeed ZeRO-3 save (stage3_gather_16bit_weights_on_model_save: false)."""
    step = folder / "global_step10"
    step.mkdir(parents=True)
    (folder / "latest").write_text("global_step10")
    (step / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"")
    (step / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 10, "max_steps": 30}))
    (folder / "zero_to_fp32.py").write_text("")
    return folder


def test_a_deepspeed_zero3_checkpoint_without_gathered_weights_is_loadable(tmp_path):
    ckpt = deepspeed_zero3_checkpoint(tmp_path / "checkpoint-10")
    assert checkpoint_loadable(ckpt, deepspeed=True) and checkpoint_loadable(ckpt)
    assert not checkpoint_loadable(ckpt, deepspeed=False)  # Trainer._load_from_checkpoint needs weights
    (ckpt / "latest").unlink()
    assert not checkpoint_loadable(ckpt, deepspeed=True)
    assert not checkpoint_loadable(tmp_path / "nowhere")


# -- a Llama-3-8B-shaped config.json, no weights ----------------------------------------------------
def test_llama3_8b_shaped_config_through_the_meta_model(tiny_model, tmp_path, data):
    import shutil

    from transformers import LlamaConfig

    shape = json.loads((Path(models_package.__file__).parent / "llama3_8b.json").read_text())["config"]
    folder = tmp_path / "llama3-8b-shaped"
    LlamaConfig(**{k: v for k, v in shape.items() if k != "model_type"}).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # a tokenizer, so the launch reaches the model
        shutil.copy(tiny_model / name, folder / name)
    run = dry_launch(config(tiny_model, tmp_path, data, model_name_or_path=str(folder)))
    assert run.ok, run.findings
    assert run.timings["model"] < 30
    bad = dry_launch(config(tiny_model, tmp_path, data, model_name_or_path=str(folder), lora_target="c_attn"))
    assert "Target modules {'c_attn'} not found" in errors(bad)["MODEL_MODULES_REFUSED"]


def test_stages_module_parses_without_importing_the_workflows():
    code = textwrap.dedent(
        """
        import sys
        from llamafactory_rocm.lf.stages import data_stage
        data_stage("dpo")
        print(any(m.startswith("llamafactory.train") for m in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_llamafactorys_parser_runs_once_a_check(tiny_model, tmp_path, data, monkeypatch):
    """check hands what LLaMA-Factory's get_train_args parsed for its verdict to the dry launch (issue 38): one
    call a check, counted on both names the package calls it by (hparams.parser's, and the package's)."""
    from llamafactory_rocm.check.run import check_config

    with text_only_llamafactory():
        import llamafactory.hparams as hparams
        import llamafactory.hparams.parser as parser
    original, calls = parser.get_train_args, []

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(parser, "get_train_args", counted)
    monkeypatch.setattr(hparams, "get_train_args", counted)
    monkeypatch.chdir(tmp_path)
    report = check_config(config(tiny_model, tmp_path, data), plan_without_gpu=False)
    assert report.ok, [f.line() for f in report.findings]
    assert len(calls) == 1
    assert "not checked" not in " ".join(f.message for f in report.findings)
