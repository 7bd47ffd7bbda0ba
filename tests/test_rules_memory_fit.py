"""Unified memory on an APU: which number the budget is, and the CPU side (docs/rocm-facts.md#n9).

The Strix Halo snapshot holds the figures of ROCm/legacy-rocm-build#6004; not run on the hardware.
"""

from dataclasses import replace

from llamafactory_rocm.findings import Level
from llamafactory_rocm.lf.memory import model_config_for
from llamafactory_rocm.presets import raw
from llamafactory_rocm.rules import memory_fit
from llamafactory_rocm.rules.memory_fit import device_budget
from tests.conftest import load_snapshot, make_ctx

GIB = 2**30


def strixhalo_ctx(**device_update):
    ctx = make_ctx("strixhalo")
    snap = ctx.snapshot.model_copy(deep=True)
    snap.devices = [snap.devices[0].model_copy(update=device_update)]
    return replace(ctx, snapshot=snap)


def test_the_strixhalo_snapshot_records_carve_out_gtt_and_is_integrated():
    (device,) = load_snapshot("strixhalo").devices
    assert device.is_integrated and device.vram_sysfs_bytes == 536870912 and device.gtt_sysfs_bytes == 137438953472
    assert device.free_memory_bytes > device.total_memory_bytes  # as reported: free 120 GiB > total 62.47 GiB


def test_apu_budget_is_torchs_total_when_below_carve_out_plus_gtt_and_says_so():
    gib, used = device_budget(load_snapshot("strixhalo").devices[0])
    assert round(gib, 2) == 62.47
    assert "torch's total_memory 62.5 GiB" in used and "carve-out 0.5 + GTT 128.0 GiB = 128.5 GiB" in used


def test_apu_budget_is_carve_out_plus_gtt_when_the_kernel_caps_below_torch():
    device = load_snapshot("strixhalo").devices[0].model_copy(update={"gtt_sysfs_bytes": 16 * GIB})
    gib, used = device_budget(device)
    assert round(gib, 1) == 16.5 and "less than torch's total_memory" in used


def test_discrete_cards_keep_torchs_figure_without_a_note():
    gib, used = device_budget(load_snapshot("rx7900xtx").devices[0])
    assert used == "" and round(gib) == 24


def test_the_preset_message_names_the_number_it_used():
    config = raw("strixhalo_qwen3_lora")
    ctx = replace(make_ctx("strixhalo"), model_config=model_config_for(config["model_name_or_path"]))
    (finding,) = memory_fit.memory_fit(config, {}, ctx).findings
    assert finding.code == "MEMORY_ESTIMATE" and "unified memory, budget from torch's total_memory" in finding.message


def test_a_small_gtt_is_the_budget_the_rule_refuses_against():
    config = {**raw("strixhalo_qwen3_lora"), "per_device_train_batch_size": 8}
    ctx = strixhalo_ctx(gtt_sysfs_bytes=4 * GIB)
    ctx = replace(ctx, model_config=model_config_for(config["model_name_or_path"]))
    codes = [f.code for f in memory_fit.memory_fit(config, {}, ctx).findings]
    assert codes[0] in {"MEMORY_OVER_DEVICE", "MEMORY_OVER_BUDGET"}


def test_the_cpu_side_is_warned_when_the_gpu_takes_nearly_all_ram():
    config = raw("strixhalo_qwen3_lora")
    ctx = replace(make_ctx("strixhalo"), model_config=model_config_for(config["model_name_or_path"]))
    snap = ctx.snapshot.model_copy(deep=True)
    snap.host.memory_available_bytes = 16 * GIB  # a desktop session and a browser hold the rest
    findings = memory_fit.memory_fit(config, {}, replace(ctx, snapshot=snap)).findings
    low = [f for f in findings if f.code == "APU_HOST_MEMORY_LOW"]
    assert len(low) == 1 and low[0].level is Level.WARNING and "MemAvailable" in low[0].message
    assert [f.code for f in memory_fit.memory_fit(config, {}, ctx).findings] == ["MEMORY_ESTIMATE"]  # 127.5 GiB


def _applied(config: dict, change: str) -> dict:
    """A change as fitting_changes words it ("key: value", maybe "with key: value") applied to the config."""
    import re

    return {**config, **{key: int(value) for key, value in re.findall(r"(\w+): (\d+)", change)}}


