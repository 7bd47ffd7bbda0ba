"""``check --measure N``'s mechanics (forecast/measure.py): it runs LLaMA-Factory's trainer for N steps on this
machine in a throwaway folder, times the N-1 after the first and three shapes of one batch, and forecasts the
run as steps x overhead + FLOPs / rate + attention FLOPs / attention rate + the saves, evaluations and epoch
starts the run will make. The oracle of what it counts is a stock run of the same config (hook off): its
global_step, its checkpoints. Whether the forecast is close to a real run's wall time is
bench/bench_forecast_wall.py's question (speed targets live in bench/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm.cli.main import main
from tests.conftest import offline_env, run_cli, tiny_train_config
from tests.stock_runner import hook_off_env, run_alone

pytestmark = pytest.mark.trainer


def test_measure_runs_the_trainer_and_counts_the_stock_runs_steps_saves_and_evaluations(tiny_model: Path, tmp_path):
    output_dir = tmp_path / "my-run"
    output_dir.mkdir()
    (output_dir / "keep.txt").write_text("the user's")
    # 7 steps, a checkpoint every 3: transformers saves at 3, 6 and at the end (7); an evaluation every 2 steps of
    # a quarter of the rows held out: at 2, 4, 6 and at the end (7)
    run = tiny_train_config(
        tiny_model, output_dir, max_steps=7, save_steps=3, logging_steps=5, val_size=0.25, eval_strategy="steps",
        eval_steps=2, per_device_eval_batch_size=4,
    )  # fmt: skip
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
    evaluations = [entry for entry in state["log_history"] if "eval_runtime" in entry]
    assert measured["run_evaluations"] == len(evaluations) == 4
    # an evaluation costs what the run spends on it: at least transformers' own eval_runtime of the measure's
    # evaluation (its loop), which it holds, and not a log line's time (the 0.002 s it was given before)
    stock_runtime = sorted(entry["eval_runtime"] for entry in evaluations)[len(evaluations) // 2]
    assert measured["evaluate_seconds"] >= measured["eval_runtime_seconds"] > 0, measured
    assert measured["evaluate_seconds"] > stock_runtime / 4, (measured["evaluate_seconds"], stock_runtime)
    # the first evaluation (its dataloader, the eval shapes' first passes) apart from the 3 later ones
    assert measured["first_evaluate_seconds"] > 0, measured
    said = [text for text, _ in measured["run_seconds_parts"] if "evaluation" in text]
    assert len(said) == 1 and said[0].startswith("4 evaluation(s): the first ") and ", 3 x " in said[0], said
    # the shapes are one real batch of the run at all its rows, at its first row, and its rows end to end
    shapes = {(kind, rows, length) for kind, rows, length, _ in measured["shapes"]}
    length = next(length for kind, _, length in shapes if kind == "batch")
    assert shapes == {("batch", 4, length), ("row", 1, length), ("end to end", 1, 4 * length)} and length <= 128

    assert measured["steps_run"] == 3 and measured["timed_steps"] == 2 == len(measured["step_seconds"])
    assert 0 < measured["timed_tokens"] <= 2 * 4 * 128 and measured["achieved_flops_per_s"] > 0
    assert "CPU" in measured["device"]
    # the run's time is the sum of its parts, each said (a save's is there: the stock run makes 3)
    parts = measured["run_seconds_parts"]
    assert measured["run_seconds"] == pytest.approx(sum(seconds for _, seconds in parts))
    low, high = measured["run_seconds_band"]
    assert low <= measured["run_seconds"] <= high
    assert any(text.startswith("3 save(s) x ") for text, _ in parts), parts
    if measured["model"] != "seconds a step":
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
    if measured["model"] == "seconds a step":  # no rate to carry: one line, exit 2
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
    attention = forecast["run_attention_flops"]
    assert 0 < attention < forecast["run_flops"]
    assert flops_s == pytest.approx(
        (forecast["run_flops"] - attention) / measured["marginal_flops_per_s"]
        + attention / measured["attention_flops_per_s"]
    )
    code, out, err = _checked(["check", str(tmp_path / "other.yaml"), "--rate-from", str(rate_file)])
    assert f"time there ({measured['device']}, measured {measured['date']} by the check --measure in " in out
    # micro-batches far from the measured ones' size are said to make the time less sure: not the measured
    # config's own (batch 4), a batch of 16 (about 4x the tokens)
    # accumulation 1: each timed step one micro-batch, as the trainer's loop signalled them (on_substep_end)
    assert measured["micro_batch_tokens"] == pytest.approx(measured["timed_tokens"] / measured["timed_steps"])
    assert carried["size_note"] is None
    larger = {**run, "per_device_train_batch_size": 16}
    (tmp_path / "larger.yaml").write_text(yaml.safe_dump(larger))
    code, out, err = _checked(["check", str(tmp_path / "larger.yaml"), "--rate-from", str(rate_file)])
    assert "  less sure: this run's micro-batches hold about " in out, out
    assert "`check --measure` on this config times its own" in out, out


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
    from llamafactory_rocm.forecast.run import TrainRows, forecast_of

    forecast = forecast_of({"per_device_train_batch_size": 2}, TrainRows(10, (5,) * 10), 1, None, {})
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


def _step():
    """The tiny Llama's counted step (4 x 128, its attention apart): the FLOPs each shape has."""
    from llamafactory_rocm.forecast.flops import StepFlops

    return StepFlops(forward=183_240_704, backward=269_221_888, recompute=153_092_096, sequences=4, length=128,
                     attention=150_994_944)  # fmt: skip


