"""A refusal's fix, applied, passes the point refused (issue 37 item 1).

The oracle is LLaMA-Factory's own parser (``get_train_args``, stock, in this process: the hook wraps
``run_exp`` only): each trigger config below is refused by it, ``check`` names the refusal with a fix and its
remedy (the key changes of that fix), the remedy is applied, and the stock parser is asked again; it must not
refuse again (save for a package this machine lacks). ``check`` is asked again too, and must not say the same
refusal. A remedy value the user supplies (``<model>``, ``<dataset>``) is filled with what the working config had.

Also here: every literal refusal LLaMA-Factory's argument classes and transformers' ``TrainingArguments`` raise
in the installed versions has its own cause in lf/causes.json (not the words-name-a-key fallback), so a new
line of LLaMA-Factory (main: tests/main_line.sh runs this file) that adds a refusal fails here first; and each
cause's case exists in its code's registry entry with a template its values fill.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.findings import Level
from llamafactory_rocm.findings.registry import load_codes
from llamafactory_rocm.lf.causes import cause_of, patterns
from tests.conftest import tiny_train_config

DELETE = object()
USER_VALUE = re.compile(r"^<[^>]+>$")  # a remedy value lf/causes.json leaves to the user: "<dataset>"
# findings that say this machine lacks a package the fixed config needs (rules/packages.py, rules/predict.py,
# lf/dry_run.py)
MACHINE_LACKS = {"PACKAGE_MISSING", "EVAL_PACKAGES_MISSING", "STAGE_PACKAGE_VERSION"}
CHECKPOINT_FILE = "adapter_model.safetensors"  # one of LLaMA-Factory's CHECKPOINT_NAMES (extras/constants.py)


def _finished_run(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / CHECKPOINT_FILE).write_bytes(b"trained")


# Each cause's triggers come from its own entry (lf/causes.json "triggers": changes to the tiny config, null
# removing a key); a trigger that needs a file the changes cannot make has it built here, by the cause's case.
BUILDERS = {"output_dir holds a finished run": _finished_run}
TRIGGERS: dict[str, tuple[Any, dict[str, Any]]] = {
    pattern.case + (f" #{n + 1}" if n else ""): (pattern, changes)
    for entries in patterns().values()
    for pattern in entries
    for n, changes in enumerate(pattern.triggers)
}
# LLaMA-Factory's words for a package this machine lacks (its check_version, transformers' require_version)
PACKAGE_NOT_HERE = "distribution was not found and is required"


def _config(model: Path, out: Path, changes: dict[str, Any]) -> dict[str, Any]:
    config = tiny_train_config(model, out, max_steps=1, max_samples=8, cutoff_len=64, plot_loss=False)
    for key, value in changes.items():
        if value is DELETE or value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return config


@contextlib.contextmanager
def _quiet_environ() -> Iterator[None]:
    """get_train_args sets environment variables and logs; both are put back."""
    import os

    saved = dict(os.environ)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def stock_parser_words(config: dict[str, Any]) -> str | None:
    """LLaMA-Factory's own get_train_args on ``config``: None where it accepts, its words where it refuses."""
    from llamafactory_rocm.lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.hparams import get_train_args
    with _quiet_environ():
        try:
            get_train_args(dict(config))
        except (Exception, SystemExit) as exc:
            return " ".join(str(exc).split()) or type(exc).__name__
    return None


