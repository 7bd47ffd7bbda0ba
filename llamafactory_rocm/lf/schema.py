"""LLaMA-Factory's own argument schema: the keys, the value types and the flag form, from its parser.

Everything here asks the ``HfArgumentParser`` that ``get_train_args`` builds over the installed
LLaMA-Factory's (and transformers') argument dataclasses, so the key set and the conversions are
those of the release that will train, including keys that only some transformers versions have
(``ddp_static_graph``). The shipped key list (``lf_keys``) is used only when LLaMA-Factory cannot
be imported; then values are not checked.
"""

from __future__ import annotations

import argparse
import difflib
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import UsageError, one_line
from .patching import Patches


@dataclass(frozen=True)
class ValueProblem:
    key: str
    value: Any
    expected: str
    works: str = ""  # ", such as 8 (LLaMA-Factory's default)": a value the field takes, for the fix


@dataclass(frozen=True)
class NotFinite:
    """``.inf``, ``-.inf`` or ``.nan`` in a float field: a float, so ``parse_dict`` and the field take it as
    it is, and the trainer computes with it (``learning_rate: .inf``) or refuses it where it is used (torch's
    AdamW: "Invalid learning rate: nan"; transformers' ``get_warmup_steps``: ``int(inf)``)."""

    key: str
    value: float
    works: str


@dataclass(frozen=True)
class Coercion:
    """A value of another type than its field's that has one lossless meaning in it (``"5e-5"`` for a
    float): LLaMA-Factory's ``parse_dict`` would hand it to the trainer unconverted."""

    key: str
    value: Any
    new: Any
    expected: str


@dataclass(frozen=True)
class NotAChoice:
    """A YAML value outside its field's choices (a ``Literal`` or an enum). ``parse_dict`` checks no
    choices: LLaMA-Factory's own ``__post_init__`` checks, transformers' enums or the trainer decide, and
    many such values train (``pref_loss: hinge2``, a GaLore choice without GaLore); on the command line
    argparse refuses them (``_parse_given``)."""

    key: str
    value: Any
    expected: str


@dataclass(frozen=True)
class Schema:
    keys: frozenset[str]
    source: str  # what the keys were read from, for the report
    parser: Any = None  # transformers.HfArgumentParser over LLaMA-Factory's _TRAIN_ARGS, or None
    templates: frozenset[str] = frozenset()  # LLaMA-Factory's registered chat templates (TEMPLATES)

    def value_problems(self, config: Mapping[str, Any]) -> list[ValueProblem]:
        """Each value that has no meaning in its field's type (nor is one of its choices)."""
        return [found for found in self._judge_values(config) if isinstance(found, ValueProblem)]

    def value_coercions(self, config: Mapping[str, Any]) -> list[Coercion]:
        """Each value of another type that converts losslessly to its field's: ``"1024"``, ``2.0``."""
        return [found for found in self._judge_values(config) if isinstance(found, Coercion)]

    def values_not_choices(self, config: Mapping[str, Any]) -> list[NotAChoice]:
        """Each value outside its field's choices, which LLaMA-Factory's YAML path does not check itself."""
        return [found for found in self._judge_values(config) if isinstance(found, NotAChoice)]

    def nonfinite_values(self, config: Mapping[str, Any]) -> list[NotFinite]:
        """Each float field given a value that is not a finite number (YAML's ``.inf``, ``-.inf``, ``.nan``).
        A whole-number field refuses it as not a whole number (``value_problems``), as ``int("inf")`` does
        on the command line."""
        if self.parser is None:
            return []
        found = []
        for key, value in config.items():
            action = self.parser._option_string_actions.get(f"--{key}")
            if action is None or action.type is not float or isinstance(value, bool):
                continue
            if isinstance(value, float) and not math.isfinite(value):
                found.append(NotFinite(key, value, _works(action)))
        return found

    def unconverted_values(self, config: Mapping[str, Any]) -> list[ValueProblem]:
        """Each value handed on as another type than its string field's (``cache_dir: true``,
        ``optim_args: 7``): ``parse_dict`` converts nothing, and the code that reads the field may
        take it or stop on it. Not judged here: the dry run names these when a launch step stops with a
        type error (``lf/dry_run.py``), since LLaMA-Factory splits lists for some string fields
        (``dataset``, ``lora_target``) and transformers takes a mapping for ``deepspeed``."""
        if self.parser is None:
            return []
        found = []
        for key, value in config.items():
            action = self.parser._option_string_actions.get(f"--{key}")
            if action is None or value is None or isinstance(value, str) or _typed(action):
                continue
            if action.nargs in ("+", "*") and isinstance(value, list) and all(isinstance(v, str) for v in value):
                continue
            found.append(ValueProblem(key, value, "a string"))
        return found

    def _judge_values(self, config: Mapping[str, Any]) -> list[ValueProblem | Coercion | NotAChoice]:
        """Values as LLaMA-Factory receives them from a YAML file: ``HfArgumentParser.parse_dict`` (parser.py
        ``_parse_args``) converts nothing, so a quoted number reaches the optimizer as a string. The declared
        type is the parser's own action type for the field (``int``, ``float``, ``string_to_bool``, choices)."""
        if self.parser is None:
            return []
        found: list[ValueProblem | Coercion | NotAChoice] = []
        template = config.get("template")
        if self.templates and isinstance(template, str) and template not in self.templates:
            # LLaMA-Factory refuses it only after loading the tokenizer: "Template x does not exist."
            near = difflib.get_close_matches(template, sorted(self.templates), n=3) or ["default", "llama3"]
            found.append(ValueProblem("template", template, f"a template LLaMA-Factory has ({', '.join(near)}, ...)"))
        for key, value in config.items():
            action = self.parser._option_string_actions.get(f"--{key}")
            if action is None or value is None:
                continue
            verdict = _judge(action, key, value)
            if verdict is not None:
                found.append(verdict)
        return found

    def flags_to_config(self, argv: Sequence[str]) -> dict[str, Any]:
        """``--key value`` / ``--key`` / ``--no_key`` as LLaMA-Factory's parser reads them, keeping
        only the keys given. Flags it does not know are kept as strings (``--backend pt``) so the
        rules can translate or refuse them with the closest real key."""
        if self.parser is None:
            raise UsageError(
                "the --key value form needs LLaMA-Factory importable here to read it as its parser does; "
                "install it (README) or write the keys into a YAML file."
            )
        return _parse_given(self.parser, list(argv))


