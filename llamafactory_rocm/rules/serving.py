"""Chat, API and web chat on ROCm: the vLLM/SGLang backends, their LoRA rank cap, and bf16 at inference.

``chat``, ``api`` and ``webchat`` all build LLaMA-Factory's ``ChatModel``; ``infer_backend`` picks
its engine (llamafactory/chat/chat_model.py). On this machine a backend that cannot run is an error;
when planning for another GPU the install it needs is a stated requirement, and only what no install
can fix (an arch the backend does not build for, an adapter rank above the cap) is an error
(docs/after-training.md#t3, #t4, #t5).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..findings import Finding, Level
from ..lf.adapters import adapter_paths, read_adapter_config
from ..lf.commands import CHAT, EVAL
from .base import Context, Step, lf_value, rule, unchanged

# vLLM's prebuilt ROCm wheels are built for this Python only (gpu.rocm.inc.md, "Prebuilt Wheels").
VLLM_ROCM_WHEEL_PYTHON = (3, 12)
# The values vLLM's LoRAConfig accepts for max_lora_rank (vllm/config/lora.py, recent releases).
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def _backend(config: Mapping[str, Any]) -> str:
    return str(lf_value(config, "infer_backend", "huggingface")).strip().lower()


def _on_amd(ctx: Context) -> bool:
    """ROCm torch, or AMD GPUs under a torch that is not ROCm (a CUDA wheel pulled in by vLLM)."""
    return ctx.rocm or bool(ctx.snapshot.kfd_targets)


def _archs(ctx: Context) -> list[str]:
    archs = list(ctx.snapshot.gpu_base_archs)
    if not archs:  # a CUDA torch on an AMD machine sees no device: KFD still names them
        archs = sorted({t for t in ctx.snapshot.kfd_targets})
    return archs


def _python(ctx: Context) -> tuple[int, ...] | None:
    if not ctx.snapshot.python:
        return None
    return tuple(int(p) for p in re.findall(r"\d+", ctx.snapshot.python)[:2])


def _lf_range(backend: str) -> str | None:
    """The version range LLaMA-Factory checks for the backend, read from LLaMA-Factory (lf.commands)."""
    try:
        from ..lf.commands import backend_requirements

        ranges = [req for req, mandatory in backend_requirements(backend) if not mandatory]
    except Exception:  # LLaMA-Factory not importable here: the requirement is stated without its range
        return None
    return ranges[0] if ranges else None


def _installed(ctx: Context, name: str) -> tuple[bool | None, str | None]:
    """(installed?, version) from the snapshot's packages, else from the installed distributions."""
    packages = ctx.snapshot.packages
    if name in packages:
        version = packages[name]
        return version is not None, version
    if ctx.installed is not None:
        return name in ctx.installed, None
    return None, None


def _arch_findings(backend: str, ctx: Context, why: str, *, code: str) -> list[Finding]:
    """An error for each visible arch that the catalogue does not list for ``backend``'s ROCm build
    (``vllm_rocm`` / ``sglang_rocm`` in catalogue/archs.json, with their sources)."""
    supported = ctx.catalogue.archs_where(f"{backend}_rocm")
    findings = []
    for arch in _archs(ctx):
        if arch in supported:
            continue
        findings.append(
            Finding(
                code=code,
                level=Level.ERROR,
                key="infer_backend",
                old=backend,
                message=f"infer_backend: {backend}, but {why} ({', '.join(supported)}), not {arch}.",
            )
        )
    return findings


