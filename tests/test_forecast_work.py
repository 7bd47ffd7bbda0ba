"""The forecast's steps and tokens against stock LLaMA-Factory runs (hook off, LLAMAFACTORY_ROCM=0) on the tiny
model: ``global_step`` and ``num_input_tokens_seen`` (include_num_input_tokens_seen: true, "all") of each run's
trainer_state.json, never our own arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm.forecast.flops import requested
from llamafactory_rocm.forecast.tokens import PAD_MULTIPLE, padded_moments, run_tokens
from llamafactory_rocm.lf.dry_run import dry_launch
from llamafactory_rocm.lf.work import optimizer_steps, work_of
from tests.conftest import tiny_train_config
from tests.stock_runner import hook_off_env, run_alone

pytestmark = pytest.mark.trainer

# id -> overrides of the tiny LoRA SFT config (64 rows, batch 4): each changes what the step count or the
# padding depends on. cutoff_len 1024 keeps the rows' uneven lengths (at 128 nearly every row is cut to 128).
CASES = {
    "epochs": dict(max_steps=-1, num_train_epochs=1.0, per_device_train_batch_size=3),
    "fractional-epochs-accumulation": dict(
        max_steps=-1, num_train_epochs=2.5, per_device_train_batch_size=3, gradient_accumulation_steps=4
    ),
    "max-steps-across-epochs": dict(max_steps=11, per_device_train_batch_size=5, gradient_accumulation_steps=3),
    # the run ends inside its first epoch: its last epoch's micro-batches are the steps', not the epoch's.
    # Unshuffled, so its 8 batches' tokens are exact (shuffled, 24 rows of 64 put one sd of the count at 7%)
    "max-steps-within-an-epoch": dict(
        max_steps=4, per_device_train_batch_size=3, gradient_accumulation_steps=2, disable_shuffling=True
    ),
    "packing": dict(max_steps=-1, num_train_epochs=2.0, packing=True, per_device_train_batch_size=2),
    "max-samples-val-size": dict(
        max_steps=-1,
        num_train_epochs=1.0,
        max_samples=300,
        val_size=0.3,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
    ),
    # more rows than the dry run's rows_cap (256), packed: a packed count of a sample is not the run's
    "packing-every-row": dict(
        max_steps=-1, num_train_epochs=1.0, packing=True, per_device_train_batch_size=2, max_samples=300
    ),
    # unshuffled: the batches' rows are known, so the padded count is exact
    "unshuffled": dict(max_steps=-1, num_train_epochs=1.0, disable_shuffling=True, per_device_train_batch_size=3),
    "drop-last-long-cutoff": dict(
        max_steps=-1,
        num_train_epochs=1.0,
        max_samples=45,
        dataloader_drop_last=True,
        cutoff_len=256,
        per_device_train_batch_size=4,
    ),
}

# two of them again with the trainer counting the tokens that are not padding (transformers'
# include_num_input_tokens_seen "non_padding": each micro-batch's attention_mask summed): one whole epoch each,
# every row once, shuffled or not
NON_PADDING = {
    f"{name}-non-padding": {**CASES[name], "include_num_input_tokens_seen": "non_padding"}
    for name in ("epochs", "unshuffled")
}
# unshuffled, with more rows (300) than the dry run reads (256): the lengths are a sample's, so the batches' rows
# are not all known and the count is an expectation (tested apart: its error is its own spread's, not 2%)
LONGER_THAN_READ = {
    "unshuffled-more-rows-than-read": dict(
        max_steps=-1, num_train_epochs=1.0, disable_shuffling=True, per_device_train_batch_size=8, max_samples=300
    )
}


@pytest.fixture(scope="module")
def stock_runs(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    work = tmp_path_factory.mktemp("forecast-stock")
    cases, configs = [], {}
    for name, overrides in {**CASES, **NON_PADDING, **LONGER_THAN_READ}.items():
        out = work / name
        config = tiny_train_config(tiny_model, out, save_strategy="no", logging_steps=100)
        config.update(cutoff_len=1024, include_num_input_tokens_seen=True)
        config.update(overrides)
        configs[name] = config
        path = work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        cases.append({"id": name, "dir": str(work), "args": [str(path)], "micro_batches": True})
    results, proc = run_alone(cases, work, hook_off_env(work), name="forecast", timeout=900)
    states, passes = {}, {}
    for name, config in configs.items():
        assert results.get(name, {}).get("exit") == 0, (name, results.get(name), proc.stderr[-3000:])
        states[name] = json.loads((Path(config["output_dir"]) / "trainer_state.json").read_text())
        passes[name] = results[name]["micro_batches"]
    return {"configs": configs, "states": states, "micro_batches": passes}


def _forecast(config: dict, output_dir: Path):
    from llamafactory.hparams import get_train_args

    config = {**config, "output_dir": str(output_dir)}  # the stock run's folder holds its results
    with requested():  # as check --forecast and the hook ask: packed rows counted on up to 1024 rows a dataset
        dry = dry_launch(config)
    assert dry.train_rows_scaled is None  # every count here is LLaMA-Factory's own, none scaled
    assert dry.rows and dry.train_lengths, dry.not_checked
    training_args = get_train_args(dict(config))[2]
    work = work_of(training_args, dry.rows["train"], world_size=1)
    shuffled = not config.get("disable_shuffling", False)
    multiple = PAD_MULTIPLE[dry.data_stage]
    tokens = run_tokens(dry.train_lengths, work, multiple, sampled=dry.rows_estimated, shuffled=shuffled)
    return work, tokens


@pytest.mark.parametrize("name", list(CASES))
def test_steps_equal_the_stock_runs_global_step_and_tokens_are_within_2_percent(name, stock_runs, tmp_path):
    work, tokens = _forecast(stock_runs["configs"][name], tmp_path / "out")
    state = stock_runs["states"][name]
    assert work.steps == state["global_step"]
    # the forward + backward passes the stock loop ran (not steps x accumulation where an epoch's last step
    # takes fewer): what --rate-from's overhead a micro-batch and its size note count
    assert work.micro_batches_per_rank == stock_runs["micro_batches"][name]
    seen = state["num_input_tokens_seen"]
    print(
        f"FORECAST {name}: steps {work.steps} vs global_step {state['global_step']}; tokens {tokens.total} vs "
        f"{seen} ({tokens.total / seen - 1:+.2%}, sd {tokens.spread / seen:.2%}), padding {tokens.padding_share:.1%}"
    )
    assert abs(tokens.total - seen) / seen < 0.02, (tokens, seen)
    # the mean a step over every rank: the trainer's tokens over its steps
    assert tokens.per_step == pytest.approx(seen / state["global_step"], rel=0.02)
    if tokens.exact:
        assert tokens.total == seen


@pytest.mark.parametrize("name", ["epochs", "unshuffled"])
def test_tokens_that_are_not_padding_and_padding_share_equal_the_stock_runs_counts(name, stock_runs, tmp_path):
    """The oracle: the same stock run counting every token (include_num_input_tokens_seen "all") and counting
    those that are not padding ("non_padding"); the padding share is the padding over all tokens (18.2% in the
    shuffled run here, 19.4% expected; 17.19% unshuffled, exact)."""
    _work, tokens = _forecast(stock_runs["configs"][name], tmp_path / "out")
    every = stock_runs["states"][name]["num_input_tokens_seen"]
    not_padding = stock_runs["states"][f"{name}-non-padding"]["num_input_tokens_seen"]
    print(f"PADDING {name}: {tokens.padding_share:.2%} forecast, {1 - not_padding / every:.2%} stock")
    assert tokens.real == not_padding
    # shuffled, the padded total is an expectation within 2% of the run's (above): the share within 0.02
    assert tokens.padding_share == pytest.approx(1 - not_padding / every, abs=1e-9 if tokens.exact else 0.02)


def test_an_unshuffled_run_with_more_rows_than_read_is_forecast_within_its_spread(stock_runs, tmp_path):
    """300 rows unshuffled, 256 of them read: the steps and passes are the stock run's; the tokens, from the
    sample's lengths, are an expectation, said to be one, within 3 of its standard deviations of the stock run's
    count (+4.9%, 2.0 sd here, the sample spread over the 300 rows; +4.6%, 1.8 sd from the first 256: the file's
    consecutive rows pad less than random ones would)."""
    name = "unshuffled-more-rows-than-read"
    work, tokens = _forecast(stock_runs["configs"][name], tmp_path / "out")
    state, seen = stock_runs["states"][name], stock_runs["states"][name]["num_input_tokens_seen"]
    assert work.steps == state["global_step"] and work.micro_batches_per_rank == stock_runs["micro_batches"][name]
    print(f"FORECAST {name}: tokens {tokens.total} vs {seen} ({tokens.total / seen - 1:+.2%}, sd {tokens.spread:.0f})")
    assert tokens.sampled and not tokens.exact and not tokens.shuffled
    assert abs(tokens.total - seen) < 3 * tokens.spread, (tokens, seen)


def test_two_ranks_deal_the_batches_as_accelerate_does():
    # 10 rows, batch 3, 2 ranks: 4 batches, 2 per rank; the short last one filled from the start
    work = optimizer_steps(rows=10, per_device_batch=3, accumulation=1, num_train_epochs=1, world_size=2)
    assert (work.batches_per_rank, work.steps) == (2, 2)
    assert work.batches == (((0, 1, 2), (6, 7, 8)), ((3, 4, 5), (9, 0, 1)))


def test_expected_padding_is_the_mean_over_every_batch_of_that_size():
    from itertools import combinations

    lengths = [3, 9, 17, 4, 30, 8]
    every = [max(-(-lengths[i] // 8) * 8 for i in pair) * 2 for pair in combinations(range(6), 2)]
    assert padded_moments(lengths, 2, 8, sample=False)[0] == pytest.approx(sum(every) / len(every))


def test_a_shuffled_runs_tokens_squares_and_spread_are_those_of_every_batch_it_could_draw():
    """Shuffled, each micro-batch is any pair of the rows alike: the run's expected padded tokens, its padded
    lengths squared (what attention's FLOPs grow with: flops.py) and the spread of its total are the mean and
    the variance over every pair, counted here by listing them (pairs of 2 sequences a row, as rm pads them)."""
    from itertools import combinations
    from statistics import fmean, pvariance

    lengths = [3, 9, 17, 4, 30, 8]
    work = optimizer_steps(rows=6, per_device_batch=2, accumulation=1, num_train_epochs=2)  # 2 x 3 batches
    tokens = run_tokens(lengths, work, 8, sampled=False, sequences=2)
    longest = [max(-(-lengths[i] // 8) * 8 for i in pair) for pair in combinations(range(6), 2)]
    numel = [2 * 2 * padded for padded in longest]  # 2 rows of 2 sequences
    assert tokens.total == round(6 * fmean(numel))
    assert tokens.squares == round(6 * fmean(2 * 2 * padded * padded for padded in longest))
    assert tokens.spread == pytest.approx((6 * pvariance(numel)) ** 0.5)  # batches taken as independent


def test_check_forecast_json_gives_the_stock_runs_steps_and_tokens(stock_runs, tmp_path):
    """The forecast where people look: ``check --forecast --json`` on the config of a stock run."""
    import contextlib
    import io

    from llamafactory_rocm.cli.main import main

    def printed(args: list[str]) -> str:  # the CLI in this process: a check starts no child
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(args)
        return out.getvalue()

    name = "fractional-epochs-accumulation"
    config = {**stock_runs["configs"][name], "output_dir": str(tmp_path / "out")}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    forecast = json.loads(printed(["check", str(path), "--gpu", "mi300x", "--forecast", "--json"]))["forecast"]
    state = stock_runs["states"][name]
    assert forecast["work"]["steps"] == state["global_step"]
    assert abs(forecast["tokens"]["total"] / state["num_input_tokens_seen"] - 1) < 0.02
    assert forecast["run_flops"] > 0 and forecast["hours"] and forecast["cost_usd"]
    plain = printed(["check", str(path), "--gpu", "mi300x"])
    assert "forecast" not in plain  # off unless asked: the docs' transcripts stay as they are


@pytest.mark.torchrun
def test_two_torchrun_ranks_steps_equal_the_stock_runs_global_step(tiny_model, tmp_path):
    """Stock ``llamafactory-cli train`` on 2 torchrun ranks (gloo on CPU, hook off): accelerate deals the
    batches to the ranks, the last one filled from the start."""
    import subprocess
    import sys

    name = "two-ranks"
    config = tiny_train_config(tiny_model, tmp_path / name, save_strategy="no", logging_steps=100)
    config.update(
        max_steps=-1, num_train_epochs=2.0, max_samples=37, per_device_train_batch_size=3,
        gradient_accumulation_steps=2, cutoff_len=1024, include_num_input_tokens_seen=True,
    )  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = hook_off_env(tmp_path, FORCE_TORCHRUN="1", NPROC_PER_NODE="2", MASTER_PORT="29531")
    cli = str(Path(sys.executable).parent / "llamafactory-cli")
    done = subprocess.run([cli, "train", str(path)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    state = json.loads((tmp_path / name / "trainer_state.json").read_text())
    from llamafactory.hparams import get_train_args

    fresh = {**config, "output_dir": str(tmp_path / "dry-out")}  # the stock run's folder holds its results
    dry = dry_launch(fresh)
    work = work_of(get_train_args(fresh)[2], dry.rows["train"], world_size=2)
    tokens = run_tokens(dry.train_lengths, work, PAD_MULTIPLE["sft"], sampled=False)
    seen = state["num_input_tokens_seen"]
    print(f"FORECAST {name}: steps {work.steps} vs {state['global_step']}; tokens {tokens.total} vs {seen}")
    assert work.steps == state["global_step"]
    assert abs(tokens.total - seen) / seen < 0.02, (tokens, seen)
    # the check's forecast of the same config on its 2 ranks (forecast/run.py, as check --forecast makes it)
    from llamafactory_rocm.forecast.run import TrainRows, forecast_of

    checked = forecast_of(fresh, TrainRows.of(dry), 2, None, dry.forecast)
    assert checked.work.steps == state["global_step"]
    assert abs(checked.tokens.total - seen) / seen < 0.02, (checked.tokens, seen)


def test_packed_rows_of_a_sample_are_said_to_be_an_estimate(stock_runs, tmp_path):
    """Without the forecast's larger read (a plain check: 256 rows of each dataset), the 300 rows' packed count
    is scaled from the first 256's: the steps are said to be "about", in the check's block and its JSON, and
    the scale is said; with it (above) they equal the stock run's global_step."""
    from llamafactory_rocm.forecast.render import block_lines
    from llamafactory_rocm.forecast.run import TrainRows, forecast_of

    config = {**stock_runs["configs"]["packing-every-row"], "output_dir": str(tmp_path / "out")}
    dry = dry_launch(config)
    made, read, full = dry.train_rows_scaled
    assert (read, full) == (256, 300) and made < read
    forecast = forecast_of(config, TrainRows.of(dry), 1, None, dry.forecast)
    lines = block_lines(forecast.as_json())
    # the answer, "how", then the steps said to be "about" and the scale
    assert lines[2].startswith("  steps: about ") and lines[3].startswith("  rows estimated: "), lines
    said = forecast.as_json()["work"]
    assert said["exact"] is False and said["rows_scaled_from"] == {"made": made, "of_rows_read": 256,
                                                                   "full_split_rows": 300}  # fmt: skip
    stock = stock_runs["states"]["packing-every-row"]["global_step"]
    print(f"SCALED packing: {forecast.work.steps} steps against the stock run's {stock}")


# streamed (LLaMA-Factory's streaming: an IterableDataset), so the trainer runs max_steps: a local file is
# streamed in dataloader_num_workers shards (tests/test_refusal_fixes.py: 0 reads no rows). One worker reads the
# shuffled stream in order; two take turns with their own shards' batches.
STREAMED = {
    "streamed-one-worker": dict(
        streaming=True, dataloader_num_workers=1, max_steps=7, per_device_train_batch_size=3,
        gradient_accumulation_steps=2, max_samples=None,
    ),
    "streamed-two-workers": dict(
        streaming=True, dataloader_num_workers=2, max_steps=5, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, max_samples=None,
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def streamed_runs(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    work = tmp_path_factory.mktemp("forecast-streamed")
    cases, configs = [], {}
    for name, overrides in STREAMED.items():
        config = tiny_train_config(tiny_model, work / name, save_strategy="no", logging_steps=100)
        config.update(cutoff_len=1024, include_num_input_tokens_seen=True, **overrides)
        config = {k: v for k, v in config.items() if v is not None}  # LLaMA-Factory refuses max_samples streamed
        configs[name] = config
        (work / f"{name}.yaml").write_text(yaml.safe_dump(config))
        cases.append({"id": name, "dir": str(work), "args": [str(work / f"{name}.yaml")], "micro_batches": True})
    results, proc = run_alone(cases, work, hook_off_env(work), name="streamed", timeout=900)
    states = {}
    for name, config in configs.items():
        assert results.get(name, {}).get("exit") == 0, (name, results.get(name), proc.stderr[-3000:])
        states[name] = json.loads((Path(config["output_dir"]) / "trainer_state.json").read_text())
    return {"configs": configs, "states": states, "micro_batches": {n: r["micro_batches"] for n, r in results.items()}}


@pytest.mark.parametrize("name", list(STREAMED))
def test_a_streamed_run_is_forecast_at_max_steps_with_the_streams_tokens(name, streamed_runs, tmp_path):
    """``check --forecast --json`` on a streamed config (the dry run counts no rows: before, no forecast): the
    steps and passes are the stock run's; the tokens, from the stream's rows the dry run read as the run's
    dataloader reads them (one worker in order, two taking turns with their shards' batches), equal the
    trainer's count. Before the dataloader read them, the two workers' tokens were a sample's: +5.6%, 1 sd."""
    import contextlib
    import io

    from llamafactory_rocm.cli.main import main

    config = {**streamed_runs["configs"][name], "output_dir": str(tmp_path / "out")}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["check", str(path), "--gpu", "mi300x", "--forecast", "--json"])
    forecast = json.loads(out.getvalue())["forecast"]
    state = streamed_runs["states"][name]
    seen = state["num_input_tokens_seen"]
    tokens, work = forecast["tokens"], forecast["work"]
    print(f"STREAMED {name}: steps {work['steps']} vs {state['global_step']}; tokens {tokens['total']} vs {seen} "
          f"({tokens['total'] / seen - 1:+.2%}, sd {tokens['spread']}), exact {tokens['exact']}")  # fmt: skip
    assert work["streamed"] and work["steps"] == state["global_step"] == config["max_steps"]
    assert work["batches_per_rank_per_epoch"] == streamed_runs["micro_batches"][name]
    assert tokens["exact"] and not tokens["lengths_sampled"] and tokens["total"] == seen
    assert forecast["run_flops"] > 0 and forecast["hours"]


def _qa_rows(words: int | None = None, times: int = 1) -> list[dict]:
    """The bundled QA rows, each answer cut to its first ``words`` or said ``times`` over."""
    rows = json.loads((Path(__file__).parents[1] / "datasets" / "amd_finetune_qa.json").read_text())
    return [{**row, "output": " ".join([" ".join(row["output"].split()[:words])] * times)} for row in rows]


def _non_padding_stock(
    tiny_model: Path, tmp_path: Path, parts: dict[str, list[dict]], **changes: object
) -> tuple[dict, int, object]:
    """The datasets ``parts`` (name -> rows, mixed in that order) trained on for one unshuffled stock epoch that
    counts the tokens that are not padding (include_num_input_tokens_seen "non_padding": every row's tokens once):
    the config, that count, and the check's dry run of the config."""
    data = tmp_path / "data"
    data.mkdir()
    columns = {"prompt": "instruction", "query": "input", "response": "output"}
    for name, rows in parts.items():
        (data / f"{name}.json").write_text(json.dumps(rows))
    info = {name: {"file_name": f"{name}.json", "columns": columns} for name in parts}
    (data / "dataset_info.json").write_text(json.dumps(info))
    config = tiny_train_config(tiny_model, tmp_path / "stock", save_strategy="no", logging_steps=1000)
    config.update(dataset=",".join(parts), dataset_dir=str(data), cutoff_len=1024, max_steps=-1, num_train_epochs=1.0)
    config.update(per_device_train_batch_size=8, disable_shuffling=True, include_num_input_tokens_seen="non_padding")
    config.pop("max_samples", None)  # every row
    config.update(changes)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    case = {"id": "non-padding", "dir": str(tmp_path), "args": [str(tmp_path / "run.yaml")]}
    results, proc = run_alone([case], tmp_path, hook_off_env(tmp_path), name="non-padding", timeout=600)
    assert results.get("non-padding", {}).get("exit") == 0, proc.stderr[-3000:]
    not_padding = json.loads((tmp_path / "stock" / "trainer_state.json").read_text())["num_input_tokens_seen"]
    with requested():
        dry = dry_launch({**config, "output_dir": str(tmp_path / "forecast")})
    return config, not_padding, dry


def _mean_error(lengths: tuple[int, ...], read: int, rows: int) -> float:
    """The relative standard error of the mean length of ``read`` of ``rows`` rows, drawn without replacement."""
    import statistics

    return statistics.stdev(lengths) / read**0.5 * ((rows - read) / (rows - 1)) ** 0.5 / statistics.mean(lengths)


def test_a_file_whose_later_rows_are_longer_is_sampled_across_all_its_rows(tiny_model, tmp_path):
    """Issue 50: the dry run reads 256 rows of a dataset; where those were its first, a file whose later rows are
    longer was forecast short. 600 rows, the first 300 with a short answer, the rest with the answer three times:
    the tokens that are not padding within 3 standard errors of a 256-row sample's mean (3.6% each here) of the
    stock run's count of them: -2.2% here. From the first 256 rows they were 71% short (``_strided_rows`` left
    out)."""
    from llamafactory_rocm.forecast.run import TrainRows
    from llamafactory_rocm.lf.dry_data import strided

    config, not_padding, dry = _non_padding_stock(tiny_model, tmp_path, {"rows": _qa_rows(6) + _qa_rows(times=3)})
    lengths = TrainRows.of(dry).lengths
    work, tokens = _forecast(config, tmp_path / "forecast")
    assert work.rows == 600 and tokens.sampled and tokens.sample_rows == len(lengths) == 256
    assert strided(256, 600)[:3] == [0, 2, 4] and strided(256, 600)[-1] == 597
    error, off = _mean_error(lengths, 256, 600), tokens.real / not_padding - 1
    print(f"LATER LONGER: not padding {tokens.real} forecast, {not_padding} stock ({off:+.2%}, se {error:.2%})")
    assert abs(off) < 3 * error, (tokens.real, not_padding, error)


def test_datasets_read_in_other_shares_than_the_run_mixes_them_are_weighed(tiny_model, tmp_path):
    """Issue 50: 256 rows of each dataset are read, so a 600-row dataset and a 200-row one stood 256 to 200 in the
    token sample where the run mixes them 600 to 200 (concat), and val_size 0.2 draws the train rows of both at
    random. Long rows in the first, short in the second: the tokens that are not padding within 3 standard errors
    of the stock run's count: -1.4% here (se 1.7%); each row read counted once (``_row_weights`` returning None),
    21% short (without the split). With the split's draw unknown (``_positions`` None) no weights: fails."""
    from llamafactory_rocm.forecast.run import TrainRows, forecast_of

    parts = {"long": _qa_rows(times=3) * 2, "short": _qa_rows(6)[:200]}
    config, not_padding, dry = _non_padding_stock(tiny_model, tmp_path, parts, val_size=0.2)
    weights, read = dry.train_row_weights, len(dry.train_lengths or ())
    assert weights is not None and len(weights) == read and 300 < read < 456  # 456 read, a fifth split off
    short_weight, long_weight = sorted(set(weights))  # 600 / 256 against 200 / 200
    assert long_weight / short_weight == pytest.approx(600 / 256, rel=1 / 32)
    forecast = forecast_of(config, TrainRows.of(dry), 1, None, dry.forecast)  # as check --forecast makes it
    tokens = forecast.tokens
    assert forecast.work.rows == 640 and tokens.sampled and tokens.sample_rows == read
    assert any("weighed by the rows the run trains on" in note for note in forecast.notes)
    error, off = _mean_error(TrainRows.of(dry).lengths, read, 640), tokens.real / not_padding - 1
    print(f"SHARES: not padding {tokens.real} forecast, {not_padding} stock ({off:+.2%}, se {error:.2%})")
    assert abs(off) < 3 * error, (tokens.real, not_padding, error)
