"""The memory estimate against a measured LoRA training step, per model family, on CPU.

The oracle is a measurement, not the estimator: each family's real ``config.json`` (the shipped shapes in
llamafactory_rocm/models/ and Llama-3-8B's) is reduced to 2 layers and small widths (``reduced_config``),
written as a model folder with random bf16 weights and the tiny tokenizer, and loaded by LLaMA-Factory's
own ``get_train_args`` / ``load_tokenizer`` / ``load_model`` (its patches, gradient checkpointing,
``init_adapter`` with ``lora_target: all``, the fp32 upcast of the adapter). Two training steps run as
transformers' Trainer runs them: accelerate's bf16 mixed precision (``Accelerator.prepare`` wraps the forward
in autocast and the outputs in fp32), the loss transformers computes from ``labels``, ``backward``, gradient
clipping, AdamW's ``step``, ``zero_grad``. The second step runs under ``torch.profiler.profile(
profile_memory=True)``: its allocation and free events, in order, are summed to the peak of what the step
holds above what was live when it began (``step_peak``). What was live (the parameters, buffers and AdamW's
state) is summed from the tensors themselves.

The estimate is the package's own for the same model folder and config (``rules/memory_fit.py``
``plan_estimate``, the path ``check --json`` takes, with the model counted by ``memory.count_model`` as the
dry run counts it). Compared: the step's working set, measured peak above the live state against
activations + logits + gradients (the terms that are not parameters or optimizer state), within 10%; and
the whole peak, live state + step peak, against weights + trainable state + activations + logits (the fixed
0.25 GiB workspace of a GPU's BLAS and allocator slack is left out: on CPU there is none to measure).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from itertools import accumulate
from pathlib import Path
from typing import Any

import pytest

import llamafactory_rocm.models as models_package

FAMILIES = (
    "llama3_8b",
    "qwen3_defaults",
    "qwen3_moe_defaults",
    "qwen3_30b_a3b",
    "mixtral_defaults",
    "llama4_defaults",
    "qwen2_5_vl_defaults",
    "gemma3_defaults",
    "deepseek_v3_defaults",
)
TOLERANCE = 0.10
BATCH, CUTOFF = 2, 512

# The reduced widths: every family's keys that size it, set small; everything else (activations, norms,
# attention flavour, MoE routing, tied embeddings, vision tower) stays the family's own.
_TEXT = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "intermediate_size_mlp": 512,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "head_dim": 32,
    "vocab_size": 1024,
    "num_local_experts": 8,
    "num_experts": 8,
    "n_routed_experts": 8,
    "n_group": 2,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 32,
    "q_lora_rank": 48,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 16,
    "qk_head_dim": 32,
    "v_head_dim": 32,
}
_VISION = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "depth": 2,
    "num_attention_heads": 4,
    "num_heads": 4,
    "out_hidden_size": 128,
    "vision_output_dim": 128,
    "projector_input_dim": 128,
    "projector_output_dim": 128,
}


def reduced_config(name: str, text: dict[str, int] | None = None) -> dict[str, Any]:
    """The family's shipped config.json with the sizing keys of ``_TEXT`` (decoder; ``text`` overrides some of
    them) and ``_VISION`` set."""
    sizes = {**_TEXT, **(text or {})}
    config = json.loads((Path(models_package.__file__).parent / f"{name}.json").read_text())["config"]

    def shrink(cfg: dict[str, Any], sizes: dict[str, int]) -> dict[str, Any]:
        layers = cfg.get("num_hidden_layers")
        out = dict(cfg)
        for key, value in cfg.items():
            if key in sizes and isinstance(value, int) and not isinstance(value, bool):
                out[key] = sizes[key]
            elif isinstance(value, list) and layers and len(value) == layers:  # per-layer lists: the first ones
                out[key] = value[: sizes["num_hidden_layers"]]
        if "num_key_value_heads" in cfg and cfg.get("num_attention_heads"):  # keep MHA as MHA, GQA as GQA
            mha = cfg["num_key_value_heads"] in (None, cfg["num_attention_heads"])
            out["num_key_value_heads"] = sizes["num_attention_heads"] if mha else 2
        if "qk_rope_head_dim" in cfg:  # DeepSeek's MLA: head_dim is the rotary part's
            out["head_dim"] = sizes["qk_rope_head_dim"]
        if "num_experts_per_tok" in cfg:
            out["num_experts_per_tok"] = min(2, cfg["num_experts_per_tok"])
        if isinstance(out.get("pad_token_id"), int) and out["pad_token_id"] >= out.get("vocab_size", 1 << 62):
            out["pad_token_id"] = 0
        return out

    if isinstance(config.get("text_config"), dict):
        config["text_config"] = shrink(config["text_config"], sizes)
        if isinstance(config.get("vision_config"), dict):
            config["vision_config"] = shrink(config["vision_config"], _VISION)
    else:
        config = shrink(config, sizes)
    if config.get("model_type") == "qwen2_5_vl":  # the published checkpoints' multimodal rope, [16, 24, 24] of 64
        rope = config["text_config"].setdefault("rope_parameters", {})
        half = sizes["head_dim"] // 2  # [4, 6, 6] of head_dim 32 / 2
        rope["mrope_section"] = [half // 4, 3 * half // 8, half - half // 4 - 3 * half // 8]
    config.setdefault("dtype", config.pop("torch_dtype", "bfloat16"))
    return config


def model_folder(name: str, tiny_model: Path, into: Path, text: dict[str, int] | None = None) -> Path:
    """The reduced family as a model folder: config.json, random bf16 weights, the tiny tokenizer (``text``:
    ``reduced_config``'s)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    folder = into / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(reduced_config(name, text)))
    config = AutoConfig.from_pretrained(folder)
    cls = AutoModelForImageTextToText if type(config) in AutoModelForImageTextToText._model_mapping else None
    torch.manual_seed(0)
    model = (cls or AutoModelForCausalLM).from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    for file in ("tokenizer.json", "tokenizer_config.json"):
        (folder / file).write_bytes((tiny_model / file).read_bytes())
    return folder


def lora_config(folder: Path, out: Path, **overrides: Any) -> dict[str, Any]:
    """tests/test_memory_built.py's LoRA SFT config (lora_target all) at this file's batch and cutoff, bf16."""
    from tests.test_memory_built import lora_config as built_config

    # use_cpu: transformers refuses bf16 without a GPU unless told the run is on the CPU
    extra = {"cutoff_len": CUTOFF, "per_device_train_batch_size": BATCH, "bf16": True, "use_cpu": True}
    return built_config(folder, out, report_to="none", **{**extra, **overrides})


@dataclass(frozen=True)
class Measured:
    live_bytes: int  # parameters, buffers and optimizer state when the measured step began
    step_peak_bytes: int  # the most the step allocated above that, from the profiler's memory events
    gradient_bytes: int = 0  # the .grad tensors the measured step's backward left, each storage once
    optimizer_state_bytes: int = 0  # the optimizer's state tensors when the measured step began
    allocations: tuple[int, ...] = ()  # the step's allocator events in time order: +bytes allocated, -bytes freed
    saved_bytes: int = 0  # what autograd saved in a forward without labels (``saved_set``), each storage once

    @property
    def peak_bytes(self) -> int:
        return self.live_bytes + self.step_peak_bytes


def allocator_events(run: Any) -> tuple[int, ...]:
    """Every allocation (+bytes) and free (-bytes) of the CPU allocator while ``run()`` runs, in time order, as
    torch's profiler records them. Summed in order, their maximum is the peak of what was allocated and not
    yet freed (tests/stage_step.py ``events_peak``)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    return tuple(nbytes for _, nbytes in events)


def lf_model(config: dict[str, Any], add_valuehead: bool = False) -> Any:
    """LLaMA-Factory's own model for ``config``: get_train_args, load_tokenizer, load_model (trainable; with trl's
    value head where ``add_valuehead``, as train/ppo/workflow.py loads the policy)."""
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_model, load_tokenizer

    from llamafactory_rocm.lf.patching import Patches

    with Patches() as patches:
        patches.environ()  # get_train_args sets environment variables
        model_args, _, _, finetuning_args, _ = get_train_args(dict(config))
        tokenizer = load_tokenizer(model_args)["tokenizer"]
        return load_model(tokenizer, model_args, finetuning_args, is_trainable=True, add_valuehead=add_valuehead)


def measure_step(model: Any, vocab: int, batch: int, cutoff: int, saved_set: bool = False) -> Measured:
    """Two LoRA training steps as transformers' Trainer runs them; the second one measured. ``saved_set``: then
    one more forward, without labels (no loss), under ``torch.autograd.graph.saved_tensors_hooks``: the bytes of
    every tensor autograd saved for backward that is not a parameter or buffer, each storage once."""
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from tests.stage_step import live_bytes

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        accelerator = Accelerator(mixed_precision="bf16", cpu=True)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-4)  # LLaMA-Factory's default optim: adamw_torch
        model, optimizer = accelerator.prepare(model, optimizer)
        model.train()
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (batch, cutoff), generator=generator)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
        if getattr(model.config, "model_type", "") == "gemma3":  # its collator adds them (0: text, not image)
            inputs["token_type_ids"] = torch.zeros_like(ids)

        gradients: list[int] = []

        def step() -> None:
            outputs = model(**inputs)
            loss = outputs["loss"]
            del outputs  # the Trainer's compute_loss returns the loss only
            accelerator.backward(loss)
            grads = {id(p.grad): p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None}
            gradients.append(sum(grads.values()))
            accelerator.clip_grad_norm_(params, 1.0)  # max_grad_norm 1.0
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()  # AdamW's state exists from here on, as in every step after the first
        live = live_bytes(model, optimizer)
        state = {id(t): t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if t.dim()}
        events = allocator_events(step)
        saved = saved_bytes(model, {k: v for k, v in inputs.items() if k != "labels"}) if saved_set else 0
        return Measured(live, max(accumulate(events)), gradients[-1], sum(state.values()), events, saved)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def saved_bytes(model: Any, inputs: dict[str, Any]) -> int:
    """What autograd saves for backward in ``model(**inputs)``, parameters and buffers left out, each storage
    once: the forward as the step runs it (accelerate's autocast, the model's own gradient checkpointing)."""
    import torch

    held = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    saved: dict[int, int] = {}

    def pack(tensor: Any) -> Any:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in held and tensor.device.type != "meta":
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        outputs = model(**inputs)
    del outputs
    return sum(saved.values())


def estimated(config: dict[str, Any], model: Any, traced: bool = True) -> Any:
    """The package's estimate for the same folder and config, the model counted as the dry run counts it and,
    with ``traced``, its forward traced as the dry run traces it (lf/dry_activations.py); without, the
    per-family formula."""
    from llamafactory_rocm.lf.dry_activations import trace_activations
    from llamafactory_rocm.lf.memory import count_model, model_config_for
    from llamafactory_rocm.rules.memory_fit import plan_estimate
    from tests.conftest import make_ctx

    built = count_model(model)
    if traced:
        batch, cutoff = config["per_device_train_batch_size"], config["cutoff_len"]
        built = replace(built, activations=trace_activations(model, batch, cutoff, "bfloat16"))
    ctx = replace(make_ctx("mi300x"), model_config=model_config_for(config["model_name_or_path"]), built_model=built)
    return plan_estimate(config, {}, ctx)


@dataclass(frozen=True)
class Compared:
    family: str
    checkpointing: bool
    measured: Measured
    gradient_bytes: int
    est: Any  # memory.Estimate

    @property
    def estimated_step_bytes(self) -> float:
        return (self.est.activations_gib + self.est.logits_gib) * 2**30 + self.gradient_bytes

    @property
    def estimated_peak_bytes(self) -> float:
        return (self.est.total_gib - self.est.workspace_gib) * 2**30

    @property
    def step_ratio(self) -> float:
        return self.estimated_step_bytes / self.measured.step_peak_bytes

    @property
    def peak_ratio(self) -> float:
        return self.estimated_peak_bytes / self.measured.peak_bytes


def compare(family: str, tiny_model: Path, into: Path, checkpointing: bool = True) -> tuple[Compared, Compared]:
    """The measured step against the estimate from the traced forward, and against the per-family formula."""
    from llamafactory_rocm.lf.memory import count_model

    folder = model_folder(family, tiny_model, into)
    config = lora_config(folder, into / "out", disable_gradient_checkpointing=not checkpointing)
    model = lf_model(config)
    est, formula = estimated(config, model), estimated(config, model, traced=False)
    vocab = model.get_output_embeddings().weight.shape[0]
    measured = measure_step(model, vocab, BATCH, CUTOFF)
    gradients = count_model(model).gradient_bytes
    return (
        Compared(family, checkpointing, measured, gradients, est),
        Compared(family, checkpointing, measured, gradients, formula),
    )


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.mark.trainer
@pytest.mark.parametrize(
    ("family", "checkpointing"),
    # LLaMA-Factory's default (checkpointing) for every family; without it for a dense and the all-expert MoE
    [(family, True) for family in FAMILIES] + [("llama3_8b", False), ("llama4_defaults", False)],
)
def test_the_estimate_is_within_10_percent_of_a_measured_lora_step(family, checkpointing, tiny_model, tmp_path):
    traced, formula = compare(family, tiny_model, tmp_path, checkpointing)
    for found in (traced, formula):
        assert found.step_ratio == pytest.approx(1, abs=TOLERANCE), found
        assert found.peak_ratio == pytest.approx(1, abs=TOLERANCE), found
    assert traced.est.activations_traced and not formula.est.activations_traced
