"""Each training preset names the export and chat configs that follow it: train -> export -> chat from the pack."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm import presets
from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.errors import UsageError
from llamafactory_rocm.findings import Level
from llamafactory_rocm.lf.commands import command_keys, infer_command
from llamafactory_rocm.preset_registry import AFTER_COMMANDS
from llamafactory_rocm.resources import presets_dir

NAMES = presets.names()


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_the_after_folder_holds_exactly_the_companions_of_the_training_presets():
    expected = {f"after/{name}_{command}.yaml" for name in NAMES for command in AFTER_COMMANDS}
    on_disk = {str(p.relative_to(presets_dir())) for p in (presets_dir() / "after").glob("*.yaml")}
    assert on_disk == expected  # optional for a new preset; every shipped one has both
    assert all([command for command, _ in presets.entry(name).after] == ["export", "chat"] for name in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_export_follows_the_training_preset(name):
    train = presets.raw(name)
    export = load(presets.after_paths(name)["export"])
    assert infer_command(export) == "export" and set(export) <= command_keys("export")
    assert export["adapter_name_or_path"] == train["output_dir"]
    assert export["model_name_or_path"] == train["model_name_or_path"] and export["template"] == train["template"]
    assert export["export_device"] == "cpu" and "quantization_bit" not in export  # docs/after-training.md#t1, #t2
    assert export["export_dir"] not in {train["output_dir"], train["model_name_or_path"]}


@pytest.mark.parametrize("name", NAMES)
def test_chat_serves_what_the_export_wrote(name):
    train = presets.raw(name)
    export = load(presets.after_paths(name)["export"])
    chat = load(presets.after_paths(name)["chat"])
    assert infer_command(chat) == "chat" and set(chat) <= command_keys("chat")
    assert chat["model_name_or_path"] == export["export_dir"] and chat["template"] == train["template"]


@pytest.mark.parametrize("name", NAMES)
def test_each_companion_checks_clean_for_the_presets_gpu(name):
    gpu = presets.entry(name).gpu
    for command, file in presets.after_paths(name).items():
        report = check_config(load(file), gpu=gpu, command=command, config_path=file)
        assert [f.line() for f in report.findings if f.level is Level.ERROR] == [], (command, file)


def test_copy_with_after_writes_them_beside_the_copy_and_never_overwrites(tmp_path):
    written = presets.copy("rx7800xt_llama3_qlora", tmp_path / "run.yaml", with_after=True)
    assert [p.name for p in written] == ["run.yaml", "run_export.yaml", "run_chat.yaml"]
    assert load(tmp_path / "run_export.yaml")["adapter_name_or_path"] == load(tmp_path / "run.yaml")["output_dir"]
    (tmp_path / "run_chat.yaml").write_text("# mine\n")
    with pytest.raises(UsageError, match="--force"):
        presets.copy("rx7800xt_llama3_qlora", tmp_path / "run.yaml", with_after=True)
    assert (tmp_path / "run_chat.yaml").read_text() == "# mine\n"
    presets.copy("rx7800xt_llama3_qlora", tmp_path / "run.yaml", with_after=True, force=True)
    assert (tmp_path / "run_chat.yaml").read_text() == presets.after_paths("rx7800xt_llama3_qlora")["chat"].read_text()
    assert [p.name for p in presets.copy("w7900_llama3_lora", tmp_path)] == ["w7900_llama3_lora.yaml"]  # default


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llamafactory_rocm.cli.main", "presets", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)  # fmt: skip


def test_cli_show_names_them_and_copy_writes_them(tmp_path):
    shown = cli("show", "mi300x_llama3_lora", cwd=tmp_path)
    after = presets.after_paths("mi300x_llama3_lora")
    assert f"#   export: llamafactory-cli export {after['export']}" in shown.stdout
    assert f"#   chat: llamafactory-cli chat {after['chat']}" in shown.stdout
    assert yaml.safe_load(shown.stdout)["output_dir"] == "saves/mi300x-llama3-8b-lora"  # still the preset's YAML
    copied = cli("copy", "mi300x_llama3_lora", "run.yaml", "--with-after", cwd=tmp_path)
    assert copied.returncode == 0, copied.stderr
    assert {p.name for p in tmp_path.iterdir()} == {"run.yaml", "run_export.yaml", "run_chat.yaml"}
    assert "llamafactory-cli export run_export.yaml" in copied.stdout
    again = cli("copy", "mi300x_llama3_lora", "run.yaml", "--with-after", cwd=tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr
