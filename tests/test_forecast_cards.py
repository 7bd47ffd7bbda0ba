"""``check --cards`` (forecast/cards.py): one config on every catalogue card. Whether a card fits is the memory
rule's own verdict (MEMORY_OVER_DEVICE when the check is planned for that card), not our arithmetic restated;
the order is cheapest first; a card without a peak figure says it has no time."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafactory_rocm.check.render import report_text
from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.findings import Level
from llamafactory_rocm.forecast.cards import add_cards
from llamafactory_rocm.forecast.flops import requested
from llamafactory_rocm.forecast.run import Forecast
from llamafactory_rocm.machine.catalogue import load_catalogue
from tests.conftest import tiny_train_config
from tests.test_planning import llama3_8b_folder


@pytest.fixture(scope="module")
def eight_b_config(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = llama3_8b_folder(tiny_model, tmp_path_factory.mktemp("cards") / "llama3-8b")
    out = tmp_path_factory.mktemp("cards-out")
    return tiny_train_config(tiny_model, out, model_name_or_path=str(folder), cutoff_len=256, bf16=True)


def _errors(report) -> set[str]:
    return {f.code for f in report.findings if f.level is Level.ERROR}


def test_fits_is_the_memory_rules_verdict_and_cheapest_comes_first(eight_b_config: dict):
    with requested():
        report = check_config(eight_b_config, gpu="rx7900xtx")
    assert report.ok, _errors(report)  # the rule: an 8B LoRA at 4 x 256 fits a 24 GiB card
    forecast = report.forecast
    assert isinstance(forecast, Forecast)
    add_cards(forecast, report.config, None)
    rows = {row["card"]: row for row in forecast.cards}
    assert forecast.peak_gib == pytest.approx(report.estimate["peak_gib"], abs=0.01)  # the rule's estimate
    assert rows["rx7900xtx"]["fits"] is True
    assert rows["rx7600"]["fits"] is False
    refused = check_config(eight_b_config, gpu="rx7600")  # the rule, planned for the 8 GiB card
    assert "MEMORY_OVER_DEVICE" in _errors(refused)

    order = [row["card"] for row in forecast.cards]
    banded = [r for r in forecast.cards if r["fits"] and r["hours"] and r["cost_usd"]]
    assert banded and order[0] == min(banded, key=lambda r: r["cost_usd"][1])["card"]
    assert order.index("mi300x") < order.index("mi250") < order.index("w6800")  # band, lower bound, none
    assert all(not rows[c]["fits"] for c in order[order.index("rx7600") :])  # what does not fit comes last
    text = report_text(report)
    assert "no time: no peak dense bf16 figure for w6800" in text  # RDNA 2: AMD publishes no bf16 rate
    assert "none published by AMD" in rows["w6800"]["why_no_time"]
    assert "at least" in text  # mi250: a lower bound, said to be one

    # one price for every card (--price): among the cards that fit with a lower bound (100% of peak), the run's
    # FLOPs cost least on the card of the highest peak (the catalogue's figures), so that card comes first
    add_cards(forecast, report.config, 2.0)
    peaks = {p.alias: p.peak_dense_bf16_tflops for arch in load_catalogue().archs.values() for p in arch.products}
    bounds = [r["card"] for r in forecast.cards if r["fits"] and not r["hours"] and r["hours_at_peak"]]
    assert len({peaks[card] for card in bounds}) >= 2, bounds
    assert [peaks[card] for card in bounds] == sorted((peaks[card] for card in bounds), reverse=True), bounds


RADEON_PRESET_CARDS = ["rx7900xtx", "w7900", "r9700", "rx9070xt", "rx7800xt", "strixhalo"]


def test_every_radeon_preset_card_gets_a_time_at_its_derived_peak(eight_b_config: dict):
    """The six cards of the Radeon presets each get a time in --cards: at 100% of the catalogue's peak, a lower
    bound (no published fraction for Radeon), which is the run's FLOPs / (GPUs x CUs x FLOPS/clock/CU x clock) of
    docs/rocm-facts.md#a3's row for that card."""
    from tests.test_catalogue_snapshot import _a3_rows, _first_number

    with requested():
        report = check_config(eight_b_config, gpu="rx7900xtx")
    add_cards(report.forecast, report.config, None)
    rows = {row["card"]: row for row in report.forecast.cards}
    a3 = _a3_rows()
    text = report_text(report)
    for alias in RADEON_PRESET_CARDS:
        cus, per_cu, clock, _, status = a3[alias]
        assert status == "derived", alias
        peak = _first_number(cus) * _first_number(per_cu) * _first_number(clock) * 1e9
        hours = report.forecast.run_flops / (report.forecast.gpus * peak) / 3600
        assert rows[alias]["hours_at_peak"] == pytest.approx(hours, rel=1e-3), alias
        assert not rows[alias]["hours"], alias  # a lower bound, not a band
        assert f"no time: no peak dense bf16 figure for {alias}" not in text, alias