def applied(config: dict[str, Any], remedy: dict[str, Any], working: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the remedy's changes; a value the user supplies is what the working config had."""
    fixed = dict(config)
    own = {k for k, v in remedy.items() if isinstance(v, str) and USER_VALUE.match(v)}
    for key, value in remedy.items():
        if key in own:
            value = working[key]
        if value is None:
            fixed.pop(key, None)
        else:
            fixed[key] = value
    return fixed


@pytest.mark.parametrize("case", sorted(TRIGGERS))
def test_the_fix_passes_the_stock_parser(case: str, tiny_model: Path, tmp_path: Path, monkeypatch) -> None:
    pattern, changes = TRIGGERS[case]
    code = pattern.code
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    working = _config(tiny_model, tmp_path / "unused", {})
    config = _config(tiny_model, out, changes)
    if pattern.case in BUILDERS:
        BUILDERS[pattern.case](out)
    if pattern.case == "reward model for ppo":
        working["reward_model"] = str(tiny_model)
    words = stock_parser_words(config)
    assert words is not None, f"the stock parser accepts the trigger of {case!r}: the trigger is wrong"
    report = check_config(config, plan_without_gpu=False)
    errors = [f for f in report.findings if f.level is Level.ERROR]
    assert errors, f"check accepts what LLaMA-Factory refuses ({words})"
    first = errors[0]
    assert first.code == code, f"the first error is {first.code}, LLaMA-Factory stops on: {words}"
    assert cause_of(code, words, config).case == pattern.case, f"{case!r}: the words {words!r} chose another fix"
    assert first.remedy, f"{case}: no key change in the fix ({first.fix})"
    fixed = applied(config, first.remedy, working)
    again = stock_parser_words(fixed)
    assert again != words, f"{case}: the fix {first.remedy} leaves LLaMA-Factory's refusal: {words}"
    # nor any other refusal of the parser (a second key the fix must set too), save for a package this machine lacks
    assert again is None or PACKAGE_NOT_HERE in again, f"{case}: with the fix {first.remedy} LLaMA-Factory says {again}"
    refused_again = [f for f in check_config(fixed, plan_without_gpu=False).findings if f.level is Level.ERROR]
    assert (first.code, first.message) not in {(f.code, f.message) for f in refused_again}
    # the fix is run again: no key it set is refused, save for a package this machine lacks (the fix's own
    # requirement, said with its install line); a placeholder left for the user's value ("<dataset>"), which
    # LLaMA-Factory's parser accepts as a name, is refused here by the data step
    wrong = [f for f in refused_again if f.key in first.remedy and f.code not in MACHINE_LACKS]
    assert not wrong, [(f.code, f.key, f.message[:300]) for f in wrong]


def test_a_finished_run_is_never_deleted_by_the_fix(tiny_model: Path, tmp_path: Path, monkeypatch) -> None:
    """The fix of a folder that holds a trained model writes elsewhere and says what overwrite would replace."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    config = _config(tiny_model, out, {})
    _finished_run(out)
    first = next(f for f in check_config(config, plan_without_gpu=False).findings if f.level is Level.ERROR)
    assert first.remedy == {"output_dir": str(tmp_path / "out-2")}
    assert "remove" not in first.fix.lower() and "replace that trained model" in first.fix
    assert (out / CHECKPOINT_FILE).read_bytes() == b"trained"


def test_the_parser_refusal_comes_before_the_package_rules(tiny_model: Path, tmp_path: Path, monkeypatch) -> None:
    """bitsandbytes is not installed here: PACKAGE_MISSING is an error too, but LLaMA-Factory's parser stops on
    quantization with full fine-tuning first (its argument check runs before the model loads)."""
    pytest.importorskip("pytest")
    monkeypatch.chdir(tmp_path)
    config = _config(tiny_model, tmp_path / "out", {"finetuning_type": "full", "quantization_bit": 4})
    errors = [f.code for f in check_config(config, plan_without_gpu=False).findings if f.level is Level.ERROR]
    assert errors[0] == "LLAMAFACTORY_REFUSED"


@pytest.mark.parametrize(
    ("changes", "code", "key", "packages"),
    [
        # the parser requires jieba, nltk and rouge_chinese for generation (hparams/parser.py
        # _check_extra_dependencies); it stops at the first
        ({"predict_with_generate": True, "val_size": 0.1}, "EVAL_PACKAGES_MISSING", "predict_with_generate",
         ("jieba", "nltk", "rouge-chinese")),
        ({"deepspeed": "ds_z3.json"}, "PACKAGE_MISSING", "deepspeed", ("deepspeed",)),
    ],
)  # fmt: skip
def test_a_package_the_parser_refuses_is_one_finding_with_its_key(
    changes, code, key, packages, tiny_model: Path, tmp_path: Path, monkeypatch
) -> None:
    """The stock parser refuses a package this machine lacks, and a rule finds the same package missing: one
    cause, said once, first (where the run stops), by the rule (the key that needs it, every package the key
    needs) with the parser's own words (the oracle: the stock parser's refusal, in this process)."""
    monkeypatch.chdir(tmp_path)
    if "deepspeed" in changes:
        (tmp_path / "ds_z3.json").write_text('{"zero_optimization": {"stage": 3}, "train_batch_size": "auto"}')
    config = _config(tiny_model, tmp_path / "out", changes)
    words = stock_parser_words(config)
    assert words is not None and PACKAGE_NOT_HERE in words, words
    errors = [f for f in check_config(config, plan_without_gpu=False).findings if f.level is Level.ERROR]
    assert [f.code for f in errors] == [code], [(f.code, f.message[:200]) for f in errors]
    (finding,) = errors
    assert finding.key == key and all(name in finding.message for name in packages), finding.message
    assert words in " ".join(finding.message.split()), (words, finding.message)


# --- every refusal LLaMA-Factory and transformers write as a literal has its own cause ---------------------


def _raised_texts(source: str) -> list[str]:
    """The message of each ``raise XError("...")`` (an f-string's fields as X) in ``source``."""
    texts = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args):
            continue
        arg = node.exc.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            texts.append(arg.value)
        elif isinstance(arg, ast.JoinedStr):
            texts.append("".join(v.value if isinstance(v, ast.Constant) else "X" for v in arg.values))
    return texts


