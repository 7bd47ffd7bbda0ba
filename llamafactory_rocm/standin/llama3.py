"""Llama 3's stand-in tokenizer, built from Qwen3's (Apache-2.0) byte-level BPE: Meta's vocabulary is not shipped.

What it keeps of Llama 3 is its interface, not its vocabulary: the 256 special tokens at Llama 3.1's ids
(128000-128255, so ``<|eom_id|>`` is there and LLaMA-Factory's llama3 template adds no token), a vocabulary of
exactly 128,256 ids (the bundled config's vocab_size: no id past the embedding, nothing to resize), Llama 3's
pre-tokenizer split (digits in groups of up to three, where Qwen3 splits every digit) and Llama 3 Instruct's
chat-template format. The BPE itself is Qwen3's, cut to its first 126,900 tokens (Qwen3's ids are its merge
ranks: the cut drops its rarest merges) plus the 1,100 two- and three-digit numbers, so the count differs from
Llama 3's by what the two vocabularies merge differently: bench/bench_standin_tokenizer.py measures it.
"""

from __future__ import annotations

import copy
from typing import Any

VOCAB_SIZE = 128256  # Llama 3's embedding rows (config.json vocab_size)
FIRST_SPECIAL = 128000  # Llama 3's first special-token id: the BPE fills the ids below it
BYTES = 256  # a byte-level BPE's first ids are the bytes; each later id is the merge of that rank

# Llama 3.1's special tokens by id (Llama 3.0 has reserved names at 128004, 128008 and 128010 instead of these
# three: LLaMA-Factory's llama3 template would then add <|eom_id|> past the embedding as a 128,257th token).
_NAMED = {
    128000: "<|begin_of_text|>",
    128001: "<|end_of_text|>",
    128002: "<|reserved_special_token_0|>",
    128003: "<|reserved_special_token_1|>",
    128004: "<|finetune_right_pad_id|>",
    128005: "<|reserved_special_token_2|>",
    128006: "<|start_header_id|>",
    128007: "<|end_header_id|>",
    128008: "<|eom_id|>",
    128009: "<|eot_id|>",
    128010: "<|python_tag|>",
}
FIRST_RESERVED = 128011  # 128011-128255: <|reserved_special_token_3|> .. <|reserved_special_token_247|>

BOS = "<|begin_of_text|>"
EOS = "<|eot_id|>"  # Instruct's eos (the base model's is <|end_of_text|>); LLaMA-Factory's template sets it either way

# Meta-Llama-3-8B-Instruct's chat format, written for the stand-in: each message as
# <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>, bos first, the assistant header to generate.
CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# Qwen3's split takes one digit a piece; Llama 3's (the same expression otherwise) up to three.
_QWEN_DIGITS = r"|\p{N}|"
_LLAMA_DIGITS = r"|\p{N}{1,3}|"


def special_tokens() -> dict[int, str]:
    """Llama 3.1's 256 special tokens, id -> text."""
    reserved = {FIRST_RESERVED + i: f"<|reserved_special_token_{3 + i}|>" for i in range(VOCAB_SIZE - FIRST_RESERVED)}
    return {**_NAMED, **reserved}


def digit_tokens() -> list[str]:
    """The numbers Llama 3's split leaves whole and Qwen3's vocabulary has no token for: 00-99 and 000-999."""
    return [f"{n:02d}" for n in range(100)] + [f"{n:03d}" for n in range(1000)]


def llama3_standin(qwen3: dict[str, Any]) -> dict[str, Any]:
    """Llama 3's stand-in tokenizer.json from Qwen3's tokenizer.json (both as parsed JSON)."""
    model = qwen3["model"]
    digits = digit_tokens()
    keep = FIRST_SPECIAL - len(digits)  # Qwen3's first ``keep`` ids: bytes, then merges in rank order
    merges = [list(pair) for pair in model["merges"][: keep - BYTES]]
    vocab = {token: i for token, i in model["vocab"].items() if i < keep}
    if len(vocab) != keep or any(vocab.get(a + b) != BYTES + rank for rank, (a, b) in enumerate(merges)):
        raise ValueError("Qwen3's tokenizer.json: its ids are not its merge ranks; the cut would drop used tokens")
    for i, number in enumerate(digits, start=keep):
        vocab[number] = i
        merges.append([number[:-1], number[-1]])  # 12 <- 1 2; 123 <- 12 3
        if len(number) == 3:
            merges.append([number[0], number[1:]])  # 123 <- 1 23: whichever pair merged first, the number is one token

    out = copy.deepcopy({k: v for k, v in qwen3.items() if k != "model"})
    out["model"] = {
        **{k: v for k, v in model.items() if k not in ("vocab", "merges")},
        "vocab": vocab,
        "merges": merges,
    }
    out["normalizer"] = None  # Llama 3 reads text as given; Qwen3 NFC-normalises it
    out["pre_tokenizer"] = _llama_split(out["pre_tokenizer"])
    out["added_tokens"] = [
        {
            "id": i,
            "content": text,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, text in special_tokens().items()
    ]
    # As Llama 3's own tokenizer.json: <|begin_of_text|> before a text encoded with special tokens.
    out["post_processor"] = {
        "type": "Sequence",
        "processors": [
            qwen3["post_processor"],
            {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [
                    {"SpecialToken": {"id": BOS, "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": BOS, "type_id": 1}},
                    {"Sequence": {"id": "B", "type_id": 1}},
                ],
                "special_tokens": {BOS: {"id": BOS, "ids": [FIRST_SPECIAL], "tokens": [BOS]}},
            },
        ],
    }
    return out


def _llama_split(pre_tokenizer: dict[str, Any]) -> dict[str, Any]:
    """Qwen3's pre-tokenizer with Llama 3's digit groups."""
    split = copy.deepcopy(pre_tokenizer)
    regex = split["pretokenizers"][0]["pattern"]["Regex"]
    if regex.count(_QWEN_DIGITS) != 1:
        raise ValueError("Qwen3's tokenizer.json: its pre-tokenizer has no single-digit split to widen")
    split["pretokenizers"][0]["pattern"]["Regex"] = regex.replace(_QWEN_DIGITS, _LLAMA_DIGITS)
    return split


def tokenizer_config() -> dict[str, Any]:
    """The stand-in's tokenizer_config.json: Llama 3 Instruct's special tokens and chat template."""
    return {
        "bos_token": BOS,
        "eos_token": EOS,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": True,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 8192,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
