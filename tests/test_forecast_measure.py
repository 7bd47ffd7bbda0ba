"""``check --measure N``'s mechanics (forecast/measure.py): it runs LLaMA-Factory's trainer for N steps on this
machine in a throwaway folder, times the N-1 after the first, and the forecast is the run's steps x the measured
seconds a step (+ the first step's warm-up). Whether that forecast is close to a real run's wall time is
bench/bench_forecast_wall.py's question (speed targets live in bench/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm.cli.main import main
from tests.conftest import offline_env, run_cli, tiny_train_config

pytestmark = pytest.mark.trainer


def test_measure_runs_the_trainer_and_forecasts_steps_times_seconds(tiny_model: Path, tmp_path: Path):
    output_dir = tmp_path / "my-run"
    output_dir.mkdir()
    (output_dir / "keep.txt").write_text("the user's")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_train_config(tiny_model, output_dir, max_steps=7)))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = offline_env(tmp_path, TMPDIR=str(scratch))
    done = run_cli(["check", str(config), "--measure", "2", "--json"], tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    forecast = json.loads(done.stdout)["forecast"]
    measured = forecast["measured"]
    assert measured["made"], measured
    assert measured["steps_run"] == 2 and measured["timed_steps"] == 1 == len(measured["step_seconds"])
    assert measured["seconds_per_step"] == pytest.approx(measured["step_seconds"][0], abs=1e-4)
    assert measured["run_steps"] == forecast["work"]["steps"] == 7
    expected = measured["run_steps"] * measured["seconds_per_step"] + measured["warmup_seconds"]
    assert measured["run_seconds"] == pytest.approx(expected)
    # the timed step's tokens are the trainer's own count (4 rows padded to a multiple of 8, at most 128)
    assert 0 < measured["timed_tokens"] <= 4 * 128 and measured["achieved_flops_per_s"] > 0
    assert "CPU" in measured["device"]
    assert sorted(p.name for p in output_dir.iterdir()) == ["keep.txt"]  # the user's folder untouched
    assert list(scratch.iterdir()) == []  # the throwaway folder is gone


def test_a_refused_config_is_not_run(capsys: pytest.CaptureFixture[str]):
    """check's findings refused it: nothing runs (the config names no model: a run would fail at once)."""
    from llamafactory_rocm.forecast.measure import measure
    from llamafactory_rocm.forecast.run import forecast_of

    forecast = forecast_of({"per_device_train_batch_size": 2}, 10, (5,) * 10, False, "sft", 1, None, {})
    measure(forecast, {"stage": "sft"}, {}, 3, ok=False)
    assert forecast.measured == {"made": False, "why": "the check refused the config: fix its findings first"}
    assert "measuring:" not in capsys.readouterr().err


@pytest.mark.parametrize("steps", ["0", "1", "-3", "2.5", "five"])
def test_a_number_of_steps_that_is_not_one_is_one_line(steps: str, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as stop:
        main(["check", "x.yaml", "--measure", steps])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--measure" in err and "e.g. --measure 5" in err


def test_measure_is_of_this_machine_not_a_planned_card(capsys: pytest.CaptureFixture[str]):
    assert main(["check", "x.yaml", "--measure", "3", "--gpu", "mi300x"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "drop --gpu" in err
