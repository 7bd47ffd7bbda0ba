"""The closing summary: ``format_summary`` on its own, and ``SummaryCallback`` on LLaMA-Factory's real trainer,
with the pre-launch check's forecast beside what the run measured (the oracle: the stock run's own files)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm.check.record import latest_record
from llamafactory_rocm.forecast.cards import Card, rates
from llamafactory_rocm.forecast.flops import StepFlops
from llamafactory_rocm.forecast.run import NoForecast, TrainRows, forecast_of
from llamafactory_rocm.train.summary import (
    NO_FORECAST,
    PeakMemory,
    RunSummary,
    format_summary,
    format_summary_line,
    run_record,
)
from llamafactory_rocm.train.verbosity import quiet_by_default
from tests.conftest import offline_env, tiny_train_config


def make_summary(tmp_path: Path, **changes: object) -> RunSummary:
    values: dict = dict(
        losses=(7.25, 3.5, 0.4912),
        steps=200,
        tokens=120_000,
        tokens_counted=True,
        train_s=12.0,
        wall_s=150.0,
        memory=PeakMemory(0.5512, "process peak RSS (no GPU in use)"),
        output_dir=tmp_path,
        adapter=tmp_path / "adapter_model.safetensors",
        plot=tmp_path / "training_loss.png",
        record=tmp_path / "rocm_launch.json",
    )
    values.update(changes)
    return RunSummary(**values)


def rows(text: str) -> dict[str, str]:
    """{label: value} of the summary's indented lines (labels are padded to one width)."""
    out = {}
    for line in text.splitlines()[1:]:
        label, value = line.strip().split("  ", 1)
        out[label] = value.strip()
    return out


def test_format_summary_says_each_fact_on_its_own_line(tmp_path: Path) -> None:
    text = format_summary(make_summary(tmp_path))
    assert text.splitlines()[0] == "llamafactory-rocm: training summary"
    assert rows(text) == {
        "loss": "7.250 -> 0.491 (first and last of 3 logged)",
        "steps": "200",
        "tokens/s": "10,000 (120,000 tokens, counted)",
        "peak memory": "0.55 GiB process peak RSS (no GPU in use)",
        "wall time": "2 min 30 s (training 12.0 s, transformers' train_runtime)",
        "forecast": f"none: {NO_FORECAST}",
        "adapter": str(tmp_path / "adapter_model.safetensors"),
        "loss plot": str(tmp_path / "training_loss.png"),
        "launch record": str(tmp_path / "rocm_launch.json"),
    }


def test_format_summary_says_what_is_missing_and_why(tmp_path: Path) -> None:
    summary = make_summary(
        tmp_path, losses=(), tokens=None, memory=None, wall_s=None, train_s=None, adapter=None, plot=None, record=None
    )
    got = rows(format_summary(summary))
    assert got["loss"].startswith("none logged (logging_steps")
    assert got["tokens/s"].startswith("not known (set include_num_input_tokens_seen")
    assert got["peak memory"] == got["wall time"] == "not known"
    assert got["adapter"] == "none saved" and got["launch record"] == "none"
    assert got["loss plot"] == "none (plot_loss: true writes one)"
    estimated = rows(format_summary(make_summary(tmp_path, tokens_counted=False)))["tokens/s"]
    assert estimated.endswith("estimated from the data's mean row length)")
    assert format_summary_line(summary) == "no loss logged, 200 steps"


def test_format_summary_line(tmp_path: Path) -> None:
    line = format_summary_line(make_summary(tmp_path))
    assert line == "loss 7.250 -> 0.491, 200 steps, 10,000 tokens/s, peak 0.55 GiB (process peak RSS), 2 min 30 s wall"


def forecast_json(card: Card | None, rows_scaled: tuple[int, int, int] | None = None) -> dict:
    """A forecast as the check makes it (forecast/run.py ``forecast_of``) and the record keeps it (JSON): 64 rows of
    uneven lengths, batch 4, one epoch, a counted step of 4 x 128 tokens."""
    step = StepFlops(forward=10**12, backward=2 * 10**12, recompute=10**12, sequences=4, length=128)
    config = {"per_device_train_batch_size": 4, "num_train_epochs": 1.0}
    found = {"step_flops": step}
    made = forecast_of(config, TrainRows(64, tuple(range(60, 124)), rows_scaled=rows_scaled), 1, card, found)
    return json.loads(json.dumps(made.as_json(), default=str))


