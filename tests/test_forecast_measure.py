"""``check --measure N``'s mechanics (forecast/measure.py): it runs LLaMA-Factory's trainer for N steps on this
machine in a throwaway folder, times the N-1 after the first and two shapes of one batch, and forecasts the run
as steps x overhead + FLOPs / rate + the saves, evaluations and epoch starts the run will make. The oracle of
what it counts is a stock run of the same config (hook off): its global_step, its checkpoints. Whether the
forecast is close to a real run's wall time is bench/bench_forecast_wall.py's question (speed targets live in
bench/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm.cli.main import main
from tests.conftest import offline_env, run_cli, tiny_train_config
from tests.stock_runner import hook_off_env, run_alone

pytestmark = pytest.mark.trainer


def test_measure_runs_the_trainer_and_counts_the_stock_runs_steps_and_saves(tiny_model: Path, tmp_path: Path):
    output_dir = tmp_path / "my-run"
    output_dir.mkdir()
    (output_dir / "keep.txt").write_text("the user's")
    # 7 steps, a checkpoint every 3: transformers saves at 3, 6 and at the end (7)
    run = tiny_train_config(tiny_model, output_dir, max_steps=7, save_steps=3, logging_steps=5)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = offline_env(tmp_path, TMPDIR=str(scratch))
    done = run_cli(["check", str(config), "--measure", "3", "--json"], tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    forecast = json.loads(done.stdout)["forecast"]
    measured = forecast["measured"]
    assert measured["made"], measured
    assert sorted(p.name for p in output_dir.iterdir()) == ["keep.txt"]  # the user's folder untouched
    assert list(scratch.iterdir()) == []  # the throwaway folder is gone

    # the oracle: the same config trained by stock LLaMA-Factory (hook off) into a folder of its own
    stock_dir = tmp_path / "stock"
    stock = {**run, "output_dir": str(stock_dir), "include_num_input_tokens_seen": True}
    (tmp_path / "stock.yaml").write_text(yaml.safe_dump(stock))
    case = {"id": "stock", "dir": str(tmp_path), "args": [str(tmp_path / "stock.yaml")]}
    results, proc = run_alone([case], tmp_path, hook_off_env(tmp_path), name="stock", timeout=600)
    assert results.get("stock", {}).get("exit") == 0, proc.stderr[-3000:]
    state = json.loads((stock_dir / "trainer_state.json").read_text())
    assert measured["run_steps"] == forecast["work"]["steps"] == state["global_step"] == 7
    assert measured["run_saves"] == len(list(stock_dir.glob("checkpoint-*"))) == 3
    assert measured["run_evaluations"] == 0
    # the two shapes are one real batch of the run at all its rows and at its first row
    tokens = sorted({k for k, _ in measured["shapes"]})
    assert len(tokens) == 2 and tokens[1] == stock["per_device_train_batch_size"] * tokens[0] <= 4 * 128

    assert measured["steps_run"] == 3 and measured["timed_steps"] == 2 == len(measured["step_seconds"])
    assert 0 < measured["timed_tokens"] <= 2 * 4 * 128 and measured["achieved_flops_per_s"] > 0
    assert "CPU" in measured["device"]
    # the run's time is the sum of its parts, each said (a save's is there: the stock run makes 3)
    parts = measured["run_seconds_parts"]
    assert measured["run_seconds"] == pytest.approx(sum(seconds for _, seconds in parts))
    low, high = measured["run_seconds_band"]
    assert low <= measured["run_seconds"] <= high
    assert any(text.startswith("3 save(s) x ") for text, _ in parts), parts
    if measured["model"] == "overhead + FLOPs / rate":
        assert parts[0][0].startswith("7 steps x ") and "FLOP/s" in parts[1][0]
    else:  # the two shapes' times came out reversed (a loaded machine): seconds a step, and why
        assert measured["model_why"] and parts[0][0].startswith("7 steps x ")
    _the_measure_carries_to_other_runs(done.stdout, config, run, measured, tmp_path)


def _checked(args: list[str]) -> tuple[int, str, str]:
    """``llamafactory-rocm ARGS`` in this process (``check --rate-from`` starts no child): exit, stdout, stderr."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


def _the_measure_carries_to_other_runs(said: str, config: Path, run: dict, measured: dict, tmp_path: Path):
    """``check --rate-from FILE``: the measure's rate and overheads forecast another run on that machine. On
    the measured config itself the steps' and FLOPs' parts equal the measure's own (its saves are its own);
    on another (batch 2, accumulation 3, cutoff 256) they follow that run's own steps, micro-batches and FLOPs."""
    rate_file = tmp_path / "rate.json"
    rate_file.write_text(said)
    print(f"MEASURED model: {measured['model']}")
    if measured["model"] != "overhead + FLOPs / rate":  # no rate to carry: one line, exit 2
        code, _, err = _checked(["check", str(config), "--rate-from", str(rate_file)])
        assert code == 2 and "not a FLOP rate" in err, err
        return
    code, out, err = _checked(["check", str(config), "--rate-from", str(rate_file), "--json"])
    carried = json.loads(out)["forecast"]["carried"]
    assert carried["made"] and carried["device"] == measured["device"] and carried["from"] == str(rate_file)
    own = dict(measured["run_seconds_parts"])
    (_, steps_s), (flops_text, flops_s), (_, warmup_s) = carried["run_seconds_parts"]
    assert steps_s == pytest.approx(measured["run_steps"] * measured["overhead_seconds_per_step"])
    assert flops_text in own and flops_s == pytest.approx(own[flops_text])
    assert warmup_s == pytest.approx(measured["warmup_seconds"])
    other = {**run, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 3, "cutoff_len": 256}
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    code, out, err = _checked(["check", str(tmp_path / "other.yaml"), "--rate-from", str(rate_file), "--json"])
    forecast = json.loads(out)["forecast"]
    (_, steps_s), (_, flops_s), _ = forecast["carried"]["run_seconds_parts"]
    micro = measured["overhead_seconds_per_micro_batch"]
    per_update = measured["overhead_seconds_per_step"] - measured["accumulation"] * micro
    assert steps_s == pytest.approx(7 * per_update + 7 * 3 * micro)  # 7 steps (max_steps), 21 micro-batches
    assert flops_s == pytest.approx(forecast["run_flops"] / measured["marginal_flops_per_s"])
    code, out, err = _checked(["check", str(tmp_path / "other.yaml"), "--rate-from", str(rate_file)])
    assert f"time there ({measured['device']}, measured {measured['date']} by the check --measure in " in out


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "no such file"),
        ("not json", "is not the JSON check --measure N --json writes"),
        ('{"forecast": {"measured": {"made": false, "why": "the check refused the config"}}}', "holds no measure"),
        ('{"made": true, "model": "seconds a step", "model_why": "one row a batch"}', "one row a batch"),
    ],
)
def test_a_rate_file_that_carries_no_rate_is_one_line(content, said, tmp_path, capsys):
    path = tmp_path / "rate.json"
    if content is not None:
        path.write_text(content)
    assert main(["check", "x.yaml", "--rate-from", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err and "--rate-from" in err, err


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
