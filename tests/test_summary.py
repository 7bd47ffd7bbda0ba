"""The closing summary: ``format_summary`` on its own, and ``SummaryCallback`` on LLaMA-Factory's real trainer."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm.train.summary import PeakMemory, RunSummary, format_summary, format_summary_line
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
        "wall time": "2 min 30 s (training 12.0 s)",
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
    start = lines.index("llamafactory-rocm: training summary")
    return rows("\n".join(lines[start : start + 9])), out, result.stdout + result.stderr


@pytest.mark.trainer
def test_summary_of_a_real_trainer_run_with_counted_tokens_and_a_plot(tiny_model: Path, tmp_path: Path) -> None:
    got, out, log = summary_of_a_real_run(tmp_path, tiny_model, include_num_input_tokens_seen=True, plot_loss=True)
    state = json.loads((out / "trainer_state.json").read_text())
    curve = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert got["loss"] == f"{curve[0]:.3f} -> {curve[-1]:.3f} (first and last of 3 logged)"
    assert got["steps"] == "6" == str(state["global_step"])
    runtime = [e["train_runtime"] for e in state["log_history"] if "train_runtime" in e][-1]  # the run's, not a log's
    tokens_per_s, rest = got["tokens/s"].split(" ", 1)
    assert rest == f"({state['num_input_tokens_seen']:,} tokens, counted)"
    # our clock starts at on_train_begin, the trainer's a little earlier: the same figure within 25%
    assert 0.8 < float(tokens_per_s.replace(",", "")) * runtime / state["num_input_tokens_seen"] < 1.25
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