# transformers' TrainingArguments.__post_init__ (training_args.py): `if self.output_dir is None:
# self.output_dir = "trainer_output"`; tests/test_rules_target_outputs_multigpu.py pins it.
DEFAULT_OUTPUT_DIR = "trainer_output"


def output_dir_of(config: Mapping[str, Any]) -> str:
    """The folder a run writes to: the config's output_dir, or the one transformers gives it."""
    value = config.get("output_dir")
    return DEFAULT_OUTPUT_DIR if value is None else str(value)


_UNCHANGED = object()


def _judge(action: argparse.Action, key: str, value: Any) -> ValueProblem | Coercion | NotAChoice | None:
    """None when the field takes ``value`` as it is; a Coercion when it has one lossless meaning in the
    field's type; a ValueProblem when it has none; a NotAChoice when it converts but is not a choice."""
    expected = _expected(action)
    items = value if isinstance(value, list) and action.nargs in ("+", "*") else None
    if items is not None:
        if any(not _converts(action, item) for item in items):
            return ValueProblem(key, value, expected)
        return None if all(_is_choice(action, item) for item in items) else NotAChoice(key, value, expected)
    kind = action.type
    if _typed(action):
        new = _lossless(kind, value)
        if new is None:
            return ValueProblem(key, value, expected, _works(action))
        if kind is int and not within_64_bits(value if new is _UNCHANGED else new):
            return ValueProblem(key, value, f"{expected} {HELD}", _works(action))
        return None if new is _UNCHANGED else Coercion(key, value, new, expected)
    if not _converts(action, value):
        return ValueProblem(key, value, expected)
    return None if _is_choice(action, value) else NotAChoice(key, value, expected)


# The whole numbers the code that reads a whole-number field holds: Python's C integers (``sys.maxsize``, the
# stop of ``itertools.islice`` that torch's batch sampler cuts a batch with: "Stop argument for islice() must
# be None or an integer: 0 <= x <= sys.maxsize") and torch's int64 (a tensor's size, the LoRA rank: "Overflow
# when unpacking long long"). HfArgumentParser's ``int`` takes a larger one and ``parse_dict`` hands a YAML
# ``1e30`` on as a float; the code that reads the field stops on either, or the value means nothing a run
# can reach (tests/test_values_huge.py holds every whole-number key to it, the stock run the oracle).
WHOLE_RANGE = (-sys.maxsize - 1, sys.maxsize)
HELD = f"within 64 bits ({WHOLE_RANGE[0]} to {WHOLE_RANGE[1]})"


