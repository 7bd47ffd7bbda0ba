"""fp16 -> bf16 where bf16 is real; keep fp16 (and say why) where it is not.

fp16 on ROCm overflows to NaN where bf16 converges: gfx90a fp16 MFMA flushes denormals and, with
torch >= 2.7, hipBLASLt skips the fp16 backward workaround (pytorch/pytorch#182952); NaN with fp16 on
7900 XTX (jax-ml/jax#21187). ``torch.cuda.is_bf16_supported()`` is True on every ROCm build, so the
decision comes from the catalogue, not from torch (docs/rocm-facts.md#f4, docs/rocm-facts.md#f5).
On CPU, fp16 is a silent no-op and bf16 needs ``use_cpu: true`` (docs/rocm-facts.md#l4, docs/rocm-facts.md#l5).

fp16 and bf16 both true is refused on every machine (``PRECISION_CONFLICT``): transformers'
``TrainingArguments.__post_init__`` raises "At most one of fp16 and bf16 can be True, but not both".
No rewrite here resolves the pair, so nothing hides it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..findings import Finding
from ..lf.commands import TRAIN
from ..machine.catalogue import Catalogue
from .base import Context, Step, rule, truthy, unchanged


def _bf16_verdict(ctx: Context) -> tuple[str, str]:
    """('real' | 'slow' | 'absent' | 'unknown', why) for the GPUs present."""
    worst, why = "real", ""
    rank = {"real": 0, "slow": 1, "unknown": 2, "absent": 3}
    for arch, info in ctx.arch_infos():
        if info is None:
            verdict, reason = "unknown", f"{arch} is not in the catalogue"
        elif not info.bf16_matrix:
            verdict, reason = "absent", f"{arch} has no bf16 matrix units"
        elif not info.bf16_faster_than_fp16:
            verdict, reason = "slow", f"bf16 runs at about half the fp16 matrix rate on {arch}"
        else:
            verdict, reason = "real", ""
        if rank[verdict] > rank[worst]:
            worst, why = verdict, reason
    return worst, why


def fp16_risk(archs: list[str], catalogue: Catalogue) -> str:
    """The recorded fp16 failure for these archs, from the catalogue's ``fp16_failure`` (docs/rocm-facts.md#f5);
    a silent divergence is named before NaN losses."""
    failures = {arch: info.fp16_failure for arch in archs if (info := catalogue.arch(arch)) is not None}
    silent = [arch for arch, failure in failures.items() if failure == "silent_divergence"]
    if silent:
        return (
            f"diverges silently on {silent[0]} (denormal flush; hipBLASLt skips the fp16 backward fix, pytorch#182952)"
        )
    if "nan" in failures.values():
        return "gives NaN losses on RDNA3 (jax-ml/jax#21187)"
    return "overflows to NaN where the loss scale cannot keep up"


def both_half_precisions(config: Mapping[str, Any]) -> bool:
    """fp16 and bf16 both on: refused as it stands (``one_half_precision``), never rewritten."""
    return truthy(config.get("fp16", False)) and truthy(config.get("bf16", False))


@rule(TRAIN)
def prefer_bf16(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if not truthy(config.get("fp16", False)) or both_half_precisions(config):
        return unchanged(config, env)
    if ctx.cpu_only:
        new = {**config, "fp16": False, "bf16": True, "use_cpu": True}
        return Step(
            new,
            dict(env),
            [
                Finding(
                    code="PRECISION_CPU_FP16",
                    key="fp16",
                    old={"fp16": config.get("fp16"), "bf16": config.get("bf16"), "use_cpu": config.get("use_cpu")},
                    new={"fp16": False, "bf16": True, "use_cpu": True},
                    message="fp16 does nothing on a CPU-only machine (the run is silently fp32).",
                )
            ],
        )
    if not ctx.rocm:
        return unchanged(config, env)
    verdict, why = _bf16_verdict(ctx)
    if verdict == "real":
        new = {**config, "fp16": False, "bf16": True}
        archs = ctx.snapshot.gpu_base_archs
        return Step(
            new,
            dict(env),
            [
                Finding(
                    code="PRECISION_FP16_TO_BF16",
                    key="fp16",
                    old={"fp16": config.get("fp16"), "bf16": config.get("bf16")},
                    new={"fp16": False, "bf16": True},
                    message=f"fp16 training on ROCm {fp16_risk(archs, ctx.catalogue)}, while bf16, which "
                    f"{'/'.join(archs)} runs on its matrix units, converges.",
                )
            ],
        )
    return unchanged(
        config,
        env,
        Finding(
            code="PRECISION_FP16_KEPT",
            key="fp16",
            old=config.get("fp16"),
            message=f"Kept fp16 because {why}; fp16 can overflow to NaN.",
        ),
    )


@rule(TRAIN)
def bf16_on_cpu_needs_use_cpu(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if not (ctx.cpu_only and truthy(config.get("bf16", False)) and not truthy(config.get("use_cpu", False))):
        return unchanged(config, env)
    if both_half_precisions(config):
        return unchanged(config, env)
    return Step(
        {**config, "use_cpu": True},
        dict(env),
        [
            Finding(
                code="PRECISION_CPU_USE_CPU",
                key="use_cpu",
                old=config.get("use_cpu"),
                new=True,
                message="bf16 without use_cpu fails on a CPU-only machine ('Your setup doesn't support bf16/gpu').",
            )
        ],
    )


@rule(TRAIN)
def warn_bf16_without_matrix_units(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if not (ctx.rocm and truthy(config.get("bf16", False))):
        return unchanged(config, env)
    verdict, why = _bf16_verdict(ctx)
    if verdict == "real":
        return unchanged(config, env)
    return unchanged(
        config,
        env,
        Finding(
            code="BF16_NOT_NATIVE",
            key="bf16",
            message=f"bf16 is asked for but {why} (torch reports bf16 as supported on every ROCm GPU).",
        ),
    )


@rule(TRAIN)
def pure_bf16_only_where_real(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    """pure_bf16 on a card without bf16 matrix units is refused, not quietly turned into fp32 training."""
    if not (ctx.rocm and truthy(config.get("pure_bf16", False))):
        return unchanged(config, env)
    verdict, why = _bf16_verdict(ctx)
    if verdict in {"real", "slow"}:
        return unchanged(config, env)
    return unchanged(
        config,
        env,
        Finding(
            code="PURE_BF16_UNSUPPORTED",
            key="pure_bf16",
            old=config.get("pure_bf16"),
            message=f"pure_bf16 keeps every weight and gradient in bf16, but {why}: torch would emulate it "
            "(it reports bf16 on every ROCm GPU), slowly and without the matrix units' accuracy.",
        ),
    )


@rule(TRAIN)
def one_half_precision(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    """fp16 and bf16 both on: transformers refuses it on every machine; say which to keep."""
    if not both_half_precisions(config):
        return unchanged(config, env)
    if ctx.cpu_only:
        keep, drop, reason = "bf16", "fp16", "fp16 does nothing on a CPU; bf16 with use_cpu: true runs"
    else:
        verdict, why = _bf16_verdict(ctx) if ctx.rocm else ("real", "")
        keep, drop = ("bf16", "fp16") if verdict in {"real", "slow"} else ("fp16", "bf16")
        reason = why or f"{keep} is the one this machine runs well"
    return unchanged(
        config,
        env,
        Finding(
            code="PRECISION_CONFLICT",
            key=drop,
            old={"fp16": config.get("fp16"), "bf16": config.get("bf16")},
            message="fp16 and bf16 are both true; transformers refuses that on every machine "
            "('At most one of fp16 and bf16 can be True, but not both').",
            fix_with={"drop": drop, "keep": keep, "reason": reason},
        ),
    )
