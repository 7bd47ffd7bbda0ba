"""docs/architecture.md's two recipes, run: a rule is one function and one JSON entry, a LLaMA-Factory command
is one registry entry and one builder. Each is added here in-process (undone after the test) and seen running
through the real check (check/run.py ``check_config``), on a preset planned for its GPU."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from llamafactory_rocm import presets
from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.findings import Finding, Level, registry
from llamafactory_rocm.findings.registry import CodeEntry, CodeRegistry
from llamafactory_rocm.lf import commands
from llamafactory_rocm.lf.commands import CHAT, TRAIN, Command, Ref
from llamafactory_rocm.rules import values
from llamafactory_rocm.rules.base import Context, Step, rule, unchanged
from tests.registry_chains import rules_for

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"


def _entry(level: str, fix: str, module: str) -> CodeEntry:
    return CodeEntry(level=level, summary="s", what="w", why="y", fix=fix, example="e", module=module)


@pytest.fixture
def codes(monkeypatch: pytest.MonkeyPatch) -> dict[str, CodeEntry]:
    """The registry with room for this test's entries (what a codes/<module>.json entry adds)."""
    added: dict[str, CodeEntry] = {}
    real = registry.load_codes()
    monkeypatch.setattr(registry, "load_codes", lambda: CodeRegistry(codes={**real.codes, **added}))
    return added


# Recipe 1 (docs/architecture.md#add-a-rule-one-function-and-one-json-entry): the function, declared in its
# chain, in an existing rules module.
@rule(TRAIN)
def say_the_seed(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if "seed" in config:
        return unchanged(config, env)
    return unchanged(config, env, Finding(code="SEED_UNSET", key="seed", message="seed is unset.", fix_with={}))


def test_a_rule_is_one_function_and_one_entry(monkeypatch: pytest.MonkeyPatch, codes: dict[str, CodeEntry]):
    codes["SEED_UNSET"] = _entry("info", "Set seed: 42 to write down the seed the run uses.", "rules.values")
    monkeypatch.setattr(say_the_seed, "__module__", values.__name__)
    monkeypatch.setattr(values, "say_the_seed", say_the_seed, raising=False)
    train = rules_for("train")
    assert say_the_seed in train and say_the_seed not in rules_for("chat")  # declared in TRAIN only
    assert train.index(say_the_seed) == train.index(values.refuse_unconvertible_values) + 1  # its module's place

    report = check_config(presets.load("mi300x_llama3_lora"), gpu="mi300x")
    (seed,) = [f for f in report.findings if f.code == "SEED_UNSET"]
    assert (
        seed.level is Level.INFO and seed.fix == "Set seed: 42 to write down the seed the run uses."
    )  # both from the entry
    assert report.ok  # an info: ready to launch
    monkeypatch.undo()
    assert say_the_seed not in rules_for("train")


# Recipe 2 (docs/architecture.md#add-a-llama-factory-command-one-registry-entry-and-one-builder): the builder,
# then the entry.
@dataclass
class _Built:
    findings: list[Finding] = field(default_factory=list)


def build_score_dry(config: Mapping[str, Any], command: str, *, planned: bool = False) -> _Built:
    """What the check builds for ``score``: here one finding that says it ran, and with what."""
    why = "planned for another machine" if planned else "on this machine"
    return _Built([Finding(code="SCORE_BUILT", message=f"{command} built dry ({why}).", fix_with={})])


SCORE = Command(
    "score",
    cli=Ref("llamafactory.chat.chat_model", "run_chat"),
    parser=Ref("llamafactory.hparams.parser", "get_infer_args"),
    parser_args=Ref("llamafactory.hparams.parser", "_INFER_ARGS"),
    rules=CHAT,
    dry=Ref(__name__, "build_score_dry"),
)


def test_a_command_is_one_entry_and_one_builder(monkeypatch: pytest.MonkeyPatch, codes: dict[str, CodeEntry]):
    codes["SCORE_BUILT"] = _entry("info", "Nothing to do.", "tests.test_architecture")
    registry_with_score = (*commands.REGISTRY, SCORE)  # what one more entry in REGISTRY's source gives
    monkeypatch.setattr(commands, "REGISTRY", registry_with_score)
    monkeypatch.setattr(commands, "_BY_NAME", {e.name: e for e in registry_with_score})
    monkeypatch.setattr(commands, "COMMANDS", (*commands.COMMANDS, "score"))
    assert rules_for("score") == rules_for("chat")

    config = {"model_name_or_path": MODEL, "adapter_name_or_path": "saves/lora", "template": "llama3"}
    report = check_config(config, gpu="mi300x", command="score")
    assert [f.message for f in report.findings if f.code == "SCORE_BUILT"] == [
        "score built dry (planned for another machine)."
    ]
    refused = check_config({**config, "output_dir": "saves/x"}, gpu="mi300x", command="score")
    assert "output_dir" in refused.findings[0].message  # its own parser (get_infer_args) refuses a training key
    assert not [f for f in refused.findings if f.code == "SCORE_BUILT"]  # not built past a refusal
