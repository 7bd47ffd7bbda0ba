"""lf/dry_activations.py: the forward of the built model traced on fake tensors.

Oracles: the same forward run for real on CPU tensors (what autograd saves there, seen by torch's own
``saved_tensors_hooks``), and a real LoRA training step per family (tests/test_memory_oracle.py). Here: the
fake trace saves what the real forward saves; the model comes back untouched; what the trace sees follows the
implementation (eager attention's L x L weights, which no per-token formula has); where the forward cannot run
on fake tensors (eager MoE dispatch) the dry run says so and the formula serves.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafactory_rocm.lf.dry_activations import trace_activations
from llamafactory_rocm.lf.dry_run import dry_launch
from tests.conftest import tiny_train_config


def _tiny_lora(folder: Path, *, meta: bool, attention: str = "sdpa", **config: object):
    """The tiny Llama of the tests with LoRA on every linear (adapter in fp32, as LLaMA-Factory upcasts it)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(folder, attn_implementation=attention, **config)
    torch.manual_seed(0)
    with torch.device("meta") if meta else torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))
    for param in model.parameters():
        if param.requires_grad:
            param.data = param.data.float()
    model.train()
    return model


def _real_saved_bytes(model, sequences: int, length: int) -> int:
    """What autograd saves in the real forward on CPU tensors: each storage once, parameters and buffers not."""
    import torch

    owned = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen: dict[int, int] = {}
    kept = []

    def pack(tensor):
        key = tensor.untyped_storage().data_ptr()
        if key not in owned:
            seen.setdefault(key, tensor.untyped_storage().nbytes())
            kept.append(tensor)
        return tensor

    ids = torch.zeros(sequences, length, dtype=torch.long)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        model(input_ids=ids, use_cache=False)
    return sum(seen.values())


def test_the_fake_trace_saves_what_the_real_forward_saves(tiny_model):
    model = _tiny_lora(tiny_model, meta=False)
    traced = trace_activations(model, 2, 64, "bfloat16")
    total = sum(traced.layer_saved) + traced.outside + traced.head
    assert total == _real_saved_bytes(model, 2, 64)
    assert traced.tokens == 128
    assert len(traced.layer_saved) == model.config.num_hidden_layers
    assert traced.vocab == model.config.vocab_size


def test_the_model_comes_back_as_it_was(tiny_model):
    model = _tiny_lora(tiny_model, meta=True)
    model.gradient_checkpointing_enable()
    before = {name: param for name, param in model.named_parameters()}
    trace_activations(model, 1, 32, "bfloat16")
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    assert all(after[name] is before[name] and after[name].device.type == "meta" for name in before)
    layers = model.base_model.model.model.layers
    assert all(layer.gradient_checkpointing for layer in layers)


def test_the_trace_is_linear_in_tokens_where_attention_is_sdpa_and_not_where_it_is_eager(tiny_model):
    def per_token(attention: str, length: int) -> float:
        traced = trace_activations(_tiny_lora(tiny_model, meta=True, attention=attention), 1, length, "bfloat16")
        return sum(traced.layer_saved) / traced.tokens

    # linear but for what does not grow with tokens (autocast's bf16 copies of the fp32 adapter weights)
    assert per_token("sdpa", 64) == pytest.approx(per_token("sdpa", 256), rel=0.05)
    # eager attention keeps softmax(QK^T) per head: L x L per sequence, so per token it grows with L
    assert per_token("eager", 256) > 1.5 * per_token("eager", 64)


def test_a_data_dependent_forward_is_not_traced_and_the_dry_run_says_so(tmp_path, tiny_model):
    import json

    folder = tmp_path / "moe"
    folder.mkdir()
    config = json.loads((tiny_model / "config.json").read_text())
    config.update(
        model_type="qwen3_moe",
        architectures=["Qwen3MoeForCausalLM"],
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        experts_implementation="eager",  # transformers' loop over experts: torch.where on the routing
    )
    (folder / "config.json").write_text(json.dumps(config))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        (folder / file).write_bytes((tiny_model / file).read_bytes())
    run = dry_launch(tiny_train_config(folder, tmp_path / "out", lora_target="all"))
    assert run.built is not None and run.built.activations is None
    assert any("activations on the built model" in line for line in run.not_checked), run.not_checked


def test_the_dry_run_traces_the_policy_at_the_configs_batch_and_cutoff(tmp_path, tiny_model):
    config = tiny_train_config(tiny_model, tmp_path / "out", per_device_train_batch_size=3, cutoff_len=96)
    run = dry_launch(config)
    assert run.ok, run.findings
    traced = run.built.activations
    assert traced is not None and traced.tokens == 3 * 96
    assert "activations" in run.timings


