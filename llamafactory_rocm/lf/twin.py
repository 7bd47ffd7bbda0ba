"""A shrunk twin of the user's model: the same architecture, module names and layers, its widths cut, random
weights on the CPU, saved with the user's tokenizer files into a throwaway folder (lf/dry_step.py runs
LLaMA-Factory's workflow on it to its first optimizer step).

Every layer is kept (a layer-indexed setting, freeze_trainable_layers or lora's layers_to_transform, meets the
same layers), so are the attention's query/key-value head ratio, the experts and the experts per token; the
widths are cut: the hidden size to a few heads of a small head dim, the feed-forward widths in the same ratio,
multi-head latent attention's ranks. The vocabulary is what the tokenizer needs (its length and every special
id), never more than the model's own, so an id past the real embedding is past the twin's too.

The config is LLaMA-Factory's own ``load_config`` (model/loader.py), the one ``load_model`` starts from, not the
meta model's: that one carries ``patch_config``'s changes (rope scaling, ...), which the twin's load would
apply a second time.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The twin's widths: hidden = heads x head dim, about 64 (the tests' tiny model's own width)
TARGET_HIDDEN = 64
MIN_HEAD_DIM = 8
# multi-head latent attention (deepseek v2/v3): ranks and per-head widths, each cut to this
LATENT_WIDTHS = {"q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8}
# feed-forward widths, cut in the hidden size's ratio
FFN_WIDTHS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "ffn_dim")
# files of the model's folder the twin does not link: its weights and its config (the twin writes its own)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx")
NOT_LINKED = ("config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")


class TwinUnavailable(Exception):
    """The twin cannot be built for this model (said as "not checked", never as a refusal)."""


@dataclass(frozen=True)
class TwinShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    experts: int | None
    original_hidden: int

    def describe(self) -> str:
        experts = f", {self.experts} experts" if self.experts else ""
        return (
            f"{self.layers} layers, hidden {self.hidden} (the model's {self.original_hidden}), {self.heads} heads "
            f"of {self.head_dim}, {self.kv_heads} key-value heads{experts}, vocabulary {self.vocab}"
        )


def _even(value: int) -> int:
    return value + (value % 2)


def shrunk_config(config: Any, vocab_needed: int) -> tuple[Any, TwinShape]:
    """A copy of the transformers ``config`` with its widths cut (TwinUnavailable where it cannot be)."""
    if getattr(config, "vision_config", None) is not None or getattr(config, "text_config", None) is not None:
        raise TwinUnavailable("the model has a vision or audio tower, which the twin does not shrink")
    if getattr(config, "quantization_config", None):
        raise TwinUnavailable("the model's config.json is quantized (quantization_config); the twin is not")
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(heads, int) or not isinstance(hidden, int) or not isinstance(layers, int):
        raise TwinUnavailable(f"model_type {getattr(config, 'model_type', '?')} names no hidden_size/heads/layers")
    kv = getattr(config, "num_key_value_heads", None) or heads
    ratio = heads // kv if heads % kv == 0 else 1
    new_kv = max(1, 4 // ratio) if ratio <= 4 else 1
    new_kv = min(new_kv, kv)
    new_heads = min(heads, new_kv * ratio)
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    new_head_dim = min(head_dim, max(MIN_HEAD_DIM, _even(TARGET_HIDDEN // new_heads)))
    new_hidden = min(hidden, new_heads * new_head_dim)
    twin = copy.deepcopy(config)
    twin.num_attention_heads = new_heads
    if getattr(config, "num_key_value_heads", None) is not None:
        twin.num_key_value_heads = new_kv
    twin.hidden_size = new_hidden
    if getattr(config, "head_dim", None) is not None:
        twin.head_dim = new_head_dim
    for name in FFN_WIDTHS:
        width = getattr(config, name, None)
        if isinstance(width, int) and width > 0:
            setattr(twin, name, max(8, _even(round(width * new_hidden / hidden))))
    latent = {k: v for k, v in LATENT_WIDTHS.items() if isinstance(getattr(config, k, None), int)}
    for name, width in latent.items():
        setattr(twin, name, min(getattr(config, name), width))
    if latent and hasattr(config, "qk_head_dim"):  # deepseek: the query-key head is nope + rope
        twin.qk_head_dim = twin.qk_nope_head_dim + twin.qk_rope_head_dim
        if getattr(config, "head_dim", None) == getattr(config, "qk_rope_head_dim", None):
            twin.head_dim = twin.qk_rope_head_dim
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int):
        twin.vocab_size = min(vocab, vocab_needed)
    names = ("num_experts", "num_local_experts", "n_routed_experts")
    experts = next((getattr(config, k) for k in names if getattr(config, k, None)), None)
    shape = TwinShape(layers, new_hidden, new_heads, getattr(twin, "num_key_value_heads", new_heads),
                      getattr(twin, "head_dim", None) or new_head_dim, twin.vocab_size, experts, hidden)  # fmt: skip
    return twin, shape


def vocab_needed(tokenizer: Any, config: Any) -> int:
    """The rows the twin's embedding needs: the tokenizer's length, every special id and the config's own ids."""
    ids = [len(tokenizer) - 1, *(getattr(tokenizer, "all_special_ids", None) or [])]
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        value = getattr(config, name, None)
        ids.extend(value if isinstance(value, list) else [value])
    return max(i for i in ids if isinstance(i, int)) + 1


def model_folder(model_args: Any) -> Path:
    """The folder the model's files are read from: the path, or its snapshot in the Hugging Face cache."""
    from huggingface_hub import snapshot_download

    name = model_args.model_name_or_path
    if os.path.isdir(name):
        return Path(name)
    try:  # the cache only (local_files_only): nothing is downloaded
        found = snapshot_download(
            name, revision=model_args.model_revision, cache_dir=model_args.cache_dir, local_files_only=True
        )
    except Exception as exc:  # huggingface_hub's LocalEntryNotFoundError, HFValidationError
        raise TwinUnavailable(f"{name} is not local: {type(exc).__name__}") from exc
    return Path(found)


def build_twin(model_args: Any, model_class: type, tokenizer: Any, folder: Path) -> TwinShape:
    """Write the twin of the model ``model_args`` names into ``folder``: the shrunk config, random weights of
    ``model_class`` (the class LLaMA-Factory's load_model built), and links to every other file of the model's
    folder (tokenizer, chat template, generation config, remote code)."""
    import torch
    from llamafactory.model.loader import load_config

    config = load_config(model_args)
    twin_config, shape = shrunk_config(config, vocab_needed(tokenizer, config))
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    dtype = dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype or "float32"), torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    with torch.device("cpu"):
        model = model_class._from_config(twin_config, dtype=dtype) if dtype else model_class(twin_config)
    model.save_pretrained(folder)
    source = model_folder(model_args)
    for item in source.iterdir():
        if item.name in NOT_LINKED or item.name.endswith(WEIGHT_SUFFIXES) or item.name.startswith("."):
            continue
        target = folder / item.name
        if not target.exists():
            target.symlink_to(item.resolve())
    return shape


def base_model_class(model: Any) -> type:
    """The transformers class under LLaMA-Factory's wrappers (peft's PeftModel, trl's value head)."""
    inner = model
    for _ in range(4):
        if hasattr(inner, "get_base_model"):
            inner = inner.get_base_model()
        elif hasattr(inner, "pretrained_model"):
            inner = inner.pretrained_model
        else:
            break
    return type(inner)
