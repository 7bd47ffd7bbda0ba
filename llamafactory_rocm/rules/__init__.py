"""The rule chains: every rule module in the order its rules run (``MODULES``), and ``resolve`` to run them.

A rule declares its chains where it is written (``@rule``, rules/base.py); ``chain_rules`` lists a chain's
rules. Order matters only where one rule's output is another's input: blog-style keys are translated
before unknown keys are refused and before the precision rules read ``fp16``/``bf16``. Which command runs
which chain: docs/architecture.md#add-a-rule-one-function-and-one-json-entry (``predict_with_generate`` is a
training key, so the prediction rules are in ``TRAIN``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..findings import Finding, Level, has_errors
from ..lf.commands import PLAN, TRAIN, Chain
from . import (
    adapter,
    blog_keys,
    environment,
    kernels,
    memory_fit,
    multi_gpu,
    outputs,
    packages,
    precision,
    predict,
    rocm_arch_env,
    serving,
    target,
    torch_build,
    values,
    visibility,
    world,
)
from . import export as export_rules
from .base import RULE_CHAINS, Config, Context, Env, OnlyWhere, Rule, Step, Target, rule

# The rule modules in the order their rules run, in every chain.
MODULES: tuple[ModuleType, ...] = (
    blog_keys,
    values,
    export_rules,
    target,
    torch_build,
    visibility,
    environment,
    rocm_arch_env,
    precision,
    kernels,
    packages,
    outputs,
    multi_gpu,
    world,
    memory_fit,
    predict,
    serving,
    adapter,
)

_GATED: dict[tuple[int, Rule], Rule] = {}  # one gated function a rule and gate: a chain's rules stay the same objects


def _in_chain(function: Rule, chain: Chain) -> Rule | None:
    """``function`` as ``chain`` runs it (gated where it joined it ``OnlyWhere``), None where it is not in it."""
    for declared in getattr(function, RULE_CHAINS, ()):
        if declared is chain:
            return function
        if isinstance(declared, OnlyWhere) and declared.chain is chain:
            return _GATED.setdefault((id(declared), function), declared.gated(function))
    return None


def chain_rules(chain: Chain | None) -> tuple[Rule, ...]:
    """The rules that declared themselves in ``chain``, in run order (``MODULES``, then as written)."""
    found = []
    for module in MODULES:
        for function in list(vars(module).values()):
            if callable(function) and getattr(function, "__module__", None) == module.__name__:
                member = _in_chain(function, chain)
                if member is not None:
                    found.append(member)
    return tuple(found)


def module_rules(module: ModuleType, chain: Chain) -> tuple[Rule, ...]:
    """The rules ``module`` declared in ``chain``, as written (``serving``'s in ``CHAT``: the chat rules)."""
    return tuple(r for r in chain_rules(chain) if getattr(r, "__module__", None) == module.__name__)


TRAIN_RULES: tuple[Rule, ...] = chain_rules(TRAIN)
PLAN_RULES: tuple[Rule, ...] = chain_rules(PLAN)
# Training in one pass, its plan last (``resolve``'s default, for callers without a dry run).
RULES: tuple[Rule, ...] = (*TRAIN_RULES, *PLAN_RULES)


@dataclass(frozen=True)
class Resolution:
    config: Config
    env: Env  # the relevant environment after the rules (only keys the rules look at)
    env_changes: dict[str, str]
    findings: list[Finding]

    @property
    def ok(self) -> bool:
        return not has_errors(self.findings)


def resolve(
    config: Mapping[str, Any],
    env: Mapping[str, str],
    ctx: Context,
    rules: tuple[Rule, ...] | None = None,
    accept: frozenset[str] = frozenset(),
) -> Resolution:
    """Run ``rules`` (default: ``RULES``, the training chain) over (config, env); pure: the inputs are not
    modified. ``chain_rules(entry.rules)`` gives the chain of another command; ``accept``: the error codes
    the user accepts knowingly (``accept_findings``)."""
    state = Step(dict(config), dict(env))
    findings: list[Finding] = list(ctx.extra_findings)
    for each in RULES if rules is None else rules:
        state = each(state.config, state.env, ctx)
        findings.extend(state.findings)
    changes = {k: v for k, v in state.env.items() if env.get(k) != v}
    return Resolution(state.config, state.env, changes, accept_findings(findings, accept))


def accept_findings(findings: list[Finding], accepted: frozenset[str]) -> list[Finding]:
    """Errors the user accepted knowingly become warnings, marked as accepted (shown and recorded)."""
    out = []
    for finding in findings:
        if finding.code in accepted and finding.level is Level.ERROR:
            finding = finding.model_copy(update={"level": Level.WARNING, "message": f"(accepted) {finding.message}"})
        out.append(finding)
    taken = sorted({f.code for f in findings if f.code in accepted})
    if taken:
        out.append(
            Finding(
                code="FINDING_ACCEPTED",
                # not the entry's info: the run goes ahead past an error the user accepted, which a warning says
                level=Level.WARNING,
                new=taken,
                message=f"Accepted knowingly: {', '.join(taken)}; the run goes ahead despite them.",
            )
        )
    return out


__all__ = [
    "MODULES",
    "PLAN_RULES",
    "RULES",
    "TRAIN_RULES",
    "Context",
    "Resolution",
    "Target",
    "accept_findings",
    "chain_rules",
    "module_rules",
    "resolve",
    "rule",
]