def _library_refusals() -> list[tuple[str, str]]:
    from llamafactory_rocm.lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.hparams import data_args, finetuning_args, model_args, parser
    import transformers.training_args as hf_training_args

    found = []
    for module in (parser, finetuning_args, data_args, model_args):
        found += [(module.__name__, t) for t in _raised_texts(inspect.getsource(module))]
    validate = inspect.getsource(hf_training_args.TrainingArguments._validate_args)
    found += [("TrainingArguments._validate_args", t) for t in _raised_texts(inspect.cleandoc("\n" + validate))]
    return found


# Refusals no training config reaches through get_train_args: other commands' parsers, environment switches,
# and messages that carry the user's own words (the keys they name are found by the fallback).
NOT_TRAINING = (
    "vLLM engine",  # get_infer_args (chat/api/webchat): rules/serving.py
    "vLLM only accepts a single adapter",
    "Quantization dataset is necessary for exporting",  # export
    "Please use `--export_dir`",
    "USE_MCA",
    "mcore_adapter",
    "Only LoRA method",  # get_infer_args / export
    "not used by the HfArgumentParser",  # handled as the keys of another command or by UNKNOWN_KEY first
    "Please provide `model_name_or_path`",  # matched by 'no model' (checked below by the trigger)
    "Config file",
    "Unsupported",
    "requires torch>=0.2.0",  # transformers' check for a torch without reduce_lr_on_plateau: not this torch
)


def test_every_literal_refusal_has_its_own_cause() -> None:
    unknown = []
    for where, text in _library_refusals():
        if any(skip in text for skip in NOT_TRAINING) or len(text.strip()) < 12:
            continue
        case = cause_of("LLAMAFACTORY_REFUSED", text, {"output_dir": "out"}).case
        if case in ("other", "named keys"):
            unknown.append(f"{where}: {text}")
    assert not unknown, "refusals without a cause in lf/causes.json:\n" + "\n".join(unknown)


def test_each_cause_has_its_fix_in_the_registry() -> None:
    codes = load_codes()
    for code, entries in patterns().items():
        fix = codes.get(code).fix
        assert isinstance(fix, dict), f"{code}'s fix has no cases"
        for entry in entries:
            assert entry.case in fix, f"{code}: cause {entry.case!r} has no fix case"
        assert {"other", "named keys"} <= set(fix) or code != "LLAMAFACTORY_REFUSED"


def test_each_computed_value_is_named_by_a_cause_and_a_wrong_name_is_refused_when_read(monkeypatch) -> None:
    """A cause's computed values are named by its entry (lf/causes.json "values"): none is left unnamed, and an
    entry naming a function that is not there stops the causes from loading, naming the entry."""
    from llamafactory_rocm.lf import causes

    named = {p.values for entries in patterns().values() for p in entries if p.values}
    assert named == set(causes.COMPUTED)
    monkeypatch.setattr(causes, "COMPUTED", {k: v for k, v in causes.COMPUTED.items() if k != "even_probs"})
    causes.patterns.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"interleave probabilities.*even_probs"):
            causes.patterns()
    finally:
        causes.patterns.cache_clear()


