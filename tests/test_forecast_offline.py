"""The forecast where users plan: a laptop with none of the presets' models, offline, an empty Hugging Face cache
(lf/model_files.py). Every preset gets a time on its card, made on its model's bundled shape with a tokenizer of
its family (llamafactory_rocm/standin/), and says so; the FLOPs of that build are the ones the same shape gives
when its config.json is in the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamafactory_rocm.presets import list_presets
from tests.conftest import offline_env, run_cli
from tests.test_forecast_presets import _cached_llama3


@pytest.fixture(scope="module")
def listed(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    folder = tmp_path_factory.mktemp("laptop")
    done = run_cli(["presets", "list", "--forecast", "--json"], folder, offline_env(folder), timeout=2400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Warning" not in done.stderr, done.stderr[-3000:]  # no library warning about this machine
    return json.loads(done.stdout)


def test_every_preset_is_timed_offline_with_an_empty_cache(listed):
    assert [e["name"] for e in listed] == [i.entry.name for i in list_presets()]
    for entry in listed:
        f = entry["forecast"]
        assert f.get("made") is not False, (entry["name"], f)
        assert f["model_files"]["how"] == "standin" and f["model_files"]["shape"], entry["name"]
        assert f["work"]["steps"] > 0 and f["tokens"]["total"] > 0 and f["run_flops"] > 0, entry["name"]
        assert f["hours"] or f["hours_at_peak"], (entry["name"], f["notes"])
        why = f["model_files"]["why"]
        assert "HF_HUB_OFFLINE is set here" in why, why


def test_the_table_gives_each_presets_answer_and_what_it_rests_on(listed, capsys):
    from llamafactory_rocm.cli.presets_cmd import forecast_table
    from llamafactory_rocm.forecast.render import answer

    forecast_table(list_presets(), {e["name"]: e["forecast"] for e in listed})
    table = capsys.readouterr().out
    for entry in listed:
        found = answer(entry["forecast"])
        row = next(line for line in table.splitlines() if line.startswith(entry["name"] + " "))
        assert found.short_time in row and found.where in row and found.work in row, row
    llama = next(e for e in listed if e["name"] == "mi300x_llama3_lora")["forecast"]["model_files"]
    assert not llama["tokenizer_exact"] and llama["tokenizer_error"], llama
    assert llama["tokenizer_error"].split(" (")[0] in table  # the stand-in's measured error, beside the figures


def test_the_bundled_shape_counts_the_flops_its_cached_config_counts(listed, tiny_model, tmp_path):
    """mi355x_llama3_lora built from the bundled shape (stand-in) against the same preset with Llama-3-8B's
    config.json in the cache (tests/test_forecast_presets.py): the same FLOPs for a micro-batch at the traced shape
    (batch x cutoff_len); the run's totals differ as the tokenizers' lengths do."""
    env = offline_env(tmp_path)
    _cached_llama3(tiny_model, Path(env["HF_HOME"]))
    cached = run_cli(["presets", "list", "--gpu", "mi355x", "--forecast", "--json"], tmp_path, env)
    assert cached.returncode == 0, cached.stderr[-2000:]
    (real,) = json.loads(cached.stdout)
    assert real["forecast"]["model_files"] is None  # in the cache: nothing stood in
    stood = next(e for e in listed if e["name"] == "mi355x_llama3_lora")["forecast"]
    assert real["forecast"]["flops_note"] == stood["flops_note"]
