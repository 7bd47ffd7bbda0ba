"""Which shipped tokenizer family fits a model: its config.json (model_type, vocab_size) and its hub id."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .llama3 import VOCAB_SIZE as LLAMA3_VOCAB

QWEN3_IDS = 151669  # Qwen3's tokenizer: 151,643 BPE tokens and 26 special ones
_MODEL_TYPES = {"llama": "llama3", "qwen3": "qwen3", "qwen3_moe": "qwen3"}
_ID_WORDS = (("llama-3", "llama3"), ("llama3", "llama3"), ("qwen3", "qwen3"))  # lower-case hub-id part -> family
_IDS = {"llama3": LLAMA3_VOCAB, "qwen3": QWEN3_IDS}  # ids the family's tokenizer writes: the embedding needs as many


def standin_family(model_config: Mapping[str, Any], hub_id: str) -> str | None:
    """``llama3`` or ``qwen3`` where the config (else the hub id) says that family and its embedding holds every
    id the family's tokenizer writes; None where no shipped tokenizer fits."""
    model_type = model_config.get("model_type")
    family = _MODEL_TYPES.get(model_type) if model_type else _from_hub_id(hub_id)
    if family is None:
        return None
    if model_type == "llama" and model_config.get("vocab_size") != LLAMA3_VOCAB:
        return None  # Llama 1/2 (32,000), or a model that resized Llama 3's vocabulary
    vocab_size = model_config.get("vocab_size")
    if isinstance(vocab_size, int) and vocab_size < _IDS[family]:
        return None  # its ids would index past the embedding
    return family


def _from_hub_id(hub_id: str) -> str | None:
    name = hub_id.lower().rsplit("/", 1)[-1]
    return next((family for word, family in _ID_WORDS if word in name), None)
