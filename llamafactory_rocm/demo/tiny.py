"""A tiny Llama and tokenizer built locally, for the demo, tests and benchmarks (no hub needed).

Sizes follow docs/rocm-facts.md#l12 (the tiny-model recipe): hidden 64, 2 layers, 4 heads,
intermediate 128, a BPE vocabulary of a few hundred tokens trained on the data itself, and
initializer_range 0.2 (with the default 0.02 the loss barely moves in a short run).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

# The llama3 and qwen3 templates' special tokens, plus a pad token: a template whose tokens are
# missing would add them to the tokenizer and index past the tiny embedding.
SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",  # a llama3 stop word: without it LLaMA-Factory adds it and warns to resize the vocabulary
    "<|end_of_text|>",
    "<|pad|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
]


def texts_from_dataset(path: Path) -> Iterator[str]:
    rows = json.loads(path.read_text(encoding="utf-8"))
    for row in rows:
        if "conversations" in row:
            yield from (str(m.get("value", "")) for m in row["conversations"])
        else:
            yield from (str(row.get(k, "")) for k in ("instruction", "input", "output"))


def build_tiny_model(
    out_dir: Path,
    texts: Iterable[str],
    vocab_size: int = 460,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    intermediate_size: int = 128,
    num_heads: int = 4,
) -> Path:
    """Write a loadable tiny LlamaForCausalLM + fast tokenizer to ``out_dir``; return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|pad|>",
    )
    tokenizer.save_pretrained(out_dir)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=512,
        initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(out_dir)
    return out_dir