def test_words_that_name_a_key_get_that_key_and_its_default() -> None:
    cause = cause_of("LLAMAFACTORY_REFUSED", "`lora_dropout` went somewhere odd", {"lora_dropout": 3.0, "lora": 1})
    assert (cause.case, cause.key, cause.remedy) == ("named keys", "lora_dropout", {"lora_dropout": None})
    assert cause.values["default"] == 0.0


# --- the keys people mean, and a stage no installable trl can run ------------------------------------------


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("model_max_length", "cutoff_len"),
        ("per_device_batch_size", "per_device_train_batch_size"),
        ("max_seq_len", "cutoff_len"),
        ("target_modules", "lora_target"),
        ("num_epochs", "num_train_epochs"),
    ],
)
def test_a_known_mix_up_names_the_key_training_reads(written: str, meant: str) -> None:
    from llamafactory_rocm.lf.schema import train_keys
    from llamafactory_rocm.rules.blog_keys import closest_key, generation_keys

    keys = train_keys()
    assert written not in keys and meant in keys
    assert closest_key(written, keys) == meant
    assert meant not in generation_keys()


def test_a_typo_is_never_sent_to_a_key_training_ignores(tiny_model: Path, tmp_path: Path, monkeypatch) -> None:
    """A generation key (GeneratingArguments) is accepted by the train parser and unused by training: stock
    get_train_args takes ``max_length: 7`` without complaint, so a typo renamed to it would be lost silently."""
    from llamafactory_rocm.lf.schema import train_keys
    from llamafactory_rocm.rules.blog_keys import closest_key, generation_keys

    monkeypatch.chdir(tmp_path)
    config = _config(tiny_model, tmp_path / "out", {"max_length": 7})
    assert stock_parser_words(config) is None
    assert "max_length" in generation_keys()
    assert closest_key("max_lenght", train_keys()) not in generation_keys()


def test_the_ppo_trainer_pin_conflicts_with_llamafactory_itself() -> None:
    """LLaMA-Factory's PPO trainer requires trl<=0.9.6 (train/ppo/trainer.py) and its start-up check trl>=0.18
    (extras/misc.py check_dependencies, recorded by running it): the fix must not be the downgrade."""
    from llamafactory_rocm.lf.stages import conflicting_requirement, own_requirements, trainer_requirements

    (pin,) = [r for r in trainer_requirements("ppo") if r.startswith("trl")]
    own = next(r for r in own_requirements() if r.startswith("trl"))
    assert conflicting_requirement(pin) == own
    assert conflicting_requirement(own) is None