def test_the_forecast_is_said_beside_the_run_with_its_source(tmp_path: Path) -> None:
    """Each forecast figure next to what the run measured, and where it comes from: a band from a published
    fraction, a lower bound at 100% of peak, or why there is none; the record's "run" block says the same."""
    fraction = rates()["achieved"]["mi300x"]
    banded = forecast_json(Card("mi300x", 1307.4, "archs.json"))
    summary = make_summary(tmp_path, global_step=16, steps=16, forecast=banded)
    got = rows(format_summary(summary))
    tokens = banded["tokens"]["total"]
    assert got["forecast"] == f"16 steps (global_step 16), {tokens:,} tokens with padding (counted 120,000): " + (
        "the check before launch"
    )
    low, high = (h * 3600 for h in banded["hours"])
    assert got["forecast time"].startswith(f"{low:.2g} s to {high:.2g} s (trained 12.0 s): mi300x x 1, ")
    assert f"{fraction['label']}, {fraction['date']})" in got["forecast time"]
    said = run_record(summary)["forecast"]
    assert said["steps"] == banded["work"]["steps"] and said["time"]["seconds"] == [low, high]
    assert said["measured_over_forecast"] == [12.0 / high, 12.0 / low]

    at_peak = forecast_json(Card("rx7900xtx", 122.8, "archs.json"))  # no published fraction
    got = rows(format_summary(make_summary(tmp_path, global_step=16, forecast=at_peak)))
    assert got["forecast time"].startswith(f"at least {at_peak['hours_at_peak'] * 3600:.2g} s (trained 12.0 s): ")
    assert got["forecast time"].endswith("at 100% of peak: no measured fraction for this card")

    scaled = forecast_json(None, rows_scaled=(51, 256, 300))  # packed rows of a sample, scaled: an estimate
    assert rows(format_summary(make_summary(tmp_path, global_step=16, forecast=scaled)))["forecast"].startswith(
        "about 16 steps (global_step 16)"
    )

    resumed = rows(format_summary(make_summary(tmp_path, global_step=16, steps=4, resumed_from=12, forecast=at_peak)))
    assert resumed["forecast"].startswith("16 steps for the whole run (global_step 16)")

    no_card = forecast_json(None)  # a CPU: no card rate, so no time, and the forecast's own reason
    got = rows(format_summary(make_summary(tmp_path, global_step=16, tokens_counted=False, forecast=no_card)))
    assert got["forecast time"] == "none for this machine (the check's forecast: the card is not in the catalogue " + (
        "(name one with --gpu))"
    )
    assert got["forecast"].endswith("tokens with padding (not counted by the trainer): the check before launch")
    not_made = NoForecast("the dry run counted no train rows").as_json()
    got = rows(format_summary(make_summary(tmp_path, forecast=not_made)))
    assert got["forecast"] == "none: the dry run counted no train rows" and "forecast time" not in got
    assert run_record(make_summary(tmp_path, forecast=not_made))["forecast"] == {
        "made": False,
        "why": "the dry run counted no train rows",
    }


# What the hook and launch do: quiet_by_default() before LLaMA-Factory is imported and again before
# run_exp trains, run_exp with the callback, then report() once run_exp returns.
SCRIPT = textwrap.dedent(
    """
    import sys, yaml
    from llamafactory_rocm.train.verbosity import quiet_by_default

    quiet_by_default()
    from llamafactory.train.tuner import run_exp
    from llamafactory_rocm.train.summary import SummaryCallback

    quiet_by_default()
    callback = SummaryCallback()
    run_exp(yaml.safe_load(open(sys.argv[1])), [callback])
    callback.report()
    """
)


