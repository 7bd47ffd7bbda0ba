"""FLOPs per step (forecast/flops.py) on the tiny model as LLaMA-Factory builds it (load_model + init_adapter,
real CPU weights): equal to FlopCounterMode around a real forward + backward of the same model, and within 5%
of the count written here from the papers' formula (Kaplan et al. 2020 / Narayanan et al. 2021: a matmul of a
(T x i) input by an (i x o) weight is 2*T*i*o FLOPs forward; its backward is 2*T*i*o for the input's gradient,
where the input needs one, and 2*T*i*o for the weight's, where the weight is trained; attention's scores and
weighted values are 2 matmuls of 2*b*s*s*d each forward, twice that backward; recompute repeats a layer's
forward)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafactory_rocm.forecast.flops import cpu_attention_formulas, step_flops
from tests.conftest import tiny_train_config

BATCH, LENGTH = 2, 48


def _built(tiny_model: Path, tmp_path: Path, **overrides: object):
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_model, load_tokenizer

    config = tiny_train_config(tiny_model, tmp_path / "out", **overrides)
    model_args, _data_args, _training_args, finetuning_args, _gen = get_train_args(config)
    tokenizer = load_tokenizer(model_args)["tokenizer"]
    return load_model(tokenizer, model_args, finetuning_args, is_trainable=True)


def _real_step(model, batch: int = BATCH, length: int = LENGTH) -> int:
    """FlopCounterMode around a real step (the model's own gradient checkpointing recomputes in backward);
    the CPU's fused attention kernel counted with torch's formula for the GPU's (flops.py)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    ids = torch.randint(0, 400, (batch, length))
    with FlopCounterMode(display=False, custom_mapping=cpu_attention_formulas()) as counter:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    return counter.get_total_flops()


def _paper(model, *, lora_rank: int | None, checkpointing: bool) -> int:
    """Forward + backward FLOPs of the tiny Llama from its config alone (no FlopCounterMode)."""
    c = model.config
    tokens, d, f, layers, vocab = BATCH * LENGTH, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size
    kv = c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    # per layer: q, o (d x d); k, v (d x kv); gate, up (d x f); down (f x d)
    shapes = {"q": (d, d), "k": (d, kv), "v": (d, kv), "o": (d, d), "gate": (d, f), "up": (d, f), "down": (f, d)}
    layer_matmul = sum(2 * tokens * i * o for i, o in shapes.values())
    attention = 2 * 2 * BATCH * LENGTH * LENGTH * d
    head = 2 * tokens * d * vocab
    forward = layers * (layer_matmul + attention) + head
    recompute = layers * (layer_matmul + attention) if checkpointing else 0
    if lora_rank is None:  # every weight trained, every input needs its gradient
        return forward + 2 * forward + recompute
    recompute += layers * sum(2 * tokens * lora_rank * (i + o) for i, o in shapes.values()) if checkpointing else 0
    adapter = sum(2 * tokens * lora_rank * (i + o) for i, o in shapes.values())  # A (i x r) then B (r x o)
    forward += layers * adapter
    # backward: input gradients of every matmul (LLaMA-Factory makes the embedding's output need a gradient for
    # checkpointing, enable_input_require_grads); the adapters' weight gradients (A and B, as forward)
    input_grads = layers * (layer_matmul + adapter) + head
    backward = input_grads + layers * (2 * attention) + layers * adapter
    return forward + backward + recompute


@pytest.mark.parametrize("finetuning_type", ["lora", "full"])
def test_flops_equal_a_real_cpu_step_and_the_papers_count(finetuning_type, tiny_model, tmp_path):
    model = _built(tiny_model, tmp_path, finetuning_type=finetuning_type)
    counted = step_flops(model, BATCH, LENGTH, None)  # LLaMA-Factory's default: gradient checkpointing on
    assert counted.recompute > 0
    real = _real_step(model)
    paper = _paper(model, lora_rank=16 if finetuning_type == "lora" else None, checkpointing=True)
    print(f"FLOPS {finetuning_type}: {counted} total {counted.total} real {real} paper {paper}")
    assert counted.total == real
    assert abs(counted.total - paper) / paper < 0.05, (counted, paper)


def test_freeze_trains_fewer_weights_than_full_and_checkpointing_adds_the_layers_forward(tiny_model, tmp_path):
    full = step_flops(_built(tiny_model, tmp_path, finetuning_type="full"), BATCH, LENGTH, None)
    frozen = _built(tiny_model, tmp_path, finetuning_type="freeze", freeze_trainable_layers=1)
    freeze = step_flops(frozen, BATCH, LENGTH, None)
    assert freeze.forward == full.forward and freeze.backward < full.backward
    assert freeze.total == _real_step(frozen)
    # recompute: only the trained last layer's output needs a gradient, so only it is recomputed: one decoder
    # layer's forward (q, o: d x d; k, v: d x kv; gate, up, down: d x f; attention's two matmuls)
    c = frozen.config
    d, f, tokens = c.hidden_size, c.intermediate_size, BATCH * LENGTH
    kv = c.num_key_value_heads * (d // c.num_attention_heads)
    layer = 2 * tokens * (2 * d * d + 2 * d * kv + 3 * d * f) + 2 * 2 * BATCH * LENGTH * LENGTH * d
    assert freeze.recompute == layer


def test_alike_layers_cut_to_two_and_three_count_as_every_layer():
    """A 6-layer Llama (full, then LoRA on q/v with the embedding's output needing a gradient, as LLaMA-Factory
    sets it for checkpointing): the decoder cut to 2 and 3 layers counts as running all 6."""
    import peft
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=460, head_dim=16,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    model.gradient_checkpointing_enable()
    model.train()
    assert step_flops(model, 2, 32, None) == step_flops(model, 2, 32, None, every_layer=True)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    lora.enable_input_require_grads()
    assert step_flops(lora, 2, 32, "bfloat16") == step_flops(lora, 2, 32, "bfloat16", every_layer=True)


def test_a_model_on_the_meta_device_counts_as_on_fake_tensors():
    """The dry run's model is on the meta device and counts there (flops.py ``_count`` on meta, the CPU's fused
    attention kernel called where the CPU picks it); the same model on FakeTensors (the activation trace's
    way) gives the same count, full and LoRA, with checkpointing's recompute and grouped-query attention."""
    import peft
    import torch
    import transformers

    from llamafactory_rocm.forecast.flops import _count

    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=460, head_dim=16,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    model.gradient_checkpointing_enable()
    model.train()
    on_meta = _count(model, 2, 32, None, "meta")  # no fall-back: the meta run itself
    assert on_meta.recompute > 0 and on_meta == step_flops(model, 2, 32, None, every_layer=True, fake=True)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    lora.to("meta")
    lora.enable_input_require_grads()
    on_meta = _count(lora, 2, 32, "bfloat16", "meta")
    assert on_meta == step_flops(lora, 2, 32, "bfloat16", every_layer=True, fake=True)
    assert all(p.grad is None for p in lora.parameters())  # the dry model is left as it was built


def test_one_count_at_the_cutoff_gives_each_shorter_batch_its_own_count(tiny_model, tmp_path):
    """The count is made once, at the per-device batch x cutoff_len; a batch of other rows and another padded
    length gets its own real step's count from it (attention's part with the length squared, the rest with the
    tokens), not the cutoff's FLOPs per token. Within 1e-4: the rotary embedding's angles are one bmm a batch, not
    a sequence (2 x head_dim / 2 x length FLOPs, 1e-5 of these steps), which the count takes as per token."""
    model = _built(tiny_model, tmp_path)
    counted = step_flops(model, 4, 128, None)
    assert 0 < counted.attention < counted.total
    for batch, length in ((1, 16), (3, 40), (2, 128), (5, 200)):
        real = _real_step(model, batch, length)
        assert counted.of(batch * length, batch * length * length) == pytest.approx(real, rel=1e-4), (batch, length)


def uneven_pairs(folder: Path) -> Path:
    """A preference dataset (ranking: true) of 24 rows whose prompts, chosen and rejected answers differ in
    length, as DPO and RM read it."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "instruction": "Explain " + " ".join(["ROCm"] * (3 + 7 * i % 40)) + f" case {i}?",
            "chosen": " ".join(["yes"] * (5 + 11 * i % 60)) + ".",
            "rejected": " ".join(["no"] * (2 + 13 * i % 50)) + ".",
        }
        for i in range(24)
    ]
    (folder / "pairs.json").write_text(json.dumps(rows))
    columns = {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected"}
    (folder / "dataset_info.json").write_text(json.dumps({"pairs": {"file_name": "pairs.json", "ranking": True,
                                                                    "columns": columns}}))  # fmt: skip
    return folder


def uneven_kto(folder: Path) -> Path:
    """kto rows (a kto_tag each) whose prompts and answers differ in length: each row's KL sequence (its prompt
    with another row's answer, LLaMA-Factory's feedback processor) differs from its target."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "instruction": "Explain " + " ".join(["ROCm"] * (3 + 7 * i % 40)) + f" case {i}?",
            "output": " ".join(["yes"] * (5 + 11 * i % 60)) + ".",
            "kto_tag": i % 3 != 0,
        }
        for i in range(24)
    ]
    (folder / "kto.json").write_text(json.dumps(rows))
    columns = {"prompt": "instruction", "response": "output", "kto_tag": "kto_tag"}
    (folder / "dataset_info.json").write_text(json.dumps({"kto": {"file_name": "kto.json", "columns": columns}}))
    return folder