@rule(CHAT)
def vllm_on_rocm(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if _backend(config) != "vllm" or not _on_amd(ctx):
        return unchanged(config, env)
    findings = _arch_findings("vllm", ctx, "vLLM's ROCm build supports these GPUs only", code="VLLM_ARCH_UNSUPPORTED")
    if findings:
        return unchanged(config, env, *findings)
    wheel_py = ".".join(map(str, VLLM_ROCM_WHEEL_PYTHON))
    lf_range = _lf_range("vllm")
    range_note = (
        f" LLaMA-Factory checks {lf_range}: a newer vLLM needs DISABLE_VERSION_CHECK=1 and is untested by it."
        if lf_range
        else ""
    )
    if ctx.planned:
        return unchanged(
            config,
            env,
            Finding(
                code="VLLM_ROCM_REQUIRED",
                key="infer_backend",
                message=f"infer_backend: vllm on the target needs vLLM's ROCm build: its prebuilt ROCm wheels are "
                f"for Python {wheel_py} and bring their own ROCm torch (a plain `pip install vllm` installs the "
                f"CUDA build).{range_note}",
                fix_with={"wheel_py": wheel_py},
            ),
        )
    installed, version = _installed(ctx, "vllm")
    python = _python(ctx)
    if installed is False:
        py_note = (
            f" This Python is {ctx.snapshot.python}: pip finds no ROCm wheel for it and installs the CUDA build."
            if python and python != VLLM_ROCM_WHEEL_PYTHON
            else ""
        )
        findings.append(
            Finding(
                code="VLLM_NOT_INSTALLED",
                key="infer_backend",
                message=f"infer_backend: vllm, but vLLM is not installed.{py_note}",
                fix_with={"wheel_py": wheel_py},
            )
        )
    elif installed and (ctx.snapshot.torch.kind != "rocm" or (version and "rocm" not in version.lower())):
        what = f"vLLM {version}" if version else "vLLM"
        cause = (
            f"torch is a {ctx.snapshot.torch.kind.upper()} build ({ctx.snapshot.torch.version})"
            if ctx.snapshot.torch.kind != "rocm"
            else f"{what} is not a ROCm build (ROCm builds carry +rocm in their version)"
        )
        findings.append(
            Finding(
                code="VLLM_NOT_ROCM",
                key="infer_backend",
                old=version,
                message=f"infer_backend: vllm on an AMD GPU, but {cause}: the CUDA wheel of vLLM (and the torch it "
                "brings) cannot use the GPU.",
                fix_with={"wheel_py": wheel_py},
            )
        )
    return unchanged(config, env, *findings)


@rule(CHAT)
def sglang_on_rocm(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if _backend(config) != "sglang" or not _on_amd(ctx):
        return unchanged(config, env)
    findings = _arch_findings(
        "sglang", ctx, "SGLang's ROCm builds target these GPUs only", code="SGLANG_ARCH_UNSUPPORTED"
    )
    if findings or not ctx.planned:  # here, a missing SGLang is LLaMA-Factory's own refusal (check_version)
        return unchanged(config, env, *findings)
    lf_range = _lf_range("sglang")
    return unchanged(
        config,
        env,
        Finding(
            code="SGLANG_ROCM_REQUIRED",
            key="infer_backend",
            message="infer_backend: sglang on the target needs SGLang's ROCm build (sglang[srt_hip] or AMD's SGLang "
            f"container){f'; LLaMA-Factory checks {lf_range}' if lf_range else ''}.",
        ),
    )


def _max_lora_rank(config: Mapping[str, Any]) -> int | None:
    if "vllm_max_lora_rank" in config:
        try:
            return int(config["vllm_max_lora_rank"])
        except (TypeError, ValueError):  # LLaMA-Factory's parser refuses it, naming the key
            return None
    from ..lf.commands import lf_field_default

    return int(lf_field_default("vllm_max_lora_rank"))


@rule(CHAT)
def vllm_lora_rank(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    """LLaMA-Factory passes ``vllm_max_lora_rank`` to vLLM as ``max_lora_rank`` (chat/vllm_engine.py);
    vLLM refuses an adapter whose rank is above it ("LoRA rank 64 is greater than max_lora_rank 32")."""
    if _backend(config) != "vllm":
        return unchanged(config, env)
    paths = adapter_paths(config)
    if not paths:
        return unchanged(config, env)
    cap = _max_lora_rank(config)
    if cap is None:
        return unchanged(config, env)
    findings = []
    for path in paths:
        adapter = read_adapter_config(path)
        try:
            rank = int(adapter["r"]) if adapter and adapter.get("r") is not None else None
        except (TypeError, ValueError):
            rank = None
        if rank is None or rank <= cap:
            continue
        fitting = next((r for r in VLLM_LORA_RANKS if r >= rank), rank)
        set_or_default = "is" if "vllm_max_lora_rank" in config else "defaults to"
        findings.append(
            Finding(
                code="VLLM_LORA_RANK_TOO_SMALL",
                key="vllm_max_lora_rank",
                old=cap,
                new=fitting,
                message=f"The adapter {path} has rank r={rank} (its adapter_config.json) but vllm_max_lora_rank "
                f"{set_or_default} {cap}: vLLM refuses to load it ('LoRA rank {rank} is greater than max_lora_rank "
                f"{cap}').",
                fix_with={"fitting": fitting, "ranks": ", ".join(map(str, VLLM_LORA_RANKS))},
            )
        )
    return unchanged(config, env, *findings)


@rule(CHAT, EVAL)
def infer_bf16_emulated(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    """``infer_dtype: bfloat16`` where the card has no bf16 matrix units: every matmul is emulated."""
    if str(lf_value(config, "infer_dtype", "auto")).lower() != "bfloat16" or not ctx.rocm:
        return unchanged(config, env)
    slow = [arch for arch, info in ctx.arch_infos() if info is not None and not info.bf16_matrix]
    if not slow:
        return unchanged(config, env)
    return unchanged(
        config,
        env,
        Finding(
            code="INFER_BF16_EMULATED",
            key="infer_dtype",
            old="bfloat16",
            new="float16",
            message=f"infer_dtype: bfloat16 on {', '.join(slow)}, which has no bf16 matrix units: it runs (torch "
            "reports bf16 as supported on every ROCm GPU), but without them, slower than float16.",
        ),
    )


__all__ = [
    "VLLM_LORA_RANKS",
    "infer_bf16_emulated",
    "sglang_on_rocm",
    "vllm_lora_rank",
    "vllm_on_rocm",
]