@pytest.mark.parametrize(
    ("changes", "code", "key"),
    [
        ({"learning_rate": -0.1}, "OPTIMIZER_REFUSED", "learning_rate"),  # torch's AdamW: Invalid learning rate
        ({"lora_rank": 0}, "MODEL_MODULES_REFUSED", "lora_rank"),  # peft's LoraConfig
        ({"lora_target": "c_attn"}, "MODEL_MODULES_REFUSED", "lora_target"),  # peft's inject_adapter
        ({"stage": "foo"}, "STAGE_UNKNOWN", "stage"),  # LLaMA-Factory's tuner: Unknown task
        ({"lora_dropout": 1.5}, "MODEL_MODULES_REFUSED", "lora_dropout"),  # torch's Dropout, built by peft
        ({"adapter_name_or_path": "__empty__"}, "MODEL_MODULES_REFUSED", "adapter_name_or_path"),  # peft's config
        ({"report_to": "wandb"}, "REPORTER_UNAVAILABLE", "report_to"),  # transformers' WandbCallback
        ({"optim": "adamw_bnb_8bit"}, "OPTIMIZER_UNAVAILABLE", "optim"),  # transformers' optimizer lookup
        ({"fsdp": "full_shard"}, "FSDP_REFUSED", "fsdp"),  # accelerate's FSDP plugin: no GPU, one process
        ({"quantization_bit": 4}, "PACKAGE_MISSING", "quantization_bit"),  # bitsandbytes at model load
    ],
)
def test_a_launch_refusal_is_fixed_by_its_remedy(changes, code, key, tiny_model: Path, tmp_path: Path, monkeypatch):
    """Refusals past the parser (the trainer's optimizer, the adapter set-up): the fix names the key the library's
    words are about, and its remedy applied passes the launch run dry (LLaMA-Factory's own steps)."""
    import importlib.util

    # the package whose absence here is the refusal (wandb, bitsandbytes): where installed there is none
    absent = {"report_to": "wandb", "optim": "bitsandbytes", "quantization_bit": "bitsandbytes"}.get(key)
    if absent and importlib.util.find_spec(absent) is not None:
        pytest.skip(f"{absent} is installed here")
    monkeypatch.chdir(tmp_path)
    if changes.get("adapter_name_or_path") == "__empty__":  # an adapter folder the run never wrote into
        (tmp_path / "empty-adapter").mkdir()
        changes = {"adapter_name_or_path": str(tmp_path / "empty-adapter")}
    config = _config(tiny_model, tmp_path / "out", changes)
    first = next(f for f in check_config(config, plan_without_gpu=False).findings if f.level is Level.ERROR)
    assert (first.code, first.key) == (code, key), first.line()
    assert first.remedy and key in first.remedy, first.line()
    fixed = applied(config, first.remedy, config)
    again = [f for f in check_config(fixed, plan_without_gpu=False).findings if f.level is Level.ERROR]
    assert not again, [f.line() for f in again]


def test_resuming_another_rank_is_fixed_by_the_checkpoints_own_rank(tiny_model: Path, tmp_path: Path, monkeypatch):
    """output_dir holds checkpoint-1 of a stock LoRA rank-8 run (hook off), and the config now says rank 16:
    the fix's remedy is the rank the checkpoint was trained with, read from its adapter_config.json, and the
    config with it passes the launch run dry (the checkpoint's adapter shapes against the rebuilt adapter)."""
    from tests.stock_runner import hook_off_env, run_alone

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    trained = _config(tiny_model, out, {"lora_rank": 8, "save_steps": 1})
    (tmp_path / "rank8.yaml").write_text(yaml.safe_dump(trained))
    case = {"id": "rank8", "dir": str(tmp_path), "args": [str(tmp_path / "rank8.yaml")]}
    results, proc = run_alone([case], tmp_path, hook_off_env(tmp_path), name="rank8", timeout=600)
    assert results["rank8"]["exit"] == 0 and (out / "checkpoint-1").is_dir(), (results, proc.stderr[-2000:])
    config = {**trained, "lora_rank": 16, "max_steps": 2}
    first = next(f for f in check_config(config, plan_without_gpu=False).findings if f.level is Level.ERROR)
    assert (first.code, first.key, first.remedy) == ("CHECKPOINT_MISMATCH", "lora_rank", {"lora_rank": 8}), first.line()
    assert "lora_rank: 8" in first.fix, first.line()
    fixed = applied(config, first.remedy, config)
    again = [f for f in check_config(fixed, plan_without_gpu=False).findings if f.level is Level.ERROR]
    assert not again, [f.line() for f in again]


