"""Time and cost say where each figure comes from, and say so where there is none (forecast/run.py)."""

from __future__ import annotations

import pytest

from llamafactory_rocm.forecast.flops import StepFlops
from llamafactory_rocm.forecast.render import block_lines
from llamafactory_rocm.forecast.run import TrainRows, card_of, forecast_of
from llamafactory_rocm.machine.catalogue import load_catalogue

CONFIG = {"per_device_train_batch_size": 2, "num_train_epochs": 1.0}
LENGTHS = tuple(range(100, 300, 3))
STEP = StepFlops(forward=10**12, backward=2 * 10**12, recompute=0, sequences=2, length=512)


def _forecast(alias: str, price: float | None = None):
    card = card_of(load_catalogue(), alias, [])
    return forecast_of(CONFIG, TrainRows(len(LENGTHS), LENGTHS), 1, card, {"step_flops": STEP}, price=price)


def test_a_card_with_a_published_fraction_gets_a_band_with_its_source_and_date():
    f = _forecast("mi300x")
    assert f.hours[0] < f.hours[1] and f.cost[0] < f.cost[1]
    text = "\n".join(block_lines(f.as_json()))
    assert "AMD's BF16 Llama 3.1 8B training" in text and "2025-01-29" in text  # the fraction's source and date
    assert "cliffcenter.com" in text and "2026-05-18" in text  # the price's
    assert "a lower bound" not in text  # a band, from a published fraction


@pytest.mark.parametrize("alias", ["mi300x", "mi325x"])
def test_the_band_is_the_bf16_training_measurement_it_records(alias):
    """The band is recomputed from the BF16 measurement forecast/rates.json records (AMD's TFLOPS per GPU for Llama
    3.1 8B, docs/rocm-facts.md#a4): high = TFLOPS per GPU / the card's catalogue peak; low = high x the worst
    same-software MI300X/H200 gap ((H200 peak / MI300X peak) / 1.40). The recorded TFLOPS is the docs' table
    cell, and the forecast's time band is the time at peak over those fractions."""
    from llamafactory_rocm.forecast.cards import rates
    from tests.test_catalogue_snapshot import _facts_section

    band = rates()["achieved"][alias]
    measured = band["measured"]
    peak = load_catalogue().gpu(alias)[0].peak_dense_bf16_tflops
    assert measured["peak_tflops"] == peak
    high = measured["tflops_per_gpu"] / peak
    gap = (measured["h200_peak_tflops"] / peak) / max(measured["same_software_h200_over_mi300x"])
    assert band["fraction_high"] == pytest.approx(high, abs=5e-4)
    assert band["fraction_low"] == pytest.approx(high * gap, abs=5e-4)
    assert "BF16" in band["label"] and "FP8" not in band["label"]
    rows = _facts_section("a4").splitlines()
    row = next(line for line in rows if line.startswith("| Llama 3.1 8B") and "| 3 x 8192 |" in line)
    assert f"| {measured['tflops_per_gpu']} |" in row
    f = _forecast(alias)
    assert f.hours == pytest.approx((f.hours_at_peak / band["fraction_high"], f.hours_at_peak / band["fraction_low"]))


def test_a_card_with_a_peak_but_no_fraction_gets_a_lower_bound_said_as_one():
    f = _forecast("mi250", price=1.0)
    assert f.hours is None and f.hours_at_peak
    text = "\n".join(block_lines(f.as_json()))
    assert "at least" in text and "100% of peak" in text


def test_a_card_without_a_peak_gets_no_time():
    """MI50 (gfx906, no matrix cores): AMD publishes no bf16 rate, and the note says so."""
    f = _forecast("mi50", price=1.0)
    assert f.hours is None and f.hours_at_peak is None and f.cost is None
    assert any("no peak dense bf16 figure for mi50 (none published by AMD" in note for note in f.notes), f.notes


def test_a_radeon_card_gets_a_lower_bound_at_its_derived_peak():
    """RX 7900 XTX: 96 CUs x 512 x 2.5 GHz = 122.88 TFLOPS (docs/rocm-facts.md#a3), no published fraction."""
    f = _forecast("rx7900xtx", price=1.0)
    assert f.hours is None and f.hours_at_peak == pytest.approx(f.run_flops / (96 * 512 * 2.5e9) / 3600)
    assert "at least" in "\n".join(block_lines(f.as_json()))


@pytest.mark.parametrize("price", ["0", "-2", "inf"])
def test_a_price_that_is_not_one_is_one_line(price, tmp_path):
    from tests.conftest import offline_env, run_cli

    done = run_cli(["check", "x.yaml", "--price", price], tmp_path, offline_env(tmp_path))
    assert done.returncode == 2 and "--price" in done.stderr and "Traceback" not in done.stderr