def summary_of_a_real_run(
    tmp_path: Path, model: Path, env: dict[str, str] | None = None, **overrides: object
) -> tuple[dict[str, str], Path, str]:
    """(summary rows, output_dir, the whole log) of a 6-step run through LLaMA-Factory's real trainer."""
    out = tmp_path / "out"
    config = tiny_train_config(model, out, max_steps=6, logging_steps=2, **overrides)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(config))
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), str(cfg)],
        cwd=tmp_path,
        env=offline_env(tmp_path, OMP_NUM_THREADS="1", **(env or {})),  # a model this small trains faster on one thread
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    start = lines.index("llamafactory-rocm: training summary")  # the hook's, inside run_exp; the script's comes next
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line)
    return rows("\n".join(block)), out, result.stdout + result.stderr


@pytest.mark.trainer
def test_summary_of_a_real_trainer_run_with_counted_tokens_and_a_plot(tiny_model: Path, tmp_path: Path) -> None:
    got, out, log = summary_of_a_real_run(tmp_path, tiny_model, include_num_input_tokens_seen=True, plot_loss=True)
    state = json.loads((out / "trainer_state.json").read_text())
    curve = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert got["loss"] == f"{curve[0]:.3f} -> {curve[-1]:.3f} (first and last of 3 logged)"
    assert got["steps"] == "6" == str(state["global_step"])
    # the measured figures are the stock run's own: transformers' train_runtime (LLaMA-Factory's train_results.json)
    runtime, step = json.loads((out / "train_results.json").read_text())["train_runtime"], state["global_step"]
    seen = state["num_input_tokens_seen"]
    assert got["tokens/s"] == f"{seen / runtime:,.0f} ({seen:,} tokens, counted)"
    said = re.search(r"\(training ([\d.]+) s, transformers' train_runtime\)$", got["wall time"])
    assert said and float(said[1]) == pytest.approx(runtime, rel=0.05)  # as said: two figures under a second
    # the forecast the hook's check made before launch (in its record), beside them: steps exact, tokens within 2%
    record = latest_record(out)
    forecast = record["forecast"]["tokens"]["total"]
    assert abs(forecast - seen) <= 0.02 * seen, (forecast, seen)
    assert got["forecast"] == (
        f"{record['forecast']['work']['steps']} steps (global_step {step}), {forecast:,} tokens with padding "
        f"(counted {seen:,}): the check before launch"
    )
    assert record["forecast"]["work"]["steps"] == step
    assert got["forecast time"].startswith("none for this machine (the check's forecast: the card is not in")
    run = record["run"]  # the same, added to the launch record after the run
    assert (run["global_step"], run["train_runtime_s"], run["tokens"]) == (step, runtime, seen)
    assert (run["forecast"]["steps"], run["forecast"]["tokens_with_padding"]) == (step, forecast)
    assert "none" in run["forecast"]["time"] and run["tokens_counted"] is True
    # the script's own callback has no check's forecast, and says so in one line
    assert f"  forecast       none: {NO_FORECAST}" in log
    memory_gib = float(got["peak memory"].split(" GiB ")[0])
    assert got["peak memory"].endswith("process peak RSS (no GPU in use)") and 0.1 < memory_gib < 8
    assert "(training " in got["wall time"]
    assert got["adapter"] == str(out / "adapter_model.safetensors")
    assert got["loss plot"] == str(out / "training_loss.png") and (out / "training_loss.png").is_file()
    assert got["launch record"] == str(out / "rocm_launch.json")  # written by the hook inside run_exp
    # quiet by default: no INFO lines, no model config, the data example in one line; losses still shown
    assert "[INFO|" not in log and "LlamaConfig" not in log and "input_ids:" not in log, log[:3000]
    assert re.search(r"training example:\n  \d+ tokens, \d+ trained on", log)
    assert "{'loss': " in log and "No metric eval_loss" not in log


@pytest.mark.trainer
def test_summary_estimates_tokens_when_the_trainer_does_not_count_them(tiny_model: Path, tmp_path: Path) -> None:
    # plot_loss: false, or the check adds the plot to every training run (PLOT_LOSS_ADDED)
    got, out, log = summary_of_a_real_run(tmp_path, tiny_model, env={"LLAMAFACTORY_VERBOSITY": "INFO"}, plot_loss=False)
    assert got["tokens/s"].endswith("tokens, estimated from the data's mean row length)")
    assert got["forecast"].endswith("tokens with padding (not counted by the trainer): the check before launch")
    assert got["loss plot"] == "none (plot_loss: true writes one)"
    assert not (out / "training_loss.png").exists()
    # the user's own verbosity wins: LLaMA-Factory's INFO lines and the token ids
    assert "[INFO|" in log and "input_ids:" in log