# id -> overrides of the tiny config, unshuffled (the batches' rows are known), cutoff 1024, 3 steps of 3 rows
STOCK_FLOPS = {
    "sft-lora": {},
    "sft-full": {"finetuning_type": "full"},
    "dpo-lora": {"stage": "dpo"},  # the reference forward: the policy with its adapter disabled
    "dpo-full": {"stage": "dpo", "finetuning_type": "full"},  # the reference: create_ref_model's copy
    "dpo-simpo": {"stage": "dpo", "pref_loss": "simpo"},  # reference-free
    "rm-lora": {"stage": "rm"},  # trl's value-head model
    # the KL rows by the policy and both batches by the reference, forward only; 4 steps: at 3 the target and
    # KL batches of these rows happen to pad to the same token total
    "kto-lora": {"stage": "kto", "max_steps": 4},
}


def test_the_runs_flops_equal_torchs_count_of_the_stock_run(tiny_model, tmp_path):
    """The oracle is stock ``llamafactory-cli train`` (hook off) inside torch's FlopCounterMode: every FLOP of
    the run, its real batches at their real shapes, checkpointing's recompute, dpo's reference forward. The
    forecast (``check --forecast``: the dry run's meta model counted once at batch x cutoff_len) must give the
    same run FLOPs, and the tokens the trainer counted (num_input_tokens_seen), for sft, dpo (the reference
    forward as the policy without its adapter, as a full copy, or none for simpo) and rm (a value head)."""
    import json

    import yaml

    from llamafactory_rocm.check.run import check_config
    from llamafactory_rocm.forecast.flops import requested
    from tests.stock_runner import hook_off_env, run_alone

    pairs, kto = uneven_pairs(tmp_path / "pairs"), uneven_kto(tmp_path / "kto")
    configs, cases = {}, []
    for name, overrides in STOCK_FLOPS.items():
        config = tiny_train_config(
            tiny_model, tmp_path / name, cutoff_len=1024, disable_shuffling=True, per_device_train_batch_size=3,
            max_steps=3, save_strategy="no", include_num_input_tokens_seen=True,
        )  # fmt: skip
        config.update(overrides)
        if config["stage"] in ("dpo", "rm"):
            config.update(dataset="pairs", dataset_dir=str(pairs), max_samples=24)
        if config["stage"] == "kto":
            config.update(dataset="kto", dataset_dir=str(kto), max_samples=24)
        configs[name] = config
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config))
        cases.append({"id": name, "dir": str(tmp_path), "args": [str(tmp_path / f"{name}.yaml")], "flops": True})
    # dpo's again with the trainer counting the tokens that are not padding (each micro-batch's attention_mask
    # summed: both sequences of each pair): the oracle of the forecast's tokens that are not padding
    name = "dpo-lora-non-padding"
    paired = {**configs["dpo-lora"], "output_dir": str(tmp_path / name), "include_num_input_tokens_seen": "non_padding"}
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(paired))
    cases.append({"id": name, "dir": str(tmp_path), "args": [str(tmp_path / f"{name}.yaml")]})
    results, proc = run_alone(cases, tmp_path, hook_off_env(tmp_path), name="flops", timeout=900)
    forecasts = {}
    for name, config in configs.items():
        assert results.get(name, {}).get("exit") == 0, (name, results.get(name), proc.stderr[-3000:])
        state = json.loads((tmp_path / name / "trainer_state.json").read_text())
        with requested():
            forecast = check_config({**config, "output_dir": str(tmp_path / f"{name}-check")}).forecast
        assert forecast.tokens is not None and forecast.tokens.exact, (name, forecast.notes)
        assert forecast.work.steps == state["global_step"] == config["max_steps"]
        assert forecast.tokens.total == state["num_input_tokens_seen"], name
        stock = results[name]["flops"]
        print(f"STOCK FLOPS {name}: {forecast.run_flops:.6g} forecast, {stock:.6g} stock, {forecast.tokens.total:,}")
        assert forecast.run_flops == pytest.approx(results[name]["flops"], rel=1e-4), name
        forecasts[name] = (forecast.tokens, state["num_input_tokens_seen"])
    assert results["dpo-lora-non-padding"]["exit"] == 0, results["dpo-lora-non-padding"]
    state = json.loads((tmp_path / "dpo-lora-non-padding" / "trainer_state.json").read_text())
    tokens, every = forecasts["dpo-lora"]
    print(f"DPO not padding: {tokens.real:,} forecast, {state['num_input_tokens_seen']:,} stock, of {every:,}")
    assert tokens.real == state["num_input_tokens_seen"]
    assert tokens.padding_share == pytest.approx(1 - state["num_input_tokens_seen"] / every, rel=1e-9)