def _passes(step, rate: float, attention_rate: float, overhead: float, kinds=("batch", "row", "end to end")):
    """Two passes of each shape whose times are overhead + FLOPs / rate + attention FLOPs / attention rate, one
    of them 1 ms slower (the spread noise makes)."""
    shapes = {"batch": (4, 128), "row": (1, 128), "end to end": (1, 512)}
    passes = []
    for kind in kinds:
        rows, length = shapes[kind]
        flops, attention = step.parts(rows * length, rows * length * length)
        seconds = overhead + flops / rate + attention / attention_rate
        passes += [(kind, rows, length, seconds), (kind, rows, length, seconds + 0.001)]
    return passes


def test_the_three_shapes_give_back_the_rates_that_made_their_times():
    from llamafactory_rocm.forecast.measure import fitted_rates

    step = _step()
    rates = fitted_rates(_passes(step, 3e10, 8e10, 0.008), step)
    assert rates.apart
    assert rates.flops_per_s == pytest.approx(3e10, rel=0.02)
    assert rates.attention_flops_per_s == pytest.approx(8e10, rel=0.02)
    assert rates.pass_seconds == pytest.approx(0.0085, rel=0.02)  # the median of 0.008 and 0.009
    # without the end-to-end row: one rate, the slope from the row to the batch, between the two
    one = fitted_rates(_passes(step, 3e10, 8e10, 0.008, kinds=("batch", "row")), step)
    assert not one.apart and one.flops_per_s == one.attention_flops_per_s and 3e10 < one.flops_per_s < 8e10
    # times within the noise of one shape's own passes give no rate
    assert fitted_rates(_passes(step, 3e14, 8e14, 0.008), step) is None


def test_a_noisy_end_to_end_row_keeps_the_rate_of_the_two_others():
    """The end-to-end row is the longest pass and the noisiest: its spread must not cost the batch's and the
    row's rate (review of dc4f2d1: it fell back to seconds a step)."""
    from llamafactory_rocm.forecast.measure import NOISE_HIDES_ATTENTION, fitted_rates

    step = _step()
    passes = _passes(step, 3e10, 8e10, 0.008)
    kind, rows, length, seconds = passes[-1]
    noisy = [*passes[:-1], (kind, rows, length, seconds + 0.04)]  # one end-to-end pass 40 ms slow
    rates = fitted_rates(noisy, step)
    assert rates is not None and not rates.apart and rates.why == NOISE_HIDES_ATTENTION
    assert rates.flops_per_s == fitted_rates(passes[:4], step).flops_per_s  # the batch's and the row's slope