def within_64_bits(number: int) -> bool:
    """Whether the code that reads a whole-number field holds ``number`` (``WHOLE_RANGE``)."""
    return WHOLE_RANGE[0] <= number <= WHOLE_RANGE[1]


def _typed(action: argparse.Action) -> bool:
    """A number or bool field: ``_judge`` converts or refuses its values; the rest take strings."""
    kind = action.type
    return kind is int or kind is float or getattr(kind, "__name__", "") == "string_to_bool"


def _lossless(kind: Any, value: Any) -> Any:
    """``value`` in the field's type: _UNCHANGED when the trainer takes it as it is, None when it has no
    single meaning there."""
    if kind is float:
        if isinstance(value, int) and not isinstance(value, bool):
            # an int is a float to Python's arithmetic, up to the largest float (10**400: OverflowError)
            return _UNCHANGED if abs(value) <= sys.float_info.max else None
        if isinstance(value, float):
            return _UNCHANGED
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return None
        return None
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return _UNCHANGED
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                try:
                    value = float(value)
                except ValueError:
                    return None
        if isinstance(value, float) and value.is_integer():
            return int(value)  # `max_steps: 2.0` fails in the trainer (range() of a float)
        return None
    # a bool field (transformers' string_to_bool): the trainer tests it for truth, so any string is true
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return _UNCHANGED
    if isinstance(value, str):
        try:
            meant = kind(value)
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            return None
        # "true" is true to the trainer as it is; "false" would be too: that one is rewritten
        return _UNCHANGED if meant else False
    return None


def _converts(action: argparse.Action, value: Any) -> bool:
    """Whether the parser's type function takes the value (its choices are ``_is_choice``'s)."""
    text = value if isinstance(value, str) else _cli_text(value)
    try:
        (action.type or str)(text)
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        return False
    return True


def _is_choice(action: argparse.Action, value: Any) -> bool:
    """argparse's own test (``_check_value`` after ``_get_values``): the converted value in ``choices``."""
    if action.choices is None:
        return True
    text = value if isinstance(value, str) else _cli_text(value)
    return (action.type or str)(text) in action.choices


def _cli_text(value: Any) -> str:
    """How a YAML value reads on the command line: ``True`` -> ``true``, 2 -> ``2``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _works(action: argparse.Action) -> str:
    """A value a number field takes, for a fix: its default in LLaMA-Factory's (or transformers') dataclass,
    which HfArgumentParser makes the action's default; none for other fields."""
    if action.type not in (int, float):
        return ""
    default = action.default
    if default is None:
        return ", or leave it out (LLaMA-Factory's default: none)"
    if isinstance(default, (int, float)) and not isinstance(default, bool) and math.isfinite(default):
        return f", such as {default!r} (LLaMA-Factory's default)"
    return ""


def _expected(action: argparse.Action) -> str:
    kind = action.type
    name = getattr(kind, "__name__", "")
    if action.choices is not None:
        return "one of: " + ", ".join(str(c) for c in action.choices)
    if name == "string_to_bool":
        return "true or false"
    if kind is int:
        return "a whole number"
    if kind is float:
        return "a number"
    return f"a value {name or 'of the right type'}"


class _Refused(Exception):
    pass


def _parse_given(parser: Any, argv: list[str]) -> dict[str, Any]:
    """Run the real parser with every default suppressed, so only the flags given come back, and with
    conversion deferred, so a bad value becomes a finding naming it (``value_problems``), not an exit."""

    def refuse(message: str) -> None:
        raise _Refused(message)

    try:
        with Patches() as patches:
            unset = {"default": argparse.SUPPRESS, "required": False, "type": None, "choices": None}
            for action in parser._actions:
                for name, value in unset.items():
                    patches.setattr(action, name, value)
            patches.setattr(parser, "error", refuse)
            namespace, unknown = parser.parse_known_args(argv)
    except _Refused as exc:
        raise UsageError(f"LLaMA-Factory's parser refuses these flags: {exc}.") from None
    given = {key: _convert(parser, key, value) for key, value in vars(namespace).items() if key != "help"}
    _refuse_non_choices(parser, given)
    given.update(_unknown_flags(unknown))
    return given


