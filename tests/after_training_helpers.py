"""Shared by the after-training tests: a machine snapshot read as this machine, and a real PEFT adapter."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from llamafactory_rocm.rules import Context
from tests.conftest import load_snapshot, make_ctx


def here_ctx(name: str, installed: frozenset[str] | None = None, **snapshot: Any) -> Context:
    """``make_ctx(name)`` as if probed on this machine (``ctx.planned`` False), with snapshot fields replaced."""
    snap = load_snapshot(name).model_copy(update={"source": "probe", **snapshot})
    return dataclasses.replace(make_ctx(name), snapshot=snap, installed=installed)


def planned_ctx(name: str, installed: frozenset[str] | None = None) -> Context:
    return dataclasses.replace(make_ctx(name), installed=installed)


def peft_adapter_config(folder: Path, base: str, r: int = 8) -> Path:
    """An adapter_config.json written by PEFT itself (what LLaMA-Factory's training saves)."""
    from peft import LoraConfig

    LoraConfig(
        r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"], base_model_name_or_path=base
    ).save_pretrained(str(folder))
    return folder


def peft_adapter(model_dir: Path, folder: Path, r: int = 8) -> Path:
    """A LoRA adapter with weights on ``model_dir``, saved by PEFT (untrained: B is zero, as PEFT initialises)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"]))
    peft_model.save_pretrained(str(folder))
    return folder
