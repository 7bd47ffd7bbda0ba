"""Kernel choices that exist on CUDA but not on every ROCm GPU: tf32, flash-attn, SDPA, bitsandbytes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from packaging.version import InvalidVersion, Version

from ..findings import Finding, Level
from ..lf.commands import CHAT, EVAL, TRAIN
from .base import EXPORT_ON_GPU, Context, Step, lf_value, rule, truthy, unchanged
from .packages import quantizes_with_bitsandbytes


def version(text: str) -> Version:
    """A release number as packaging reads it. HIP's own strings (``6.4.43482-0f2d60242``) are not PEP 440:
    their leading dotted number is the release."""
    try:
        return Version(text)
    except InvalidVersion:
        leading = re.match(r"\d+(?:\.\d+)*", text.strip())
        return Version(leading.group(0) if leading else "0")


def version_tuple(text: str) -> tuple[int, ...]:
    """``2.8.0.post2+rocm`` -> (2, 8, 0): the release part of ``version(text)`` (packaging's), for callers
    that compare with a tuple."""
    return version(text).release[:3]


def tf32_available_here(ctx: Context) -> bool:
    """Whether transformers accepts ``tf32: true``: on this machine its own ``is_torch_tf32_available``
    (``TrainingArguments.__post_init__`` raises without it); for a planned or recorded machine, the
    recorded fact that it needs a CUDA build of torch (docs/rocm-facts.md#f6)."""
    if not ctx.planned:
        from transformers.utils import is_torch_tf32_available

        return is_torch_tf32_available()
    return ctx.snapshot.torch.kind == "cuda"


@rule(TRAIN)
def drop_tf32(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if "tf32" not in config or not truthy(config["tf32"]) or tf32_available_here(ctx):
        return unchanged(config, env)
    new = {k: v for k, v in config.items() if k != "tf32"}
    return Step(
        new,
        dict(env),
        [
            Finding(
                code="TF32_DROPPED",
                key="tf32",
                old=config["tf32"],
                message="tf32: true raises 'ValueError: --tf32 requires Ampere or a newer GPU arch' on "
                f"a {ctx.snapshot.torch.kind.upper()} build of torch"
                + ("" if ctx.snapshot.torch.kind != "cuda" else " without an Ampere or newer GPU")
                + "; tf32 is an NVIDIA mode.",
            )
        ],
    )


def flash_attn_gap(ctx: Context, env: Mapping[str, str]) -> str | None:
    """Why the installed flash-attn cannot serve the GPUs here, or None when it can.

    A planned machine's packages are unknown (key absent): judged by the arch alone.
    """
    packages = ctx.snapshot.packages
    installed = packages.get("flash_attn")
    if "flash_attn" in packages and not installed:
        return "flash-attn is not installed"
    triton = env.get("FLASH_ATTENTION_TRITON_AMD_ENABLE", "").upper() == "TRUE"
    for arch, info in ctx.arch_infos():
        if info is None:
            return f"{arch} is not in the catalogue"
        fa = info.flash_attention
        if triton and fa.triton_backend:
            continue
        if fa.ck_min_version is None:
            return f"flash-attn's CK backend has no {arch} kernels in a release (Triton backend: " + (
                "set FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE)" if fa.triton_backend else "none either)"
            )
        if installed and version(installed) < version(fa.ck_min_version):
            return f"flash-attn {installed} has no CK kernels for {arch} (from {fa.ck_min_version})"
    return None


@rule(TRAIN, EXPORT_ON_GPU, CHAT, EVAL)
def flash_attn_where_supported(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if str(config.get("flash_attn", "")).lower() != "fa2":
        return unchanged(config, env)
    if ctx.rocm:
        gap = flash_attn_gap(ctx, env)
    elif ctx.cpu_only:
        gap = "FlashAttention-2 has no CPU kernels"
    else:
        gap = None
    if gap is None:
        return unchanged(config, env)
    return Step(
        {**config, "flash_attn": "sdpa"},
        dict(env),
        [
            Finding(
                code="FLASH_ATTN_TO_SDPA",
                key="flash_attn",
                old=config["flash_attn"],
                new="sdpa",
                message=f"flash_attn: fa2 cannot run here: {gap} (LLaMA-Factory only checks that the package imports).",
                fix_as="rocm" if ctx.rocm else "cpu",
            )
        ],
    )


@rule(TRAIN)
def sdpa_kernel_notice(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    """SDPA on ROCm uses AOTriton kernels only on some archs; elsewhere it falls back to math."""
    if not ctx.rocm or str(lf_value(config, "flash_attn", "auto")).lower() in {"disabled", "fa2", "fa3"}:
        return unchanged(config, env)
    findings = []
    for arch, info in ctx.arch_infos():
        if info is None:
            continue
        if not info.sdpa_aotriton:
            findings.append(
                Finding(
                    code="SDPA_MATH_FALLBACK",
                    key="flash_attn",
                    message=f"SDPA has no AOTriton kernels for {arch}; attention runs the math path, "
                    "which is slower and keeps the full attention matrix in memory.",
                )
            )
        elif info.sdpa_aotriton_experimental and env.get("TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL") != "1":
            findings.append(
                Finding(
                    code="SDPA_EXPERIMENTAL_ARCH",
                    key="TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL",
                    message=f"On some torch versions SDPA's fast kernels for {arch} need "
                    "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1.",
                )
            )
    return unchanged(config, env, *findings)


@rule(TRAIN, EXPORT_ON_GPU, CHAT, EVAL)
def bitsandbytes_for_qlora(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    bits = config.get("quantization_bit")
    if not ctx.rocm or not quantizes_with_bitsandbytes(config, ctx.model_config):
        return unchanged(config, env)
    known = "bitsandbytes" in ctx.snapshot.packages  # a planned machine's packages are unknown
    installed = ctx.snapshot.packages.get("bitsandbytes")
    findings = []
    for arch, info in ctx.arch_infos():
        needed = info.bitsandbytes_min_version if info else None
        if needed is None:
            findings.append(
                Finding(
                    code="QLORA_ARCH_UNSUPPORTED",
                    key="quantization_bit",
                    old=bits,
                    message=f"No bitsandbytes ROCm wheel ships kernels for {arch} "
                    "('Error invalid device function ... ops.hip').",
                    fix_with={"arch": arch},
                )
            )
        elif not known:
            findings.append(
                Finding(
                    code="QLORA_BITSANDBYTES",
                    level=Level.INFO,
                    key="quantization_bit",
                    old=bits,
                    message=f"QLoRA on {arch} needs bitsandbytes >= {needed} on the machine that trains.",
                    fix_as="elsewhere",
                    fix_with={"needed": needed},
                )
            )
        elif not installed or version(installed) < version(needed):
            have = f"bitsandbytes {installed}" if installed else "bitsandbytes is not installed"
            findings.append(
                Finding(
                    code="QLORA_BITSANDBYTES",
                    level=Level.ERROR,
                    key="quantization_bit",
                    old=bits,
                    message=f"QLoRA on {arch} needs bitsandbytes >= {needed} (its first ROCm wheels); {have}.",
                    fix_as="here",
                    fix_with={"needed": needed},
                )
            )
    return unchanged(config, env, *findings)
