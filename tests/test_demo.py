"""``llamafactory-rocm demo``: it learns (loss well under a uniform guess), plots, answers, checks its arguments."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llamafactory_rocm.demo import DEFAULT_STEPS, demo_question, logging_steps_for
from tests.conftest import offline_env, run_cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One work folder for the module: the second demo reuses the tiny model the first one built."""
    return tmp_path_factory.mktemp("demo")


def losses(output_dir: Path) -> list[float]:
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return [e["loss"] for e in history if "loss" in e]


def common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def answer(stdout: str, label: str) -> str:
    line = next(x for x in stdout.splitlines() if x.strip().startswith(label))
    return line.split(label, 1)[1].strip()


@pytest.mark.trainer
def test_the_demo_learns_well_below_a_uniform_guess_plots_and_answers(demo_dir: Path) -> None:
    result = run_cli(["demo", "--dir", str(demo_dir)], demo_dir, offline_env(demo_dir))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = demo_dir / "run"
    vocab = json.loads((demo_dir / "tiny-llama" / "config.json").read_text())["vocab_size"]
    curve = losses(run)
    assert len(curve) == DEFAULT_STEPS // logging_steps_for(DEFAULT_STEPS)
    assert curve[-1] <= 0.75 * math.log(vocab), (curve, vocab)  # issue 17: well below ln(vocab)
    assert curve[0] > 0.9 * math.log(vocab)  # it starts where an untrained model is
    plot = run / "training_loss.png"
    assert plot.read_bytes()[:8] == PNG_MAGIC
    out = result.stdout
    assert f"demo: loss plot: {plot}" in out
    assert f"demo: loss {curve[0]:.3f} -> {curve[-1]:.3f}, {DEFAULT_STEPS} steps" in out
    assert f"x ln({vocab})" in out and "tokens/s" in out and "peak" in out
    # The trained question: the adapter's answer starts as the bundled answer does, the base model's does not.
    question, reference = demo_question()
    assert question in out
    before, after = answer(out, "before training:"), answer(out, "after training:")
    assert common_prefix(after, reference) >= 20, after
    assert common_prefix(before, reference) < 5, before


@pytest.mark.trainer
def test_a_short_demo_succeeds_and_reports_the_losses_it_has(demo_dir: Path) -> None:
    result = run_cli(["demo", "--dir", str(demo_dir), "--max-steps", "5"], demo_dir, offline_env(demo_dir))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = sorted(demo_dir.glob("run*"), key=lambda p: p.stat().st_mtime_ns)
    curve = losses(runs[-1])
    assert len(curve) == 5  # logging_steps follows max_steps: a short run logs every step
    assert f"demo: loss {curve[0]:.3f} -> {curve[-1]:.3f}, 5 steps" in result.stdout
    assert (runs[-1] / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("value", ["0", "-3", "abc", "2.5"])
def test_max_steps_must_be_a_positive_whole_number(value: str, tmp_path: Path) -> None:
    result = run_cli(["demo", "--dir", str(tmp_path / "d"), "--max-steps", value], tmp_path, offline_env(tmp_path))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--max-steps" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "d").exists()  # refused before anything is built


def test_demo_help_says_where_the_tiny_model_goes_and_gives_an_example(tmp_path: Path) -> None:
    result = run_cli(["demo", "--help"], tmp_path, offline_env(tmp_path))
    assert result.returncode == 0
    assert "DIR/tiny-llama/" in result.stdout and "llamafactory-rocm demo --dir" in result.stdout


@pytest.mark.parametrize(("steps", "expected"), [(1, 1), (5, 1), (60, 3), (200, 10), (10_000, 10)])
def test_logging_steps_follow_max_steps(steps: int, expected: int) -> None:
    assert logging_steps_for(steps) == expected
