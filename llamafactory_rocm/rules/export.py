"""Merging an adapter with ``llamafactory-cli export``: into a quantized model, and onto the GPU.

Both rules read an export config (``export_dir`` set) as LLaMA-Factory's ``export_model``
(``llamafactory/train/tuner.py``) would run it (docs/after-training.md#t1, #t2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..findings import Finding
from ..lf.commands import EXPORT
from ..lf.memory import GIB, UNESTIMABLE, checkpoint_weight_bytes, model_config_for, shape_and_count
from .base import Context, Step, lf_value, rule, unchanged
from .memory_fit import BUDGET

# Bytes per parameter of an explicit infer_dtype. export_model (llamafactory/train/tuner.py) loads the model
# in the checkpoint's own dtype (load_model's torch_dtype="auto", memory.checkpoint_weight_bytes) and then
# converts it: to infer_dtype, or with "auto" to half precision where the checkpoint is fp32. The peak on
# the device is the larger of the two.
_DTYPE_BYTES = {"auto": 0, "bfloat16": 2, "float16": 2, "float32": 4}


def _absent(value: Any) -> bool:
    return value in (None, "", "null", "None")


def _is_export(config: Mapping[str, Any]) -> bool:
    return not _absent(config.get("export_dir"))


def _model_config(config: Mapping[str, Any], ctx: Context) -> Mapping[str, Any] | None:
    if ctx.model_config is not None:
        return ctx.model_config
    name = config.get("model_name_or_path")
    return model_config_for(str(name)) if name else None


@rule(EXPORT)
def refuse_merge_into_quantized(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    """export_model loads the model first, then stops: "Cannot merge adapters to a quantized model."

    Mirrors llamafactory/train/tuner.py ``export_model`` (0.9.5):
    ``if getattr(model, "quantization_method", None) is not None and model_args.adapter_name_or_path
    is not None: raise ValueError("Cannot merge adapters to a quantized model.")``; the model is quantized
    when ``quantization_bit`` is set (on-the-fly) or its config.json has a ``quantization_config``
    (GPTQ/AWQ/... checkpoints). tests/test_rules_export.py pins the line.
    """
    if not _is_export(config) or _absent(config.get("adapter_name_or_path")):
        return unchanged(config, env)
    bits = config.get("quantization_bit")
    model_cfg = _model_config(config, ctx)
    prequantized = isinstance(model_cfg, Mapping) and model_cfg.get("quantization_config") is not None
    if _absent(bits) and not prequantized:
        return unchanged(config, env)
    if not _absent(bits):
        message = (
            f"quantization_bit: {bits} with an adapter and export_dir: llamafactory-cli export loads the model "
            "quantized, then stops with 'Cannot merge adapters to a quantized model.' (after loading it)."
        )
        case = key = "quantization_bit"
    else:
        message = (
            f"{config.get('model_name_or_path')} is a quantized checkpoint (its config.json has a "
            "quantization_config): llamafactory-cli export stops with 'Cannot merge adapters to a quantized model.'"
        )
        case, key = "quantized_model", "model_name_or_path"
    return unchanged(
        config,
        env,
        Finding(code="MERGE_INTO_QUANTIZED", key=key, old=bits, message=message, fix_as=case),
    )


@rule(EXPORT)
def export_memory(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    """``export_device: auto`` loads the model onto the GPUs (device_map "auto"); CPU is LLaMA-Factory's default.

    get_infer_args sets ``device_map = {"": cpu}`` only for ``export_device: cpu``, else "auto"
    (llamafactory/hparams/parser.py), and the patcher adds ``offload_folder`` for "auto": what does not
    fit in GPU memory is spread over CPU memory and disk by accelerate (docs/after-training.md#t2).
    """
    if not _is_export(config) or str(lf_value(config, "export_device", "cpu")).lower() != "auto":
        return unchanged(config, env)
    devices = ctx.snapshot.devices
    model_cfg = _model_config(config, ctx)
    if not devices or model_cfg is None:
        return unchanged(config, env)
    dtype = str(lf_value(config, "infer_dtype", "auto")).lower()
    per_param = _DTYPE_BYTES.get(dtype)
    if per_param is None:  # a value LLaMA-Factory's parser refuses by itself (infer_dtype choices)
        return unchanged(config, env)
    try:
        _, parameters = shape_and_count(model_cfg)
    except UNESTIMABLE:
        return unchanged(config, env)
    per_param = max(per_param, checkpoint_weight_bytes(model_cfg))
    model_gib = parameters * per_param / GIB
    device_gib = sum(d.total_memory_bytes for d in devices) / GIB
    if model_gib <= BUDGET * device_gib:  # the share of a device the memory-fit rule counts on (rules/memory_fit.py)
        return unchanged(config, env)
    where = "the device" if len(devices) == 1 else f"the {len(devices)} devices together"
    shown = {2: "half precision", 4: "float32"}.get(per_param, dtype)
    return unchanged(
        config,
        env,
        Finding(
            code="EXPORT_MEMORY_OVER_DEVICE",
            key="export_device",
            old="auto",
            new="cpu",
            message=f"export_device: auto loads the model onto the GPU: {parameters / 1e9:.1f}B parameters in "
            f"{shown} are {model_gib:.1f} GiB, over {BUDGET:.0%} of the {device_gib:.1f} GiB of {where}; accelerate "
            "spreads what does not fit over CPU memory and offload_folder on disk, so the merge gains little from the "
            "GPU and can run out of host memory or disk.",
        ),
    )


__all__ = ["export_memory", "refuse_merge_into_quantized"]
