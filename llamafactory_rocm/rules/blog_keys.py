"""Keys LLaMA-Factory does not have: translate the blog-style ones, refuse the rest.

Stock LLaMA-Factory fails on any unknown key (``Some keys are not used by the HfArgumentParser``),
and ``compute_dtype`` is derived (``init=False``), so ``--compute_dtype bfloat16 --backend pt`` copied
from blogs never runs (docs/rocm-facts.md#l6, docs/rocm-facts.md#l7).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from functools import cache
from typing import Any

from ..findings import Finding, Level
from ..lf.commands import TRAIN
from .base import Context, Step, rule, unchanged

_DTYPE_TO_FLAGS = {
    "bfloat16": (True, False),
    "bf16": (True, False),
    "float16": (False, True),
    "fp16": (False, True),
    "half": (False, True),
    "float32": (False, False),
    "fp32": (False, False),
    "float": (False, False),
}
_PYTORCH_BACKENDS = {"pt", "torch", "pytorch", "hf", "huggingface"}
_DEEPSPEED_BACKENDS = {"deepspeed", "ds", "zero", "zero2", "zero3"}
# The DeepSpeed JSON the presets ship (presets/deepspeed/, installed with the package).
DEEPSPEED_EXAMPLE = "presets/deepspeed/ds_z2_config.json"
# Keys people write that mean something LLaMA-Factory spells differently or not as a key at all.
_HINTS = {
    "rocm_arch": "PYTORCH_ROCM_ARCH is an environment variable, not a config key: export it instead",
    "gpu_arch": "PYTORCH_ROCM_ARCH is an environment variable, not a config key: export it instead",
    "dtype": "use bf16: true (or fp16: true) for training precision",
    "torch_dtype": "use bf16: true (or fp16: true); infer_dtype is for inference only",
    "lora_r": "lora_rank",
    "model_name": "model_name_or_path",
    "lr": "learning_rate",
    "epochs": "num_train_epochs",
    "batch_size": "per_device_train_batch_size",
    "per_device_batch_size": "per_device_train_batch_size",
    "train_batch_size": "per_device_train_batch_size",
    "micro_batch_size": "per_device_train_batch_size",
    "gradient_accumulation": "gradient_accumulation_steps",
    "grad_accum": "gradient_accumulation_steps",
    "num_epochs": "num_train_epochs",
    "max_seq_length": "cutoff_len",
    "max_seq_len": "cutoff_len",
    "seq_len": "cutoff_len",
    "sequence_len": "cutoff_len",
    "model_max_length": "cutoff_len",
    "target_modules": "lora_target",
    "lora_target_modules": "lora_target",
    "lora_targets": "lora_target",
    "base_model": "model_name_or_path",
    "model_path": "model_name_or_path",
    "data_path": "dataset",
    "dataset_path": "dataset",
    "lr_scheduler": "lr_scheduler_type",
    "scheduler": "lr_scheduler_type",
    "load_in_4bit": "use quantization_bit: 4 (QLoRA, with finetuning_type: lora)",
    "load_in_8bit": "use quantization_bit: 8 (with finetuning_type: lora)",
    "gradient_checkpointing": "gradient checkpointing is on by default: remove the key "
    "(disable_gradient_checkpointing: true turns it off)",
    # LLaMA-Factory's earlier name (0.9.3's ModelArguments); its closest spelling, init_special_tokens, is how
    # the new tokens' embeddings start and adds no token
    "new_special_tokens": "add_special_tokens",
}
# TrainingArguments fields transformers 5 removed (its training_args.py against 4.57.1's), as LLaMA-Factory 0.9.5
# on transformers 5.5 refuses them: the key that now does the same, where one does (key -> (new key, value
# of the new key: None for the same value), what changed).
_GONE_IN_TRANSFORMERS_5: dict[str, tuple[str | None, Any, str]] = {
    "group_by_length": ("train_sampling_strategy", "group_by_length", "the sampler is train_sampling_strategy"),
    "per_gpu_train_batch_size": ("per_device_train_batch_size", None, "renamed per_device_train_batch_size"),
    "per_gpu_eval_batch_size": ("per_device_eval_batch_size", None, "renamed per_device_eval_batch_size"),
    "no_cuda": ("use_cpu", None, "renamed use_cpu"),
    "use_mps_device": (None, None, "an Apple GPU is used where there is one"),
    "include_tokens_per_second": (None, None, "LLaMA-Factory's include_effective_tokens_per_second says it"),
    "save_safetensors": (None, None, "weights are always saved as safetensors"),
}


@rule(TRAIN)
def rewrite_compute_dtype(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if "compute_dtype" not in config:
        return unchanged(config, env)
    raw = config["compute_dtype"]
    value = str(raw).strip().lower().removeprefix("torch.")
    if value not in _DTYPE_TO_FLAGS:
        return unchanged(
            config,
            env,
            Finding(
                code="COMPUTE_DTYPE_UNKNOWN",
                key="compute_dtype",
                old=raw,
                message=f"compute_dtype: {raw!r} is not a dtype, and LLaMA-Factory has no compute_dtype key. "
                f"Values that are translated: {', '.join(_DTYPE_TO_FLAGS)}.",
            ),
        )
    bf16, fp16 = _DTYPE_TO_FLAGS[value]
    new = {k: v for k, v in config.items() if k != "compute_dtype"}
    new["bf16"], new["fp16"] = bf16, fp16
    return Step(
        new,
        dict(env),
        [
            Finding(
                code="COMPUTE_DTYPE_REWRITTEN",
                key="compute_dtype",
                old=raw,
                new={"bf16": bf16, "fp16": fp16},
                message=(
                    f'compute_dtype: {raw} is derived inside LLaMA-Factory ("Do not specify it") and '
                    "stock LLaMA-Factory rejects it as an unknown key."
                ),
                fix_with={"bf16": str(bf16).lower(), "fp16": str(fp16).lower()},
            )
        ],
    )


@rule(TRAIN)
def drop_backend(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if "backend" not in config:
        return unchanged(config, env)
    raw = config["backend"]
    if str(raw).strip().lower().replace("-", "").replace("_", "") in _DEEPSPEED_BACKENDS:
        return unchanged(config, env, _deepspeed_backend(raw))
    if str(raw).strip().lower() not in _PYTORCH_BACKENDS:
        return unchanged(
            config,
            env,
            Finding(
                code="BACKEND_UNKNOWN",
                key="backend",
                old=raw,
                message=f"backend: {raw!r} is not a LLaMA-Factory training key.",
                fix_as="other",
            ),
        )
    new = {k: v for k, v in config.items() if k != "backend"}
    return Step(
        new,
        dict(env),
        [
            Finding(
                code="BACKEND_DROPPED",
                key="backend",
                old=raw,
                message=f"backend: {raw} is not a LLaMA-Factory key; training always runs on PyTorch.",
            )
        ],
    )


def _deepspeed_backend(raw: Any) -> Finding:
    """``backend: deepspeed``: LLaMA-Factory turns DeepSpeed on with ``deepspeed: <json>`` (docs/rocm-facts.md#l7)."""
    try:
        from ..resources import presets_dir

        example = str(presets_dir() / "deepspeed" / "ds_z2_config.json")
    except FileNotFoundError:  # an install without the bundled presets: name the file as the repo has it
        example = DEEPSPEED_EXAMPLE
    return Finding(
        code="BACKEND_UNKNOWN",
        key="backend",
        old=raw,
        message=f"backend: {raw} is not a LLaMA-Factory key: DeepSpeed is turned on with the deepspeed: key, "
        "the path of a DeepSpeed JSON config.",
        fix_as="deepspeed",
        fix_with={"example": example},
    )


def _gone_fix(key: str, value: Any, known: frozenset[str]) -> dict[str, Any] | None:
    """The fix of a TrainingArguments key transformers 5 removed: the key that does the same now (with the value
    it takes: ``group_by_length: true`` is ``train_sampling_strategy: group_by_length``), else the key removed;
    None for a key not removed there. A switch given false asks for nothing: the key only goes."""
    if key not in _GONE_IN_TRANSFORMERS_5:
        return None
    new_key, new_value, why = _GONE_IN_TRANSFORMERS_5[key]
    if new_key not in known or value in (False, None, "false", "False"):
        new_key = None
    remedy: dict[str, Any] = {key: None}
    if new_key is None:
        change = f"delete {key}"
    else:
        remedy[new_key] = value if new_value is None else new_value
        change = f"set {new_key}: {remedy[new_key]} instead"
    return {"fix_as": "gone", "fix_with": {"key": key, "why": why, "change": change}, "remedy": remedy}


def closest_key(key: str, known: frozenset[str]) -> str | None:
    """The key meant: a known mix-up first (``model_max_length`` is ``cutoff_len``), then the closest spelling
    among the keys training reads; never a generation key (``max_length``, ``top_p``: accepted by the train
    parser and then unused by training, so a typo "fixed" to one would be ignored silently)."""
    if key in _HINTS:
        return _HINTS[key]
    close = difflib.get_close_matches(key, sorted(known - generation_keys()), n=1, cutoff=0.6)
    return close[0] if close else None


@cache
def generation_keys() -> frozenset[str]:
    """The fields of LLaMA-Factory's GeneratingArguments (hparams/generating_args.py): read by chat, api and
    do_predict's generation only."""
    import dataclasses

    try:
        from ..lf.library import generating_arguments

        fields = dataclasses.fields(generating_arguments())
    except Exception:  # LLaMA-Factory not importable: the shipped key list serves, no exclusion
        return frozenset()
    return frozenset(f.name for f in fields)


# Reported by their own rules above when their value cannot be translated: not twice.
_TRANSLATED = frozenset({"compute_dtype", "backend"})


@rule(TRAIN)
def refuse_unknown_keys(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    unknown = sorted(k for k in config if k not in ctx.known_keys and k not in _TRANSLATED)
    if not unknown:
        return unchanged(config, env)
    # With ALLOW_EXTRA_ARGS=1 LLaMA-Factory ignores them silently: still worth a warning.
    level = Level.WARNING if env.get("ALLOW_EXTRA_ARGS", "").lower() in {"1", "true", "y"} else Level.ERROR
    findings = []
    for key in unknown:
        hint = closest_key(key, ctx.known_keys)
        gone = _gone_fix(key, config[key], ctx.known_keys)
        if gone is not None:
            fix = gone
        elif hint is None:
            fix: dict[str, Any] = {"fix_as": "no_match", "remedy": {key: None}}
        elif " " in hint:  # a sentence from _HINTS
            fix = {"fix_as": "hint", "fix_with": {"hint": f"{hint[0].upper()}{hint[1:]}"}}
        else:
            fix = {"fix_as": "near", "fix_with": {"near": hint}, "remedy": {key: None, hint: config[key]}}
        findings.append(
            Finding(
                code="UNKNOWN_KEY",
                level=level,
                key=key,
                old=config[key],
                message=f"{key!r} is not a LLaMA-Factory training key"
                + (" (ALLOW_EXTRA_ARGS=1 will silently ignore it)." if level is Level.WARNING else "."),
                **fix,
            )
        )
    return unchanged(config, env, *findings)