def test_each_change_named_when_over_the_device_fits_when_applied():
    config = {**raw("rx7900xtx_llama3_lora"), "per_device_train_batch_size": 8}
    ctx = replace(make_ctx("rx7900xtx"), model_config=model_config_for(config["model_name_or_path"]))
    (over,) = memory_fit.memory_fit(config, {}, ctx).findings
    assert over.code == "MEMORY_OVER_DEVICE" and "Changes that fit, cheapest first: " in over.fix
    plan = memory_fit._plan(config, {}, ctx)
    budget = memory_fit.BUDGET * plan.device_gib
    batch = memory_fit.largest_fitting_batch(
        plan.shape, plan.parameters, config, budget, 1, plan.weight_bytes, plan.built
    )
    changes = memory_fit.fitting_changes(config, ctx, plan, budget, batch)
    edits = [what for what, _ in changes if not what.startswith(("one ", "DeepSpeed"))]
    assert edits and edits[0].startswith("per_device_train_batch_size: ")  # the cheapest: same tokens per step
    for what in edits:
        (finding,) = memory_fit.memory_fit(_applied(config, what), {}, ctx).findings
        assert finding.code == "MEMORY_ESTIMATE", (what, finding.message)
    batch = _applied(config, edits[0])
    assert batch["per_device_train_batch_size"] * batch["gradient_accumulation_steps"] >= 8  # the same batch


def test_a_model_no_change_of_the_run_fits_names_a_gpu_that_does():
    from llamafactory_rocm.lf.memory import ModelMemory

    config = raw("rx7900xtx_llama3_lora")
    ctx = replace(make_ctx("rx7900xtx"), model_config=model_config_for(config["model_name_or_path"]))
    heavy = ModelMemory(parameters=30 * 2**30, trainable_parameters=0, frozen_bytes=60 * GIB, trainable_bytes=0)
    (over,) = memory_fit.memory_fit(config, {}, replace(ctx, built_model=heavy)).findings
    assert over.code == "MEMORY_OVER_DEVICE" and "--gpu " in over.fix
    alias = over.fix.split("--gpu ")[1].split(")")[0]
    bigger = replace(ctx, snapshot=load_snapshot(alias), built_model=heavy)
    assert [f.code for f in memory_fit.memory_fit(config, {}, bigger).findings] == ["MEMORY_ESTIMATE"]


def test_the_numbers_json_carries_are_the_findings_estimate():
    config = raw("strixhalo_qwen3_lora")
    ctx = replace(make_ctx("mi300x"), model_config=model_config_for(config["model_name_or_path"]))
    numbers = memory_fit.estimate_numbers(config, {}, ctx)
    (finding,) = memory_fit.memory_fit(config, {}, ctx).findings
    numbers_keys = {"weights_gib", "trainable_gib", "activations_gib", "logits_gib", "peak_gib", "device_gib"}
    numbers_keys |= {"gradients_gib", "weight_copies_gib"}
    assert set(numbers) == numbers_keys | {"activations_from", "peak_at"}
    assert numbers["activations_from"] == "formula"  # no model was built: nothing traced
    assert f"Estimated peak {numbers['peak_gib']:.1f} GiB of {numbers['device_gib']:.1f} GiB" in finding.message
    optimizer_state = numbers["trainable_gib"] - numbers["gradients_gib"]
    assert f"weights {numbers['weights_gib']:.1f} + optimizer state {optimizer_state:.1f}" in finding.message
    assert f"the step at its {numbers['peak_at']}" in finding.message
    assert memory_fit.estimate_numbers(config, {}, make_ctx("mi300x")) is None  # no model config: no numbers


def test_the_largest_fitting_batch_is_the_largest_whose_estimate_fits_even_from_2_to_the_62(monkeypatch):
    """The batch memory_fit offers is the largest whose estimate fits (each one tried from the config's down is the
    oracle); from ``per_device_train_batch_size: 2**62`` it is found in ~60 estimates (a scan from the top never
    ended: the fuzz's ``1e30`` checked for a planned mi300x ran past 900 s)."""
    from llamafactory_rocm.lf import memory

    config = raw("rx7900xtx_llama3_lora")
    shape, parameters = memory.shape_and_count(model_config_for(config["model_name_or_path"]))

    def total(batch: int) -> float:
        train = memory.TrainingShape.from_config({**config, "per_device_train_batch_size": batch})
        return memory.estimate(shape, parameters, train).total_gib

    for budget in (total(1) - 0.01, total(1), total(5) + 0.01, total(13), 10_000.0):
        oracle = next((b for b in range(16, 0, -1) if total(b) <= budget), None)
        got = memory.largest_fitting_batch(shape, parameters, {**config, "per_device_train_batch_size": 16}, budget)
        assert got == oracle, (budget, got, oracle)
    calls = []
    real = memory.estimate
    monkeypatch.setattr(memory, "estimate", lambda *a, **k: calls.append(1) or real(*a, **k))
    huge = {**config, "per_device_train_batch_size": 2**62}
    assert memory.largest_fitting_batch(shape, parameters, huge, total(3)) == 3 and len(calls) < 100
