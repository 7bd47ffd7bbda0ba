"""``check --for``: each llamafactory-cli command judged by its own LLaMA-Factory parser and its own rules.

Oracles: LLaMA-Factory's parsers (get_infer_args refuses a training key; get_train_args refuses
``infer_backend: vllm``), PEFT's adapter_config.json, and the recorded machine snapshots.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.findings import Level
from llamafactory_rocm.lf.commands import CHAT as CHAT_CHAIN
from llamafactory_rocm.lf.commands import EXPORT as EXPORT_CHAIN
from llamafactory_rocm.lf.commands import TRAIN as TRAIN_CHAIN
from llamafactory_rocm.lf.commands import command_verdict
from llamafactory_rocm.rules import PLAN_RULES, RULES, TRAIN_RULES, module_rules, predict, serving
from llamafactory_rocm.rules import export as export_rules
from tests.after_training_helpers import peft_adapter_config
from tests.conftest import load_snapshot
from tests.registry_chains import plan_for, rules_for

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"
ADAPTER = {"model_name_or_path": MODEL, "adapter_name_or_path": "saves/llama3-8b/lora/sft", "template": "llama3"}
EXPORT = {**ADAPTER, "export_dir": "models/merged"}


def codes(report, level: Level | None = None) -> set[str]:
    return {f.code for f in report.findings if level is None or f.level is level}


def test_rules_for_each_command():
    assert rules_for("train") == TRAIN_RULES and plan_for("train") == PLAN_RULES and RULES == TRAIN_RULES + PLAN_RULES
    assert not set(PLAN_RULES) & set(TRAIN_RULES)  # the plan is a chain of its own, run after the dry launch
    assert plan_for("chat") == ()
    assert module_rules(predict, TRAIN_CHAIN) and set(module_rules(predict, TRAIN_CHAIN)) <= set(TRAIN_RULES)
    export_names = {r.__name__ for r in rules_for("export")}
    assert {r.__name__ for r in module_rules(export_rules, EXPORT_CHAIN)} <= export_names
    chat_rules = module_rules(serving, CHAT_CHAIN)
    assert chat_rules and set(chat_rules) <= set(rules_for("chat"))
    assert rules_for("chat") == rules_for("api") == rules_for("webchat")
    assert not set(chat_rules) & set(rules_for("export"))
    with pytest.raises(ValueError, match="unknown command"):
        rules_for("serve")


def test_the_quantized_merge_is_refused_for_export(tmp_path):
    report = check_config({**EXPORT, "quantization_bit": 4}, snapshot=load_snapshot("rx7800xt"), command="export")
    assert "MERGE_INTO_QUANTIZED" in codes(report, Level.ERROR) and not report.ok
    # as a training config (the old behaviour) it was never seen: the export rules do not run for train
    assert "MERGE_INTO_QUANTIZED" not in codes(check_config({**EXPORT, "quantization_bit": 4}, command="train"))


def test_the_vllm_rank_is_refused_for_chat(tmp_path):
    adapter = peft_adapter_config(tmp_path / "lora", MODEL, r=64)
    config = {**ADAPTER, "adapter_name_or_path": str(adapter), "infer_backend": "vllm"}
    report = check_config(config, gpu="mi300x", command="chat")
    (finding,) = [f for f in report.findings if f.code == "VLLM_LORA_RANK_TOO_SMALL"]
    assert finding.level is Level.ERROR and finding.new == 64 and not report.ok
    assert check_config({**config, "vllm_max_lora_rank": 64}, gpu="mi300x", command="chat").ok


@pytest.mark.parametrize("backend", ["huggingface", "vllm"])
def test_a_chat_config_planned_for_an_mi300x_is_not_refused(backend):
    report = check_config({**ADAPTER, "infer_backend": backend}, gpu="mi300x", command="chat")
    assert report.ok, [f.line() for f in report.findings if f.level is Level.ERROR]
    assert "PLANNED_TARGET" in codes(report)
    assert ("VLLM_ROCM_REQUIRED" in codes(report)) == (backend == "vllm")


def test_infer_backend_vllm_is_no_longer_a_false_refusal():
    config = {**ADAPTER, "infer_backend": "vllm"}
    # what LLaMA-Factory's training parser says of it: the refusal `check` used to report
    assert not command_verdict(config, "train").accepted
    for command in ("chat", "api", "webchat"):
        assert "LLAMAFACTORY_REFUSED" not in codes(check_config(config, gpu="mi300x", command=command))


def test_a_training_key_in_an_export_config_is_llamafactorys_own_refusal():
    report = check_config({**EXPORT, "do_train": True}, snapshot=load_snapshot("mi300x"), command="export")
    (finding,) = [f for f in report.findings if f.code == "LLAMAFACTORY_REFUSED"]
    assert "llamafactory-cli export" in finding.message and "do_train" in finding.message
    assert "llamafactory-cli export` does not read them" in finding.fix


def test_export_on_the_cpu_leaves_the_device_rules_aside():
    # a CUDA torch beside AMD GPUs (a recorded machine) refuses a run on the GPU, not a merge on the CPU
    snapshot = load_snapshot("wrong_wheel_mi300x")
    assert "TORCH_NOT_ROCM" in codes(check_config(ADAPTER, snapshot=snapshot, command="chat"), Level.ERROR)
    assert "TORCH_NOT_ROCM" not in codes(check_config(EXPORT, snapshot=snapshot, command="export"))
    on_gpu = check_config({**EXPORT, "export_device": "auto"}, snapshot=snapshot, command="export")
    assert "TORCH_NOT_ROCM" in codes(on_gpu, Level.ERROR)


def test_an_export_check_writes_nothing(tmp_path):
    """LLaMA-Factory's export_model runs inside the check up to its first load: no folder, no record."""
    out = tmp_path / "merged"
    report = check_config({**EXPORT, "export_dir": str(out)}, snapshot=load_snapshot("mi300x"), command="export")
    assert report.ok, [f.line() for f in report.findings]
    assert not out.exists()


def test_an_unknown_command_is_a_usage_error():
    from llamafactory_rocm.errors import UsageError

    with pytest.raises(UsageError, match="unknown command 'serve'"):
        check_config(ADAPTER, command="serve")


def cli_check(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llamafactory_rocm.cli.main", "check", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_says_which_command_and_how_it_was_chosen(tmp_path):
    (tmp_path / "merge.yaml").write_text(yaml.safe_dump({**EXPORT, "quantization_bit": 4}))
    inferred = cli_check(["merge.yaml"], tmp_path)
    assert inferred.returncode == 1, inferred.stderr[-2000:]
    assert inferred.stdout.splitlines()[0] == "checked for: export (from its keys; --for to choose another)"
    assert "[error] MERGE_INTO_QUANTIZED" in inferred.stdout
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump({**ADAPTER, "infer_backend": "vllm"}))
    given = cli_check(["serve.yaml", "--for", "api", "--gpu", "mi300x", "--json"], tmp_path)
    assert given.returncode == 0, given.stdout[-3000:] + given.stderr[-2000:]
    out = json.loads(given.stdout)
    assert out["command"] == "api" and out["command_from"] == "--for" and out["ok"] is True
    assert "VLLM_ROCM_REQUIRED" in {f["code"] for f in out["findings"]}
    assert not list(tmp_path.glob("models"))  # nothing written