def test_why_no_rate_is_the_cause_not_the_end_to_end_rows_note():
    """A measure with no FLOPs counted says so, not why the end-to-end row was not timed."""
    from llamafactory_rocm.forecast.measure import StepTimes, measured_forecast
    from llamafactory_rocm.forecast.run import TrainRows, forecast_of

    forecast = forecast_of({"per_device_train_batch_size": 2}, TrainRows(10, (5,) * 10), 1, None, {})
    assert forecast.found_step is None
    note = "a tensor of the batch is not one per token: no end-to-end row timed, one rate"
    shapes = (("batch", 2, 8, 0.02), ("row", 1, 8, 0.01), ("batch", 2, 8, 0.021), ("row", 1, 8, 0.011))
    times = StepTimes(0.0, (0.5, 0.6, 0.7), (20, 40, 60), "CPU", shapes=shapes, shapes_why=note, micro_batches=(1,) * 3)
    measured = measured_forecast(forecast, times, 3)
    assert measured["model"] == "seconds a step"
    assert measured["model_why"].startswith("no FLOPs counted"), measured["model_why"]


def test_the_end_to_end_row_is_left_out_where_it_cannot_run_as_the_run_does():
    """Learned positions end at the model's limit (a CUDA device assert would end the process's fit); neat
    packing's segment ids would merge across rows; a tensor not one per token cannot be put end to end."""
    import types

    import torch
    from transformers import GPT2Config, LlamaConfig

    from llamafactory_rocm.forecast.measure import _no_end_to_end

    ids = torch.ones(4, 32, dtype=torch.long)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    gpt2, llama = (types.SimpleNamespace(config=c) for c in (GPT2Config(n_positions=64), LlamaConfig()))
    assert "64 positions" in _no_end_to_end(gpt2, batch, 4, 32, 128)
    assert _no_end_to_end(gpt2, batch, 4, 32, 64) is None
    assert _no_end_to_end(llama, batch, 4, 32, 128 * 1024) is None  # rotary: no limit to pass
    segments = {**batch, "attention_mask": torch.arange(1, 33).repeat(4, 1) // 9 + 1}
    assert "packed segments" in _no_end_to_end(llama, segments, 4, 32, 128)
    pixels = {**batch, "pixel_values": torch.zeros(4, 3, 8, 8)}
    assert "not one per token" in _no_end_to_end(llama, pixels, 4, 32, 128)


def _timed_by_a_known_machine(forecast, *, per_update: float, per_pass: float, rate: float, warmup: float,
                              epoch_start: float, steps: int = 4, shape_pass: float | None = None,
                              shape_rate: float | None = None):  # fmt: skip
    """The clock of a measure on a machine whose times are known: each optimizer step takes ``per_update`` plus,
    for each of its micro-batches, ``per_pass`` and the micro-batch's FLOPs at ``rate``; the first step also
    ``warmup`` and the first epoch's start (``epoch_start`` from on_epoch_begin to the first batch, beyond a
    step's fetch); the shapes' passes take ``shape_pass`` (default ``per_pass``) and their FLOPs at ``shape_rate``
    (default ``rate``).
    ``forecast``'s rows are all 64 tokens long (no padding), its batches full: each micro-batch holds batch x 64
    tokens."""
    from llamafactory_rocm.forecast.measure import StepTimes

    work, step = forecast.work, forecast.found_step
    tokens = work.per_device_batch * 64 * work.accumulation  # a step's, every micro-batch full
    flops_a_token = step.total / (step.sequences * step.length)  # no attention kernel counted: one rate
    seconds = per_update + work.accumulation * per_pass + tokens * flops_a_token / rate
    fetch, shape_pass = 0.001, per_pass if shape_pass is None else shape_pass
    shape_rate = rate if shape_rate is None else shape_rate
    events, ends, now = [("begin", 0.0), ("epoch_begin", 0.0)], [], epoch_start + fetch
    for i in range(steps):
        events.append(("step_begin", now))
        now += seconds - fetch + (warmup if i == 0 else 0.0)
        events.append(("step_end", now))
        ends.append(now)
        now += fetch
    shapes = []
    for kind, rows in (("batch", work.per_device_batch), ("row", 1)):
        shapes += [(kind, rows, 64, shape_pass + rows * 64 * flops_a_token / shape_rate)] * 2
    return StepTimes(0.0, tuple(ends), tuple(tokens * (i + 1) for i in range(steps)), "a known machine",
                     events=tuple(events), shapes=tuple(shapes), shapes_why="no end-to-end row here",
                     micro_batches=(work.accumulation,) * steps)  # fmt: skip


def test_a_measure_on_a_machine_of_known_times_forecasts_them_back():
    """The oracle is the machine's own times, counted by hand: a measured run of accumulation 2 (per-step and
    per-micro-batch overheads told apart only where the steps have several micro-batches) gives back its own
    run's time (steps, FLOPs, the first step's warm-up and epoch start, the later epoch's start), and
    ``--rate-from`` carries it to a run of accumulation 3 whose epochs end on a short step: 10 rows in batches of
    3 are 4 micro-batches an epoch (3, 3, 3 and 1 rows), 2 steps an epoch (3 micro-batches, then 1), 2 epochs: 4
    steps and 8 micro-batches, not 4 x 3."""
    from llamafactory_rocm.forecast.flops import StepFlops
    from llamafactory_rocm.forecast.measure import carried_forecast, measured_forecast
    from llamafactory_rocm.forecast.run import TrainRows, forecast_of

    step = StepFlops(forward=10**9, backward=2 * 10**9, recompute=0, sequences=4, length=64)
    per_update, per_pass, rate, warmup, epoch_start = 0.05, 0.02, 1e11, 0.7, 0.3
    measured_config = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_train_epochs": 2.0}
    # 32 rows: 8 micro-batches of 4 an epoch, 4 steps of 2 an epoch, 2 epochs: 8 steps, 16 micro-batches
    mine = forecast_of(measured_config, TrainRows(32, (64,) * 32), 1, None, {"step_flops": step})
    assert (mine.work.steps, mine.work.micro_batches_per_rank, mine.work.epochs) == (8, 16, 2)
    times = _timed_by_a_known_machine(mine, per_update=per_update, per_pass=per_pass, rate=rate, warmup=warmup,
                                      epoch_start=epoch_start)  # fmt: skip
    measured = measured_forecast(mine, times, 4)
    flops_a_token = 3 * 10**9 / 256
    own = 8 * per_update + 16 * per_pass + 32 * 64 * 2 * flops_a_token / rate + warmup + 2 * epoch_start
    assert measured["run_seconds"] == pytest.approx(own, rel=1e-6), measured["run_seconds_parts"]
    assert measured["micro_batch_tokens"] == 4 * 64

    other_config = {"per_device_train_batch_size": 3, "gradient_accumulation_steps": 3, "num_train_epochs": 2.0}
    other = forecast_of(other_config, TrainRows(10, (64,) * 10), 1, None, {"step_flops": step})
    carried = carried_forecast(other, measured, "rate.json")
    # saves, evaluations and later epochs' starts are not carried (each is the measured run's own)
    there = 4 * per_update + 8 * per_pass + 2 * 10 * 64 * flops_a_token / rate + warmup + epoch_start
    assert carried["run_seconds"] == pytest.approx(there, rel=1e-6), carried["run_seconds_parts"]

    # the shapes' passes (outside the trainer's loop) slower than a step's overhead a micro-batch, 60 ms against
    # (50 + 2 x 20) / 2: the measure carried to its own config still gives back its own steps' time
    slow = _timed_by_a_known_machine(mine, per_update=per_update, per_pass=per_pass, rate=rate, warmup=warmup,
                                     epoch_start=epoch_start, shape_pass=0.06)  # fmt: skip
    carried = carried_forecast(mine, measured_forecast(mine, slow, 4), "rate.json")
    assert carried["run_seconds"] == pytest.approx(own - epoch_start, rel=1e-6), carried["run_seconds_parts"]


@pytest.mark.parametrize(
    ("batch", "ranks", "less_sure"),
    [(4, 1, False), (1, 1, True), (16, 1, True), (6, 2, False)],
)
def test_micro_batches_far_from_the_measured_ones_size_make_the_time_less_sure(batch, ranks, less_sure):
    """The measured micro-batches hold 4 rows of 64 tokens (256); this run's hold ``batch`` rows of 64 on each
    of its ``ranks``: a quarter or 4 times the size is far, 1.5 times (6 rows, on each of 2 ranks) is not."""
    from llamafactory_rocm.forecast.flops import StepFlops
    from llamafactory_rocm.forecast.measure import carried_forecast, measured_forecast
    from llamafactory_rocm.forecast.run import TrainRows, forecast_of

    step = StepFlops(forward=10**9, backward=2 * 10**9, recompute=0, sequences=4, length=64)
    config = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "num_train_epochs": 1.0}
    mine = forecast_of(config, TrainRows(48, (64,) * 48), 1, None, {"step_flops": step})
    times = _timed_by_a_known_machine(mine, per_update=0.05, per_pass=0.02, rate=1e11, warmup=0.5, epoch_start=0.1)
    measured = measured_forecast(mine, times, 4)
    rows = 48 * ranks  # whole batches on every rank
    other = forecast_of({**config, "per_device_train_batch_size": batch}, TrainRows(rows, (64,) * rows), ranks,
                        None, {"step_flops": step})  # fmt: skip
    assert (carried_forecast(other, measured, "rate.json")["size_note"] is not None) is less_sure