def test_a_streamed_local_file_is_refused_for_its_shards_and_its_fix_trains(tiny_model: Path, tmp_path: Path):
    """``streaming: true`` on a local file with the default ``dataloader_num_workers`` 0: the stock run stops
    with a bare StopIteration. LLaMA-Factory streams the file in that many shards (data/loader.py
    ``_load_single_dataset``, the same line on 0.9.5 and main, pinned below) and 0 shards hold no rows. The
    check names the cause and the key; the oracle is the stock run, refused as given and trained with the fix."""
    from llamafactory.data import loader

    from tests.stock_runner import hook_off_env, run_alone

    line = "dataset.to_iterable_dataset(num_shards=training_args.dataloader_num_workers)"
    assert line in inspect.getsource(loader._load_single_dataset)
    config = _config(tiny_model, tmp_path / "out", {"streaming": True, "max_steps": 1, "max_samples": DELETE})
    first = next(f for f in check_config(config, plan_without_gpu=False).findings if f.level is Level.ERROR)
    assert (first.code, first.key, first.remedy) == ("DATA_PIPELINE_REFUSED", "dataloader_num_workers",
                                                     {"dataloader_num_workers": 1}), first.line()  # fmt: skip
    assert "0 shard(s) reads no rows" in first.message and "dataloader_num_workers: 1" in first.fix
    fixed = {**applied(config, first.remedy, config), "output_dir": str(tmp_path / "fixed")}
    assert not [f for f in check_config(fixed, plan_without_gpu=False).findings if f.level is Level.ERROR]
    cases = []
    for name, each in (("given", config), ("fixed", fixed)):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(each))
        cases.append({"id": name, "dir": str(tmp_path), "args": [str(tmp_path / f"{name}.yaml")]})
    results, proc = run_alone(cases, tmp_path, hook_off_env(tmp_path), name="streamed", timeout=600)
    assert results["given"]["exit"] != 0 and "StopIteration" in results["given"]["error"], results
    assert results["fixed"]["exit"] == 0, (results, proc.stderr[-2000:])


def test_the_reward_model_fix_builds_the_reward_model_in_the_stock_run(tiny_model: Path, tmp_path: Path) -> None:
    """``stage: ppo`` without reward_model: the fix names reward_model and the reward_model_type that reads it
    (LLaMA-Factory's create_reward_model, train/trainer_utils.py: lora loads an adapter, full a model folder; a
    freeze/full policy takes no lora). The oracle is stock ``llamafactory-cli train`` (hook off) with the remedy
    filled in: a LoRA policy with the output_dir of a LoRA rm run, a full policy with a whole model's folder, both
    past create_reward_model to the ppo trainer's trl pin (train/ppo/trainer.py, which no trl LLaMA-Factory starts
    with meets: STAGE_PACKAGE_VERSION). A whole model's folder read as lora, what the old fix's '(or a reward
    model's folder)' gave, stops in create_reward_model."""
    import json

    from llamafactory_rocm.resources import datasets_dir
    from tests.stock_runner import hook_off_env, run_alone

    rows = json.loads((datasets_dir() / "amd_finetune_qa.json").read_text(encoding="utf-8"))[:8]
    pairs = [{"instruction": r["instruction"], "chosen": r["output"], "rejected": "No idea."} for r in rows]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "pairs.json").write_text(json.dumps(pairs))
    columns = {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected"}
    info = {"pairs": {"file_name": "pairs.json", "ranking": True, "columns": columns}}
    (tmp_path / "data" / "dataset_info.json").write_text(json.dumps(info))
    rm_run = _config(tiny_model, tmp_path / "rm", {"stage": "rm", "dataset": "pairs", "dataset_dir": "data"})
    runs = {"rm": rm_run}
    for policy, reward_model in (("lora", tmp_path / "rm"), ("full", tiny_model)):
        config = _config(tiny_model, tmp_path / f"ppo-{policy}", {"stage": "ppo", "finetuning_type": policy})
        first = next(f for f in check_config(config, plan_without_gpu=False).findings if f.level is Level.ERROR)
        assert first.remedy and first.remedy["reward_model"] == "<reward model>", first.line()
        assert f"reward_model_type: {first.remedy['reward_model_type']}" in first.fix, first.line()
        runs[f"{policy} policy"] = applied(config, first.remedy, {"reward_model": str(reward_model)})
    runs["folder as lora"] = {**runs["full policy"], "finetuning_type": "lora", "reward_model_type": "lora"}
    cases = []
    for name, config in runs.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config))
        cases.append({"id": name, "dir": str(tmp_path), "args": [str(tmp_path / f"{name}.yaml")]})
    results, proc = run_alone(cases, tmp_path, hook_off_env(tmp_path), name="ppo", timeout=600)
    assert results["rm"]["exit"] == 0, (results, proc.stderr[-2000:])
    for name in ("lora policy", "full policy"):  # past the reward model: trained, or stopped by the trainer's pin
        got = results[name]
        assert got["exit"] == 0 or "trl>=0.8.6,<=0.9.6 is required" in got["error"], (name, got)
    assert "adapter_config.json" in results["folder as lora"]["error"], results["folder as lora"]
