"""Keys that need a package LLaMA-Factory imports only when the run reaches them.

Which packages a config needs is LLaMA-Factory's own answer: its ``_check_extra_dependencies``
(hparams/parser.py) run on the config with its ``check_version`` calls recorded (``lf.commands.
extra_requirements``), plus bitsandbytes where ``configure_quantization`` loads it. LLaMA-Factory checks
the first in ``get_train_args`` and the second only at model load, after minutes of preprocessing. On
this machine a missing one is an error; when planning for another machine (where LLaMA-Factory's own
check is the target's to answer) it is a stated requirement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from ..findings import Finding
from ..lf.commands import CHAT, EVAL, EXPORT, TRAIN
from .base import Context, Step, env_enabled, lf_value, rule, unchanged

# What each key does with its package, for the message; the requirement itself is LLaMA-Factory's.
_WHY: dict[str, str] = {
    "deepspeed": "deepspeed: runs DeepSpeed (ROCm: build it against your ROCm torch)",
    "plot_loss": "plot_loss draws the loss curve with matplotlib",
    "use_unsloth": "use_unsloth loads the model through unsloth",
    "enable_liger_kernel": "enable_liger_kernel patches the model with liger-kernel",
    "use_galore": "use_galore uses the GaLore optimizer",
    "use_apollo": "use_apollo uses the APOLLO optimizer",
    "use_badam": "use_badam uses the BAdam optimizer",
    "use_adam_mini": "use_adam_mini uses the Adam-mini optimizer",
    "use_swanlab": "use_swanlab logs to SwanLab",
    "use_kt": "use_kt runs the model through KTransformers",
    "mixture_of_depths": "mixture_of_depths converts or loads a Mixture-of-Depths model",
    "quantization_bit": "quantization_bit loads the model in 4/8 bit with bitsandbytes (ROCm wheels from 0.49)",
}
# Said by their own rules, with the versions each needs: rules/serving.py, rules/predict.py.
_ELSEWHERE = frozenset({"infer_backend", "predict_with_generate"})
# What `pip install NAME` also installs, for a package whose requirements reach torch or a package LLaMA-Factory's
# start-up pins: its wheels' Requires-Dist (pip download --no-deps unsloth unsloth_zoo: 2026.10.9, read
# 2026-12-07; unsloth_zoo's are the same pins). The fix of such a package is its key turned off, never the install.
_PULLS: dict[str, tuple[str, ...]] = {
    "unsloth": (
        "unsloth_zoo>=2026.10.9",
        "torch<2.15.0,>=2.4.0",
        "torchvision",
        "xformers>=0.0.27.post2",
        "triton>=3.0.0",
        "bitsandbytes!=0.46.0,!=0.48.0,>=0.45.5",
        "datasets!=4.0.*,!=4.1.0,!=4.4.*,!=4.5.0,<5.0.0,>=3.4.1",
        "transformers!=4.53.0,!=4.54.0,!=4.55.0,!=4.55.1,!=4.57.0,!=4.57.4,!=4.57.5,!=5.0.0,!=5.1.0,<=5.17.0,>=4.52.4",
        "trl!=0.19.0,<=1.15.0,>=0.18.2",
        "peft!=0.11.0,>=0.18.0",
        "accelerate>=0.34.1",
    ),
}
# Built against one torch: pip's wheels of these are its index's builds (CUDA's), and each pins or replaces the
# torch installed (on ROCm: the ROCm torch).
_TORCH_BUILT = frozenset({"torch", "torchvision", "torchaudio", "xformers", "triton"})


@dataclass(frozen=True)
class Need:
    key: str
    requirement: str  # as LLaMA-Factory writes it: "badam>=1.2.1"
    distribution: str
    why: str


def quantizes_with_bitsandbytes(config: Mapping[str, Any], model_config: Mapping[str, Any] | None) -> bool:
    """Whether LLaMA-Factory quantizes the model on the fly with bitsandbytes. Mirrors 0.9.5
    ``model/model_utils/quantization.py`` ``configure_quantization`` (pinned by
    tests/test_rules_values_packages.py): a model whose config.json has a ``quantization_config`` (a
    PTQ model) ignores ``quantization_bit``; otherwise bitsandbytes runs when ``quantization_method`` is
    exactly ``QuantizationMethod.BNB`` ("bnb", the field's default)."""
    if config.get("quantization_bit") in (None, "", "null", False):
        return False
    if model_config is not None and model_config.get("quantization_config"):
        return False
    return lf_value(config, "quantization_method", "bnb") == "bnb"


def required_packages(config: Mapping[str, Any], model_config: Mapping[str, Any] | None = None) -> list[Need]:
    """Every package LLaMA-Factory requires for this config, with the key that asks for it."""
    from ..lf.commands import extra_requirements

    needs = []
    for key, requirement, mandatory in extra_requirements(config):
        if not mandatory or key in _ELSEWHERE:
            continue
        name = requirement_name(requirement)
        needs.append(Need(key, requirement, name, _WHY.get(key, f"{key} needs {requirement}")))
    if quantizes_with_bitsandbytes(config, model_config):
        needs.append(Need("quantization_bit", "bitsandbytes", "bitsandbytes", _WHY["quantization_bit"]))
    return needs


def requirement_name(requirement: str) -> str:
    """The distribution a requirement names ("deepspeed>=0.9.3" -> "deepspeed"); the text itself where it is not
    a requirement."""
    try:
        return Requirement(requirement).name
    except InvalidRequirement:
        return requirement


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-")


def missing_packages(
    config: Mapping[str, Any],
    installed: frozenset[str],
    versions: Mapping[str, str | None] | None = None,
    model_config: Mapping[str, Any] | None = None,
) -> list[tuple[Need, str | None]]:
    """The needs not met here, each with the version installed (None: absent, or its version not read):
    the distribution absent, or (its version known) outside the requirement."""
    versions = {_normalise(k): v for k, v in (versions or {}).items()}
    missing: list[tuple[Need, str | None]] = []
    for need in required_packages(config, model_config):
        name = _normalise(need.distribution)
        if name not in installed:
            missing.append((need, None))
            continue
        have = versions.get(name)
        try:
            specifier = Requirement(need.requirement).specifier
        except InvalidRequirement:
            continue
        if have and specifier and not specifier.contains(have, prereleases=True):
            missing.append((need, have))
    return missing


def environment_needs(env: Mapping[str, str], installed: frozenset[str]) -> list[tuple[Need, str | None]]:
    """What a switch in the environment needs: USE_RAY=1 sends run_exp to Ray (train/tuner.py), whose module
    imports ray only where extras/packages.py ``is_ray_available()`` (``_is_package_available("ray")``) says
    so; without it the run stops at ``ray.is_initialized()`` with "NameError: name 'ray' is not defined",
    before any parser (tests/test_rank_view.py, ray_without_ray)."""
    if env_enabled(env, "USE_RAY") and "ray" not in installed:
        why = "USE_RAY=1 trains through LLaMA-Factory's Ray launcher, which imports ray"
        return [(Need("USE_RAY", "ray", "ray", why), None)]
    return []


def install_harm(distribution: str, versions: Mapping[str, str | None]) -> str | None:
    """What ``pip install DISTRIBUTION`` would break, from its recorded requirements (``_PULLS``): the packages
    built against one torch that it pulls, and each package LLaMA-Factory's start-up pins (extras/misc.py
    check_dependencies) whose installed version it asks pip to move; None for a package without such pulls."""
    from ..lf.stages import own_requirements

    pulls = _PULLS.get(_normalise(distribution))
    if not pulls:
        return None
    versions = {_normalise(k): v for k, v in versions.items()}
    pins = {_normalise(requirement_name(r)): r for r in own_requirements()}
    built = [requirement_name(r) for r in pulls if _normalise(requirement_name(r)) in _TORCH_BUILT]
    said = [f"{', '.join(built)} from pip's index, whose builds are CUDA's (on ROCm they replace the ROCm torch)"]
    for requirement in pulls:
        name = _normalise(requirement_name(requirement))
        have = versions.get(name)
        if name in pins and have and not Requirement(requirement).specifier.contains(have, prereleases=True):
            said.append(
                f"a {name} other than the {have} installed (it asks {requirement}), which LLaMA-Factory's start-up "
                f"refuses outside {pins[name]}"
            )
    return "; ".join(said)


def _checked_elsewhere(key: str, ctx: Context) -> bool:
    # On ROCm, kernels.bitsandbytes_for_qlora checks the version each arch needs.
    return key == "quantization_bit" and ctx.rocm


@rule(TRAIN, EXPORT, CHAT, EVAL)
def require_packages(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    if ctx.installed is None:
        return unchanged(config, env)
    findings = []
    missing = missing_packages(config, ctx.installed, ctx.snapshot.packages, ctx.model_config)
    for need, have in [*missing, *environment_needs(env, ctx.installed)]:
        if _checked_elsewhere(need.key, ctx):
            continue
        here = f"{need.distribution} {have} is installed" if have else f"{need.distribution} is not installed"
        wanted = need.requirement
        if ctx.planned:
            findings.append(
                Finding(
                    code="PACKAGE_REQUIRED",
                    key=need.key,
                    message=f"{need.why} ({wanted}); {here} here"
                    + ("." if _normalise(need.distribution) in _PULLS else ", so install it on the target machine."),
                    # the target's versions are not known here: only the torch builds it pulls are said
                    **_install_or_not(need, wanted, {}),
                )
            )
        else:
            findings.append(
                Finding(
                    code="PACKAGE_MISSING",
                    key=need.key,
                    message=f"{need.why} ({wanted}), but {here}.",
                    new=need.distribution,  # the package to install (check/rank.py folds the parser's refusal)
                    # the need comes from the key (required_packages); an environment switch is no key
                    remedy={need.key: None} if need.key in config else None,
                    **_install_or_not(need, wanted, {**_pinned_versions_here(), **ctx.snapshot.packages}),
                )
            )
    return unchanged(config, env, *findings)


def _pinned_versions_here() -> dict[str, str | None]:
    """The installed versions of what LLaMA-Factory's start-up pins (the snapshot records a few packages only;
    PACKAGE_MISSING is said for this machine, never when planning for another)."""
    from importlib import metadata

    from ..lf.stages import own_requirements

    found: dict[str, str | None] = {}
    for requirement in own_requirements():
        name = requirement_name(requirement)
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _install_or_not(need: Need, wanted: str, versions: Mapping[str, str | None]) -> dict[str, Any]:
    """The fix's case: the install, or (a package whose install replaces torch or moves a version LLaMA-Factory
    pins) the key turned off, the install only with --no-deps and the reason."""
    harm = install_harm(need.distribution, versions)
    if harm is None:
        return {"fix_as": "install", "fix_with": {"wanted": wanted, "key": need.key}}
    companions = " ".join(requirement_name(r) for r in _PULLS[_normalise(need.distribution)] if "zoo" in r)
    no_deps = " ".join(filter(None, (need.distribution, companions)))
    return {"fix_as": "install replaces torch", "fix_with": {"key": need.key, "harm": harm, "no_deps": no_deps}}
