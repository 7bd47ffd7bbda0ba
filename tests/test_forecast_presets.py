"""``presets list --forecast`` (cli/presets_cmd.py): each preset's forecast on its own dataset and target card is
the one ``check PRESET --forecast`` gives (the preset's target line: its card and GPUs). The preset's model is
put in an offline Hugging Face cache as Llama-3-8B's config.json and the tiny tokenizer (no weights: the dry
run builds it on the meta device)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llamafactory_rocm.resources import presets_dir
from tests.conftest import offline_env, run_cli
from tests.test_planning import llama3_8b_folder

REVISION = "0" * 40


def _cached_llama3(tiny_model: Path, hf_home: Path) -> None:
    repo = hf_home / "hub" / "models--meta-llama--Meta-Llama-3-8B-Instruct"
    llama3_8b_folder(tiny_model, repo / "snapshots" / REVISION)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)


def test_a_presets_forecast_is_the_checks(tiny_model: Path, tmp_path: Path):
    env = offline_env(tmp_path)
    _cached_llama3(tiny_model, Path(env["HF_HOME"]))
    listed = run_cli(["presets", "list", "--gpu", "mi355x", "--forecast", "--json"], tmp_path, env)
    assert listed.returncode == 0, listed.stderr[-2000:]
    (entry,) = json.loads(listed.stdout)
    assert entry["name"] == "mi355x_llama3_lora"
    preset = tmp_path / "mi355x_llama3_lora.yaml"
    shutil.copy(presets_dir() / preset.name, preset)
    checked = run_cli(["check", str(preset), "--forecast", "--json"], tmp_path, env)
    assert checked.returncode == 0, checked.stderr[-2000:]
    forecast = json.loads(checked.stdout)["forecast"]
    assert entry["forecast"]["card"]["alias"] == forecast["card"]["alias"] == "mi355x"
    for key in ("work", "tokens", "run_flops", "hours", "hours_at_peak", "gpus"):
        assert entry["forecast"][key] == pytest.approx(forecast[key]), key
    # MI355X: no published absolute BF16 training figure, so a lower bound at its peak (forecast/rates.json)
    assert entry["forecast"]["hours_at_peak"] > 0
