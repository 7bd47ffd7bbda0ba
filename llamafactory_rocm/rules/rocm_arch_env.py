"""PYTORCH_ROCM_ARCH must list valid targets and cover every visible GPU.

It is read when extensions are JIT-built (DeepSpeed FusedAdam/CPUAdam, custom kernels) by
``torch.utils.cpp_extension._get_rocm_arch_flags``, and split as that function splits it
(``torch_rocm_archs``). Unset (or empty), torch 2.13 builds for the archs of the visible GPUs;
older torch builds for every arch it was built for (docs/rocm-facts.md#p1). Wrong, the extensions
fail at run time with ``HIP error: invalid device function`` (F3).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..findings import Finding, Level
from ..lf.commands import TRAIN
from ..machine.catalogue import TARGET_ID_RE, Catalogue, base_arch
from .base import Context, Step, rule, unchanged
from .kernels import version_tuple

VAR = "PYTORCH_ROCM_ARCH"
# The first torch release whose _get_rocm_arch_flags, with the variable unset or empty, takes the
# visible GPUs' gcnArchName instead of torch._C._cuda_getArchFlags() (docs/rocm-facts.md#p1).
VISIBLE_GPUS_DEFAULT_SINCE = (2, 12)


@dataclass(frozen=True)
class BadTarget:
    text: str
    reason: str
    suggestion: str | None


def torch_rocm_archs(value: str | None) -> list[str] | None:
    """The entries torch makes of PYTORCH_ROCM_ARCH, one ``--offload-arch=<entry>`` each; None where
    torch reads the variable as unset (absent or empty) and takes the visible GPUs' archs.

    torch/utils/cpp_extension.py ``_get_rocm_arch_flags`` (lines 2765-2788 in torch 2.13.0): ``if not _archs:`` (the
    visible cards) ``else: archs = _archs.replace(' ', ';')``, then ``archs.split(';')``. Only a
    space separates besides ';' (a tab does not), and a doubled, leading or trailing separator
    gives an empty entry. Mirrored, not called: it reads os.environ and, unset, initialises the GPUs;
    tests/test_rules_rocm_arch_env.py pins this copy to the real function.
    """
    if not value:
        return None
    return value.replace(" ", ";").split(";")


def parse_rocm_arch(value: str, catalogue: Catalogue) -> tuple[list[str], list[BadTarget]]:
    """torch's non-empty entries of a set PYTORCH_ROCM_ARCH (``torch_rocm_archs``): (valid targets, bad
    entries). Empty entries are counted by ``empty_entries``."""
    good: list[str] = []
    bad: list[BadTarget] = []
    for item in torch_rocm_archs(value) or []:
        if item == "":
            continue
        match = TARGET_ID_RE.match(item)
        if not match and TARGET_ID_RE.match(item.lower()):
            # torch passes the entry as written, and clang compares processor names exactly
            # (llvm TargetParser parseArchAMDGCN): GFX942 is no target (docs/rocm-facts.md#p1).
            bad.append(BadTarget(item, "target names are lowercase", item.lower()))
        elif not match:
            bad.append(BadTarget(item, "it is not a gfx target", catalogue.nearest_target(item)))
        elif catalogue.arch(match.group(1)) is None:
            bad.append(BadTarget(item, "it is not a known AMD target", catalogue.nearest_target(item)))
        else:
            good.append(item)
    return good, bad


def empty_entries(value: str) -> int:
    """How many empty entries torch makes of the value (a doubled, leading or trailing ';' or space)."""
    return (torch_rocm_archs(value) or []).count("")


def default_follows_visible_gpus(torch_version: str | None) -> bool:
    """Whether this torch, with PYTORCH_ROCM_ARCH unset, builds for the visible GPUs' archs (P1);
    False for older or unknown versions, which build for every arch torch was built for."""
    if not torch_version:
        return False
    release = version_tuple(torch_version)
    return bool(release) and release[:2] >= VISIBLE_GPUS_DEFAULT_SINCE


def target_features(target: str) -> dict[str, str]:
    """``gfx942:sramecc+:xnack-`` -> ``{"sramecc": "+", "xnack": "-"}``; no suffix: ``{}`` (either)."""
    match = TARGET_ID_RE.match(target.strip().lower())
    if not match or not match.group(2):
        return {}
    return {item[:-1]: item[-1] for item in match.group(2).split(":") if item}


def _feature_conflicts(good: list[str], ctx: Context) -> list[tuple[str, str, str]]:
    """(entry, device arch name, contradicted feature) for entries whose suffix the device cannot load.

    Code built with ``xnack+`` (or ``-``) loads only where the device has the same setting; an entry
    without the suffix loads on either (docs/rocm-facts.md#p2).
    """
    conflicts = []
    for entry in good:
        wanted = target_features(entry)
        for device in ctx.snapshot.devices:
            if device.base_arch != base_arch(entry):
                continue
            have = target_features(device.arch_name)
            clash = [f"{k}{v}" for k, v in wanted.items() if k in have and have[k] != v]
            if clash:
                conflicts.append((entry, device.arch_name, ", ".join(clash)))
                break
    return conflicts


@rule(TRAIN)
def check_pytorch_rocm_arch(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    value = env.get(VAR)
    devices = ctx.snapshot.gpu_base_archs if ctx.rocm else []
    if torch_rocm_archs(value) is None:
        torch_version = ctx.snapshot.torch.version
        if not devices or default_follows_visible_gpus(torch_version):
            # torch itself then builds for the visible GPUs' base archs: this very list (P1).
            return unchanged(config, env)
        built = ctx.snapshot.torch.base_arch_list
        new_env = dict(env)
        new_env[VAR] = ";".join(devices)
        what = "every arch torch was built for" + (f" ({len(built)}: {', '.join(built)})" if built else "")
        since = ".".join(map(str, VISIBLE_GPUS_DEFAULT_SINCE))
        # A plan's torch is not known (version 'planned+rocm'): say what a torch before 2.12 would do.
        known = bool(torch_version) and version_tuple(torch_version or "")[0] > 0
        which = f"torch {torch_version}" if known else f"a torch before {since} (the target's torch is not known here)"
        return Step(
            dict(config),
            new_env,
            [
                Finding(
                    code="ROCM_ARCH_SET",
                    key=VAR,
                    old=value,
                    new=new_env[VAR],
                    message=f"{VAR} was {'empty' if value == '' else 'unset'}, so extensions built at launch "
                    f"(DeepSpeed ops) would compile with {which} for {what}.",
                    fix_with={"VAR": VAR, "arch": new_env[VAR], "since": since},
                )
            ],
        )
    good, bad = parse_rocm_arch(value or "", ctx.catalogue)
    findings = []
    for entry in bad:
        hint = f" Did you mean {entry.suggestion!r}?" if entry.suggestion else ""
        findings.append(
            Finding(
                code="ROCM_ARCH_MALFORMED",
                key=VAR,
                old=value,
                message=f"{VAR}={value!r}: {entry.text!r} is invalid because {entry.reason}.",
                fix_with={"hint": hint},
            )
        )
    empty = empty_entries(value or "")
    if empty:
        # torch passes each on as `--offload-arch=` with nothing after it; what hipcc's clang makes of
        # that was not settled here (docs/rocm-facts.md#p1): said, not refused.
        cleaned = ";".join(item for item in torch_rocm_archs(value) or [] if item)
        findings.append(
            Finding(
                code="ROCM_ARCH_EMPTY_ENTRY",
                key=VAR,
                old=value,
                new=cleaned,
                message=f"{VAR}={value!r} gives torch {empty} empty entr{'y' if empty == 1 else 'ies'} (a doubled, "
                "leading or trailing ';' or space): each becomes an '--offload-arch=' with no target when "
                "extensions are built.",
                fix_as="cleaned" if cleaned else "none_left",
                fix_with={"var": VAR, "cleaned": cleaned},
            )
        )
    findings += _retired(value or "", good, ctx)
    conflicts = _feature_conflicts(good, ctx) if ctx.rocm else []
    if conflicts:
        fixed = [base_arch(t) if any(t == c[0] for c in conflicts) else t for t in good]
        findings.append(
            Finding(
                code="ROCM_ARCH_FEATURE_MISMATCH",
                key=VAR,
                old=value,
                new=";".join(dict.fromkeys(fixed)),
                message="; ".join(
                    f"{VAR} entry {entry} asks for {clash}, but the GPU here is {device}"
                    for entry, device, clash in conflicts
                )
                + ": code built for it does not load there (hipErrorNoBinaryForGpu / invalid device function).",
                fix_with={"VAR": VAR, "archs": ";".join(dict.fromkeys(fixed))},
            )
        )
    covered = {base_arch(t) for t in good}
    missing = [arch for arch in devices if arch not in covered]
    if missing and not bad:
        findings.append(
            Finding(
                code="ROCM_ARCH_MISSES_DEVICE",
                key=VAR,
                old=value,
                new=";".join(dict.fromkeys([*good, *missing])),
                message=f"{VAR}={value} does not include {', '.join(missing)}, the GPU here: "
                "extensions built for it fail with 'HIP error: invalid device function'.",
                fix_with={"VAR": VAR, "devices": ";".join(devices)},
            )
        )
    return unchanged(config, env, *findings)


def _retired(value: str, good: list[str], ctx: Context) -> list[Finding]:
    """gfx940/gfx941: pre-production MI300 targets, removed from LLVM and ROCm 7.0 (docs/rocm-facts.md#p3)."""
    retired = [t for t in good if (info := ctx.catalogue.arch(t)) is not None and info.retired]
    if not retired:
        return []
    hip = ctx.snapshot.torch.hip or ""
    # ROCm 7.0's compilers refuse them; older ones build code no shipping GPU runs.
    refused = bool(hip) and version_tuple(hip) >= (7, 0)
    # Their GPUs are the catalogue's successor target (docs/rocm-facts.md#p3).
    successors = [s for t in retired if (s := _successor(t, ctx.catalogue))]
    kept = [t for t in good if t not in retired] or successors
    return [
        Finding(
            code="ROCM_ARCH_RETIRED",
            level=Level.ERROR if refused else Level.WARNING,
            key=VAR,
            old=value,
            new=";".join(dict.fromkeys(kept)),
            message=f"{VAR}={value} lists {', '.join(retired)}, pre-production MI300 targets removed from LLVM "
            "and ROCm 7.0"
            + (
                f": ROCm {hip}'s compiler refuses them."
                if refused
                else f"; no shipping GPU is one (their GPUs are {', '.join(dict.fromkeys(successors))})."
            ),
            fix_with={"VAR": VAR, "archs": ";".join(dict.fromkeys(kept))},
        )
    ]


def _successor(target: str, catalogue: Catalogue) -> str | None:
    info = catalogue.arch(target)
    return info.successor if info is not None else None