def test_a_fit_that_disagrees_with_the_timed_steps_is_bounded_by_them():
    """The shapes are timed after the trainer's loop: under another load (a shared machine) their rate is not the
    steps'. Here they ran at a tenth of the steps' FLOP rate: the fit alone put the run's steps at 4x what every
    timed step took. The oracle is the machine's own times: the steps' part is steps x the slowest timed step,
    said, and the band holds the run's time."""
    from llamafactory_rocm.forecast.flops import StepFlops
    from llamafactory_rocm.forecast.measure import measured_forecast
    from llamafactory_rocm.forecast.run import TrainRows, forecast_of

    step = StepFlops(forward=10**9, backward=2 * 10**9, recompute=0, sequences=4, length=64)
    config = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_train_epochs": 2.0}
    mine = forecast_of(config, TrainRows(32, (64,) * 32), 1, None, {"step_flops": step})
    per_update, per_pass, rate, warmup, epoch_start = 0.05, 0.02, 1e11, 0.7, 0.3
    times = _timed_by_a_known_machine(mine, per_update=per_update, per_pass=per_pass, rate=rate, warmup=warmup,
                                      epoch_start=epoch_start, shape_rate=rate / 10)  # fmt: skip
    measured = measured_forecast(mine, times, 4)
    a_step = per_update + 2 * per_pass + 2 * 4 * 64 * (3 * 10**9 / 256) / rate
    own = 8 * a_step + warmup + 2 * epoch_start
    print(f"BOUNDED: {measured['run_seconds_parts'][0][0]}")
    assert measured["steps_bound"] == "slowest"
    assert (
        measured["run_seconds_parts"][0][0].startswith("8 steps x ")
        and "the slowest timed step" in (measured["run_seconds_parts"][0][0])
    )
    assert measured["run_seconds"] == pytest.approx(own, rel=1e-6), measured["run_seconds_parts"]
    low, high = measured["run_seconds_band"]
    assert low <= own * (1 + 1e-9) and own <= high * (1 + 1e-9)
    # the same measure with the shapes at the steps' own rate is not bounded: the fit stands
    agreed = measured_forecast(
        mine,
        _timed_by_a_known_machine(
            mine, per_update=per_update, per_pass=per_pass, rate=rate, warmup=warmup, epoch_start=epoch_start
        ),
        4,
    )
    assert "steps_bound" not in agreed and "FLOP/s" in agreed["run_seconds_parts"][1][0]