@pytest.mark.parametrize("stage", ["dpo", "rm"])
def test_pairwise_stages_trace_chosen_and_rejected(tmp_path, tiny_model, stage):
    config = tiny_train_config(tiny_model, tmp_path / "out", stage=stage, per_device_train_batch_size=2)
    run = dry_launch(config)  # the QA data has no pairs: refused at the data step, the model is still built
    assert run.built is not None, run.findings
    assert run.built.activations is not None and run.built.activations.tokens == 2 * 2 * int(config["cutoff_len"])


@pytest.mark.parametrize("shape", ["qwen3_30b_a3b", "deepseek_v3_defaults", "gemma3_defaults", "llama4_defaults",
                                   "qwen2_5_vl_defaults", "qwen3_defaults"])  # fmt: skip
def test_two_layers_of_each_kind_give_what_every_layer_gives(shape, tmp_path, tiny_model, monkeypatch):
    """The trace runs two layers of each kind and lets the second stand for the rest; the oracle is the
    forward of every layer, on LLaMA-Factory's model of each shape (lora_target all, batch 1 x 1024)."""
    import json

    import llamafactory_rocm.lf.dry_run as dry_run_module
    from llamafactory_rocm.lf.dry_activations import trace_step
    from tests.test_memory_built import lora_config, shape_folder

    folder = shape_folder(shape, tiny_model, tmp_path)
    if shape == "qwen2_5_vl_defaults":  # the published checkpoints' multimodal rope; the class defaults have none
        config = json.loads((folder / "config.json").read_text())
        config["text_config"]["rope_parameters"]["mrope_section"] = [16, 24, 24]
        (folder / "config.json").write_text(json.dumps(config))
    built = []
    monkeypatch.setattr(dry_run_module, "trace_step", lambda launch: (built.append(launch.model), trace_step(launch)))
    run = dry_launch(lora_config(folder, tmp_path / "out"))
    assert run.built is not None and run.built.activations is not None, run.not_checked
    every = trace_activations(built[0], 1, 1024, None, every_layer=True)  # the config sets no bf16: no autocast
    assert run.built.activations == every
    config = json.loads((folder / "config.json").read_text())
    assert len(every.layer_saved) == config.get("text_config", config)["num_hidden_layers"]


def test_mla_attention_keeps_the_math_paths_softmax(tmp_path, tiny_model, monkeypatch):
    """DeepSeek's MLA hands SDPA q/k 192 wide and v 128: no fused kernel takes that (on the CPU, nor on ROCm:
    torch sdp_utils.cpp check_head_dim_size_flash<caller_is_meff=true>), so the math path keeps the fp32 softmax
    of every head, L x L per sequence. The trace sees it grow with L; a per-token formula cannot."""
    import json

    import llamafactory_rocm.lf.dry_run as dry_run_module
    from llamafactory_rocm.lf.dry_activations import trace_step
    from tests.test_memory_built import lora_config, shape_folder

    folder = shape_folder("deepseek_v3_defaults", tiny_model, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    built = []
    monkeypatch.setattr(dry_run_module, "trace_step", lambda launch: (built.append(launch.model), trace_step(launch)))
    dry_launch(lora_config(folder, tmp_path / "out"))
    heads = config["num_attention_heads"]
    short, long = (trace_activations(built[0], 1, length, None) for length in (512, 1024))
    per_token = [t.layer_saved[0] / t.tokens for t in (short, long)]
    # 512 more keys per query: heads x 512 fp32 scores (and as many softmax outputs) more per token
    assert per_token[1] - per_token[0] >= heads * 512 * 4


@pytest.mark.parametrize("freeze_vision_tower", [True, False])
def test_a_trainable_vision_tower_is_said_to_be_left_out(freeze_vision_tower, tmp_path, tiny_model, monkeypatch):
    """LLaMA-Factory's default freezes the tower (nothing saved there: the text trace is whole); unfrozen,
    LoRA ``all`` reaches its linears, and the dry run says that their activations per image are not counted.
    The oracle for "trainable" is the built model's own requires_grad under LLaMA-Factory's vision keys."""
    from llamafactory.model.model_utils.visual import COMPOSITE_MODELS

    import llamafactory_rocm.lf.dry_run as dry_run_module
    from llamafactory_rocm.lf.dry_activations import trace_step
    from tests.test_memory_built import lora_config, shape_folder

    folder = shape_folder("gemma3_defaults", tiny_model, tmp_path)
    built = []
    monkeypatch.setattr(dry_run_module, "trace_step", lambda launch: (built.append(launch.model), trace_step(launch)))
    run = dry_launch(lora_config(folder, tmp_path / "out", freeze_vision_tower=freeze_vision_tower))
    keys = COMPOSITE_MODELS["gemma3"].vision_model_keys
    trainable = [n for n, p in built[0].named_parameters() if p.requires_grad and any(k in n for k in keys)]
    said = [line for line in run.not_checked if "vision tower" in line]
    assert bool(trainable) is (not freeze_vision_tower)
    assert bool(said) is bool(trainable), run.not_checked
    assert run.built is not None and run.built.activations is not None  # the text is traced either way
