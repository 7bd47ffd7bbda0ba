"""docs/architecture.md's recipes, run: a rule is one function and one JSON entry, a LLaMA-Factory command
is one registry entry and one builder, a preset is one file. Each is added here in-process (undone after the test)
and seen running through the real check (check/run.py ``check_config``), on a preset planned for its GPU."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from llamafactory_rocm import presets
from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.errors import UsageError
from llamafactory_rocm.findings import Finding, Level, registry
from llamafactory_rocm.findings.registry import CodeEntry, CodeRegistry
from llamafactory_rocm.lf import commands
from llamafactory_rocm.lf.commands import CHAT, TRAIN, Command, Ref
from llamafactory_rocm.resources import presets_dir
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


# Recipe 3 (docs/architecture.md#add-a-preset-one-file): the file, as the doc writes it, in a copy of presets/.
def doc_preset() -> tuple[str, str]:
    """The file name and the YAML of the doc's worked example (its first yaml block under the heading)."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc.split("\n## Add a preset: one file\n", 1)[1]
    name = re.search(r"named `(\w+\.yaml)`", section)[1]
    return name, section.split("```yaml\n", 1)[1].split("```", 1)[0]


def test_a_preset_is_one_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture):
    from llamafactory_rocm.cli.main import main

    folder = tmp_path / "presets"
    shutil.copytree(presets_dir(), folder)
    before = set(presets.names())
    name, text = doc_preset()
    (folder / name).write_text(text, encoding="utf-8")
    monkeypatch.setattr(presets, "presets_dir", lambda: folder)  # where the package's presets are, for this test

    assert main(["presets", "list", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert set(rows) == before | {"w7800_llama3_lora"}
    row = rows["w7800_llama3_lora"]
    assert (row["gpu"], row["arch"], row["gpus"], row["model"], row["method"]) == (
        "w7800", "gfx1100", 1, "llama3-8b", "lora")  # fmt: skip
    assert row["description"] == "Llama-3-8B LoRA in 32 GB, batch 2 x 2048" and row["vram_gib"] == 32.0
    stated = float(re.search(r"estimated at (\d+\.\d) GiB", text)[1])
    assert row["estimated_peak_gib"] == pytest.approx(stated, abs=0.1)  # the doc's figure is the estimator's
    assert list(rows)[-1] == "w7800_llama3_lora"  # no order=: after the numbered ones

    assert main(["presets", "list", "--gpu", "w7900"]) == 0
    assert "w7800_llama3_lora" in capsys.readouterr().out  # the same arch
    assert main(["presets", "copy", "w7800_llama3_lora", str(tmp_path / "run.yaml")]) == 0
    assert (tmp_path / "run.yaml").read_text(encoding="utf-8") == text
    with pytest.raises(UsageError, match="no export or chat config"):
        presets.copy("w7800_llama3_lora", tmp_path / "again.yaml", with_after=True)  # optional: it has none
    capsys.readouterr()

    assert main(["check", str(folder / name)]) == 0  # checked for the GPU its target line names
    out = capsys.readouterr().out
    assert "planned for w7800 (gfx1100, named by the target line of w7800_llama3_lora.yaml)" in out
    assert "MEMORY_ESTIMATE: Estimated peak" in out and "ok: ready to launch" in out