def test_a_forecast_that_cannot_be_made_says_why(tmp_path):
    """A model that is not in this (empty) Hugging Face cache, offline, with no bundled shape to stand in for it
    (llamafactory_rocm/models/): no data pipeline runs, so no rows, and the line says why."""
    import yaml

    from llamafactory_rocm.resources import presets_dir
    from tests.conftest import offline_env, run_cli

    config = yaml.safe_load((presets_dir() / "mi300x_llama3_lora.yaml").read_text())
    config["model_name_or_path"] = "acme/a-model-with-no-bundled-shape"
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    done = run_cli(["check", "run.yaml", "--gpu", "mi300x", "--forecast"], tmp_path, offline_env(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "forecast: not made: the dry run counted no train rows" in done.stdout
    assert "acme/a-model-with-no-bundled-shape is not local and not in the Hugging Face cache; HF_HUB_OFFLINE" in (
        done.stdout
    )


def test_a_forecast_that_fails_is_said_and_never_stops_the_check(monkeypatch):
    """The hook asks for a forecast at every launch (train/hook.py): a bug in it is a line, not a refused run."""
    from types import SimpleNamespace

    from llamafactory_rocm.forecast import run
    from llamafactory_rocm.forecast.flops import requested
    from llamafactory_rocm.lf.dry_parts import DryRun

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(run, "forecast_of", broken)
    dry = DryRun(rows={"train": len(LENGTHS)}, train_lengths=LENGTHS, data_stage="sft", forecast={"step_flops": STEP})
    ctx = SimpleNamespace(catalogue=load_catalogue(), snapshot=SimpleNamespace(devices=[]))
    with requested():
        made = run.forecast_for(dry, SimpleNamespace(config=CONFIG), ctx, "mi300x", 1)
    said = "the forecast failed here, a bug to report: ZeroDivisionError: a bug"
    assert made.as_json() == {"made": False, "why": said}


def test_a_run_of_one_peak_hours_flops_takes_one_gpu_hour_on_any_number_of_gpus():
    """The units and the GPU count, by a hand count: 8 rows of 512 tokens (no padding: 512 is a multiple of 8)
    at (forward + backward) / (2 x 512) FLOPs a token make 4 x (forward + backward) FLOPs, here the mi250's
    peak (archs.json, read here) x 3600 s: one hour at 100% of peak on one GPU, half an hour on two (2 ranks of
    2 batches each: the same batches), and one GPU-hour, so one GPU-hour's price, either way."""
    import json
    from pathlib import Path

    import llamafactory_rocm

    archs = json.loads((Path(llamafactory_rocm.__file__).parent / "catalogue" / "archs.json").read_text("utf-8"))
    peak = next(p["peak_dense_bf16_tflops"] for a in archs["archs"].values() for p in a["products"]
                if p["alias"] == "mi250")  # fmt: skip
    one_hour = round(peak * 1e12 * 3600)
    step = StepFlops(forward=one_hour // 12, backward=one_hour // 6, recompute=0, sequences=2, length=512)
    assert 4 * step.total == one_hour
    card = card_of(load_catalogue(), "mi250", [])
    said = {}
    for gpus in (1, 2):
        f = forecast_of(CONFIG, TrainRows(8, (512,) * 8), gpus, card, {"step_flops": step}, price=3.0)
        assert f.run_flops == pytest.approx(one_hour, rel=1e-12) and f.tokens.padding_share == 0
        said[gpus] = (f.hours_at_peak, f.cost, "\n".join(block_lines(f.as_json())))
    assert said[1][0] == pytest.approx(1.0) and said[2][0] == pytest.approx(0.5)
    assert said[1][1] == pytest.approx((3.0, 3.0)) and said[2][1] == pytest.approx((3.0, 3.0))
    assert "time: at least 60 min 00 s" in said[1][2] and "time: at least 30 min 00 s" in said[2][2]
    assert "cost: $3.00 to $3.00 at $3 per GPU-hour" in said[2][2]
    assert "the cost is at 100% of peak: a lower bound" in said[2][2]  # the mi250 has no published fraction


@pytest.mark.parametrize(("snapshot", "alias"), [("mi300x_8gpu", "mi300x"), ("mi250x", "mi250x"), ("cuda_h200", None)])
def test_without_gpu_the_card_is_the_one_the_recorded_machine_reports(snapshot, alias):
    """No --gpu: the card is the catalogue product whose name the probed device reports (recorded snapshots of
    an 8-GPU MI300X node, an MI250X, and an NVIDIA H200 that no catalogue product is)."""
    from tests.conftest import load_snapshot

    names = [device.name for device in load_snapshot(snapshot).devices]
    card = card_of(load_catalogue(), None, names)
    assert (card.alias if card else None) == alias


@pytest.mark.parametrize("alias", ["mi300x", "mi250", "mi50"])
def test_the_answer_comes_first_with_the_time_and_cost_the_lines_below_give(alias):
    """forecast/render.py: the block's first line is the answer; its time and cost are those of the time: and
    cost: lines (a band, a lower bound, or why there is none)."""
    f = _forecast(alias, price=None if alias == "mi300x" else 2.0)
    first, *rest = block_lines(f.as_json())
    assert first.startswith("forecast: ") and f"on 1 x {alias}" in first, first
    time_line = next((line for line in rest if line.startswith("  time: ")), None)
    if f.hours:
        assert time_line.removeprefix("  time: ").split(" at ")[0] in first
    elif f.hours_at_peak:
        assert time_line.removeprefix("  time: ").split(" (")[0] in first and "a lower bound" in first
    else:
        assert time_line is None and "no time: no peak dense bf16 figure for mi50" in first, first
    if f.cost is not None:
        cost_line = next(line for line in rest if line.startswith("  cost: "))
        said = cost_line.removeprefix("  cost: ").split(" at ")[0]
        assert (said if f.hours else f"at least {said.split(' to ')[0]}") in first, (said, first)
    assert f"{f.work.steps:,} steps" in first