def test_quiet_by_default_leaves_a_verbosity_the_user_set() -> None:
    unset: dict[str, str] = {}
    assert quiet_by_default(unset) is True and unset == {"LLAMAFACTORY_VERBOSITY": "WARNING"}
    for level in ("INFO", "debug"):
        chosen = {"LLAMAFACTORY_VERBOSITY": level}
        assert quiet_by_default(chosen) is False and chosen == {"LLAMAFACTORY_VERBOSITY": level}
    quieter = {"LLAMAFACTORY_VERBOSITY": "ERROR", "TRANSFORMERS_VERBOSITY": "info"}
    assert quiet_by_default(quieter) is True and quieter["LLAMAFACTORY_VERBOSITY"] == "ERROR"


def test_after_train_checked_the_hook_takes_the_forecast_from_trains_record_of_this_config(tmp_path: Path) -> None:
    """``llamafactory-rocm train`` checks and records, then the hook trusts it (no report): the summary's forecast is
    the one in the record whose resolved config is this one, never another run's; none found is said as such."""
    from llamafactory_rocm.train.hook import Prepared

    config = {"output_dir": str(tmp_path), "learning_rate": 2e-4, "stage": "sft"}
    other = {**config, "learning_rate": 1e-4}
    for name, resolved, steps in (("rocm_launch.json", config, 6), ("rocm_launch.1.json", other, 9)):
        (tmp_path / name).write_text(json.dumps({"resolved_config": resolved, "forecast": {"work": {"steps": steps}}}))
    forecast, record = Prepared(config, snapshot=None).forecast_and_record()
    assert (forecast, record) == ({"work": {"steps": 6}}, tmp_path / "rocm_launch.json")
    forecast, record = Prepared({**config, "learning_rate": 3e-4}, snapshot=None).forecast_and_record()
    assert record is None and forecast == {
        "made": False,
        "why": f"train's launch record of this config is not in {tmp_path}",
    }


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0.0412, "0.041 s"),  # a small run on a large card
        (0.996, "1.00 s"),  # each band chosen on the figure as rounded
        (1.236, "1.24 s"),  # the measure's fastest and slowest timed steps on a small run
        (9.996, "10.0 s"),
        (12.0, "12.0 s"),
        (119.96, "2 min 00 s"),
        (150.0, "2 min 30 s"),
        (179.6, "3 min 00 s"),  # rounded before it is split: the old summary said "2 min 60 s"
        (7199.0, "119 min 59 s"),
        (7199.6, "2.00 h"),
        (9000.0, "2.50 h"),
        (999_999 * 3600.0, "999999.00 h"),
        (1.786e25, "4.96e+21 h"),  # num_train_epochs: 1e30 (issue 53) said in three figures, not 22 digits
        (float("nan"), "not known"),  # a rate file can carry NaN
    ],
)
def test_every_output_says_a_time_one_way(seconds: float, said: str):
    """console.duration: the summary, check's forecast block and `presets list` all say times through it."""
    from llamafactory_rocm.console import duration

    assert duration(seconds) == said


@pytest.mark.parametrize(("alias", "kind"), [("mi300x", "AMD's figure"), ("mi250x", "derived from AMD's figures")])
def test_the_forecast_time_says_what_kind_of_peak_it_rests_on(tmp_path: Path, alias: str, kind: str) -> None:
    """The summary's time names the catalogue card's peak with its kind and date (the launch record keeps the
    card's whole source), as `check --forecast` does."""
    from llamafactory_rocm.forecast.cards import card_for
    from llamafactory_rocm.machine.catalogue import load_catalogue

    product, _ = load_catalogue().gpu(alias)
    made = forecast_json(card_for(product))
    assert made["card"]["peak_source"] == product.peak_source
    got = rows(format_summary(make_summary(tmp_path, global_step=16, forecast=made)))["forecast time"]
    assert f"peak dense bf16 {product.peak_dense_bf16_tflops} TFLOPS ({kind}, {product.peak_date}; " in got
