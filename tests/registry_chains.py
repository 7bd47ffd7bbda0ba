"""A command's chains as its registry entry holds them, for the tests that compare chains by command name
(the check itself hands the entry on: check/run.py runs ``chain_rules(entry.rules)``)."""

from __future__ import annotations

from llamafactory_rocm.lf.commands import checked_entry
from llamafactory_rocm.rules import chain_rules
from llamafactory_rocm.rules.base import Rule


def rules_for(command: str) -> tuple[Rule, ...]:
    """The chain run on ``command``'s config before it is built dry; ValueError for a command check does not take."""
    return chain_rules(checked_entry(command).rules)


def plan_for(command: str) -> tuple[Rule, ...]:
    """The chain run after ``command`` was built dry, on what it found (train's world and memory); () for none."""
    return chain_rules(checked_entry(command).plan)