@pytest.mark.parametrize("finetuning_type", ["full", "freeze"])
def test_the_cards_are_judged_by_the_checks_own_memory_estimate(eight_b_config: dict, finetuning_type: str):
    """Full and freeze: the model the dry run built counts otherwise than the checkpoint's config.json formula
    (Llama-3-8B full at 4 x 256: 119.91 GiB against 134.87; freeze 21.34 against 22.38), and --cards must judge
    every card by the estimate the memory rule judges the check's own card by."""
    with requested(cards=True):
        report = check_config({**eight_b_config, "finetuning_type": finetuning_type}, gpu="mi300x")
    assert report.forecast.peak_gib == report.estimate["peak_gib"]


def test_checkpointing_off_is_forecast_as_the_check_of_that_config(tiny_model: Path, tmp_path: Path):
    """The faster setting's FLOPs bound those of the check of the changed config (its own dry run counts the
    step without checkpointing: less the recompute, and less the first layer's input gradients, which
    LLaMA-Factory asks for only with checkpointing), its memory is the memory rule's estimate of it; packing is
    named where padding is high, with the command that forecasts it, and not where the config packs already."""
    config = tiny_train_config(tiny_model, tmp_path / "out", cutoff_len=1024, bf16=True)
    with requested():
        report = check_config(config, gpu="mi300x")
        changed = check_config({**config, "disable_gradient_checkpointing": True}, gpu="mi300x")
    add_cards(report.forecast, report.config, None)
    off, packing = report.forecast.faster
    assert off["change"] == {"disable_gradient_checkpointing": True} and off["fits"] is True
    # 1.028 here (FLOP counts are deterministic): the first layer's input gradients of this 2-layer model; the
    # recompute taken out at the cutoff's share instead of at the run's lengths gave 1.046
    assert changed.forecast.run_flops <= off["run_flops"] <= 1.035 * changed.forecast.run_flops
    # the attention kernels' part (measure.py times it apart) is the changed check's: no recompute, and the
    # first layer's input gradients are no attention kernel's
    assert off["run_attention_flops"] == pytest.approx(changed.forecast.run_attention_flops, rel=1e-9)
    assert off["hours"][1] >= changed.forecast.hours[1]
    assert off["peak_gib"] == pytest.approx(changed.estimate["peak_gib"], abs=0.01)
    assert packing["change"] == {"packing": True} and report.forecast.tokens.padding_share >= 0.2
    assert "packing: true" in report_text(report)
    add_cards(changed.forecast, changed.config, None)
    assert changed.forecast.faster == [packing]  # checkpointing is off already


def test_checkpointing_off_keeps_dpos_reference_forward(tiny_model: Path, tmp_path: Path):
    """dpo (LoRA): each step also runs the reference forward without gradients, which recomputes nothing. The
    faster setting's FLOPs bound those of the check of the changed config, whose own dry run counts the policy's
    step without checkpointing and the reference forward; the reference's FLOPs stay in them."""
    from tests.test_forecast_flops import uneven_pairs

    config = tiny_train_config(
        tiny_model, tmp_path / "out", stage="dpo", dataset="pairs", dataset_dir=str(uneven_pairs(tmp_path / "pairs")),
        max_samples=24, cutoff_len=1024, bf16=True,
    )  # fmt: skip
    with requested():
        report = check_config(config, gpu="mi300x")
        changed = check_config({**config, "disable_gradient_checkpointing": True}, gpu="mi300x")
    assert report.forecast.forward_only_flops > 0  # the reference forward is counted
    add_cards(report.forecast, report.config, None)
    off = next(c for c in report.forecast.faster if c["change"] == {"disable_gradient_checkpointing": True})
    print(f"DPO checkpointing off: {off['run_flops']:.6g} bound, {changed.forecast.run_flops:.6g} checked")
    assert changed.forecast.run_flops <= off["run_flops"] <= 1.035 * changed.forecast.run_flops
    assert off["run_attention_flops"] == pytest.approx(changed.forecast.run_attention_flops, rel=1e-9)


def test_a_card_over_the_memory_rules_budget_is_said_not_to_fit(eight_b_config: dict):
    """At cutoff 512 the estimate (19.1 GiB here) is within the 20 GiB rx7900xt's memory but over the memory
    rule's budget of it (MEMORY_OVER_BUDGET when the check is planned for that card): it does not fit; the
    24 GiB rx7900xtx, where the rule finds neither, fits."""
    config = {**eight_b_config, "cutoff_len": 512}
    with requested():
        report = check_config(config, gpu="rx7900xtx")
    codes = {f.code for f in report.findings}
    assert "MEMORY_OVER_BUDGET" not in codes and "MEMORY_OVER_DEVICE" not in codes
    planned = {f.code for f in check_config(config, gpu="rx7900xt").findings}
    assert "MEMORY_OVER_BUDGET" in planned and "MEMORY_OVER_DEVICE" not in planned
    add_cards(report.forecast, report.config, None)
    rows = {row["card"]: row for row in report.forecast.cards}
    assert rows["rx7900xtx"]["fits"] is True and rows["rx7900xt"]["fits"] is False