def _refuse_non_choices(parser: Any, given: Mapping[str, Any]) -> None:
    """On the command line argparse refuses a value outside a field's choices before anything runs
    (``invalid choice``, exit 2); LLaMA-Factory's flag form goes through it (``parse_args_into_dataclasses``)."""
    for key, value in given.items():
        action = parser._option_string_actions.get(f"--{key}")
        if action is None or action.choices is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            if _converts(action, item) and not _is_choice(action, item):
                try:
                    parser._check_value(action, (action.type or str)(item))  # argparse's own words
                except argparse.ArgumentError as exc:
                    raise UsageError(f"LLaMA-Factory's parser refuses these flags: {exc}.") from None


def _convert(parser: Any, key: str, value: Any) -> Any:
    """The parser's own conversion of a given string (or list of strings); the raw text if it fails."""
    if isinstance(value, list):
        return [_convert(parser, key, item) for item in value]
    action = parser._option_string_actions.get(f"--{key}")
    if not isinstance(value, str) or action is None or action.type is None or not _converts(action, value):
        return value
    return action.type(value)


def _unknown_flags(tokens: list[str]) -> dict[str, Any]:
    """Flags LLaMA-Factory does not have: ``--key value`` -> "value", a bare ``--key`` -> True."""
    import yaml

    found: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or len(token) == 2:
            raise UsageError(
                f"{token!r} is neither a --key nor the value of one. Give a config file first "
                "(`cfg.yaml key=value ...`) or only --key value pairs, as llamafactory-cli does."
            )
        key, eq, value = token[2:].partition("=")
        if not eq:
            has_value = i + 1 < len(tokens) and not tokens[i + 1].startswith("--")
            value = tokens[i + 1] if has_value else "true"
            i += 1 if has_value else 0
        try:
            found[key] = yaml.safe_load(value)
        except yaml.YAMLError:
            found[key] = value
        i += 1
    return found


@lru_cache(maxsize=1)
def load_schema() -> Schema:
    """The installed LLaMA-Factory's train schema (seconds: it imports transformers), or the shipped keys."""
    try:
        from transformers import HfArgumentParser

        from .text_only import text_only_llamafactory

        with text_only_llamafactory():
            from llamafactory.data.template import TEMPLATES
            from llamafactory.hparams import parser as lf_parser

        hf_parser = HfArgumentParser(lf_parser._TRAIN_ARGS)
    except Exception as exc:  # not installed or broken: the shipped list, and say so
        from .keys import shipped_train_keys

        version, keys = shipped_train_keys()
        reason = one_line(exc, first_line=True)
        return Schema(keys, f"shipped key list of llamafactory {version} (LLaMA-Factory not importable: {reason})")
    keys = frozenset(
        action.dest for action in hf_parser._actions if action.dest != "help" and not action.dest.startswith("no_")
    )
    # `--no_x` actions share dest x; every dest is a dataclass field name
    from .keys import installed_llamafactory_version

    return Schema(keys, f"llamafactory {installed_llamafactory_version()}", hf_parser, frozenset(TEMPLATES))


@lru_cache(maxsize=1)
def field_defaults() -> dict[str, Any]:
    """Each train key's default, from the fields of LLaMA-Factory's argument dataclasses (``_TRAIN_ARGS``:
    its own and transformers' ``TrainingArguments``) as ``get_train_args`` builds them."""
    import dataclasses

    from .text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.hparams import parser as lf_parser

    defaults: dict[str, Any] = {}
    for cls in lf_parser._TRAIN_ARGS:
        for field in dataclasses.fields(cls):
            if field.default is not dataclasses.MISSING:
                defaults.setdefault(field.name, field.default)
            elif field.default_factory is not dataclasses.MISSING:
                defaults.setdefault(field.name, field.default_factory())
    return defaults


def field_default(key: str) -> Any:
    """The default LLaMA-Factory gives ``key`` (``field_defaults``), an enum's value (``flash_attn``: "auto")."""
    value = field_defaults()[key]
    return getattr(value, "value", value)


def train_keys() -> frozenset[str]:
    """The keys of the installed LLaMA-Factory's parser, or the shipped list without it."""
    return load_schema().keys
