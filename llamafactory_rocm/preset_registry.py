"""The built-in presets: an explicit registry of the YAML files shipped in ``presets/``.

Names follow ``{gpu}_{model}_{method}``; the GPU alias maps to its arch through the catalogue. Each
training preset has its after-training companions in ``presets/after/`` (``PresetEntry.after``).
``tests/test_presets.py`` keeps this list and the folder identical.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PresetEntry:
    name: str
    gpu: str  # catalogue alias
    model: str
    method: str
    gpus: int = 1
    description: str = ""
    companions: tuple[str, ...] = ()  # files the YAML refers to, relative to presets/

    @property
    def file_name(self) -> str:
        return f"{self.name}.yaml"

    @property
    def after(self) -> dict[str, str]:
        """The configs that follow training, relative to presets/: merge the adapter (export), then chat
        with the merged model (chat, webchat, api). ``tests/test_presets_after.py`` keeps them in step."""
        return {"export": f"after/{self.name}_export.yaml", "chat": f"after/{self.name}_chat.yaml"}


PRESETS: tuple[PresetEntry, ...] = (
    PresetEntry("mi300x_llama3_lora", "mi300x", "llama3-8b", "lora", 1, "Llama-3-8B LoRA, bf16, batch 16 x 4096"),
    PresetEntry(
        "mi300x_llama3_lora_8gpu",
        "mi300x",
        "llama3-8b",
        "lora",
        8,
        "Llama-3-8B LoRA on 8 GPUs, DeepSpeed ZeRO-2",
        ("deepspeed/ds_z2_config.json",),
    ),
    PresetEntry(
        "mi300x_llama3_lora_2node",
        "mi300x",
        "llama3-8b",
        "lora",
        16,
        "Llama-3-8B LoRA on 2 nodes x 8 GPUs, DeepSpeed ZeRO-2",
        ("deepspeed/ds_z2_config.json",),
    ),
    PresetEntry("mi300x_qwen3_lora", "mi300x", "qwen3-8b", "lora", 1, "Qwen3-8B LoRA, bf16, batch 16 x 4096"),
    PresetEntry("mi250_llama3_lora", "mi250", "llama3-8b", "lora", 1, "Llama-3-8B LoRA per 64 GB GCD, batch 4 x 4096"),
    PresetEntry("rx7900xtx_llama3_lora", "rx7900xtx", "llama3-8b", "lora", 1, "8B bf16 LoRA in 24 GB: batch 1 x 2048"),
    PresetEntry("rx7900xtx_qwen3_lora", "rx7900xtx", "qwen3-8b", "lora", 1, "Qwen3-8B bf16 LoRA in 24 GB"),
    PresetEntry("rx7800xt_llama3_qlora", "rx7800xt", "llama3-8b", "qlora", 1, "16 GB RDNA3: 4-bit QLoRA"),
    PresetEntry("w7900_llama3_lora", "w7900", "llama3-8b", "lora", 1, "Llama-3-8B LoRA in 48 GB, batch 4 x 2048"),
    # issue 22: the 2026 machines (docs/rdna4-strixhalo.md); none of them ran on the hardware
    PresetEntry("mi355x_llama3_lora", "mi355x", "llama3-8b", "lora", 1, "Llama-3-8B LoRA, bf16, batch 32 x 4096"),
    PresetEntry("r9700_llama3_lora", "r9700", "llama3-8b", "lora", 1, "RDNA4 32 GB: Llama-3-8B LoRA, batch 2 x 2048"),
    PresetEntry("rx9070xt_qwen3_4b_lora", "rx9070xt", "qwen3-4b", "lora", 1, "RDNA4 16 GB: Qwen3-4B LoRA (8B: no fit)"),
    PresetEntry("strixhalo_qwen3_lora", "strixhalo", "qwen3-4b", "lora", 1, "Strix Halo (unified): Qwen3-4B LoRA r6"),
)
