"""Read a LLaMA-Factory config the way ``llamafactory-cli train`` does: its own ``read_args`` reads a
YAML/JSON file with what follows it (OmegaConf ``key=value`` overrides, no interpolation resolved), and
the plain ``--key value`` list goes to its HfArgumentParser (``lf/schema.py`` ``flags_to_config``).
Every input it cannot read becomes one line naming the file (``UsageError``), never a traceback."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from ..errors import UsageError, one_line
from ..lf.patching import Patches

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


def _read_args(tokens: list[str]) -> Any:
    """LLaMA-Factory's own ``read_args`` on ``llamafactory-cli train <tokens>`` (its launcher pops
    ``train``, so ``sys.argv`` is then ``["llamafactory-cli", *tokens]``)."""
    from ..lf.library import read_args

    with Patches() as patches:
        patches.setattr(sys, "argv", ["llamafactory-cli", *tokens])
        return read_args()


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        # yaml's first line is the context ("while constructing a mapping"); the problem and its mark
        # name what is wrong and where ("found duplicate key stage", line 3)
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{exc.problem}{where}"
    if isinstance(exc, RecursionError):
        return "it is nested deeper than Python's recursion limit"
    return one_line(exc, first_line=True)


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """``path`` and what follows it on the command line, as LLaMA-Factory's ``read_args`` reads them."""
    path = Path(path)
    if not path.is_file():
        hint = "it is a folder" if path.is_dir() else "no such file"
        raise UsageError(f"cannot read config {path}: {hint}. Try `llamafactory-rocm presets list`.")
    if path.suffix not in CONFIG_SUFFIXES:
        raise UsageError(f"config {path} must end in .yaml, .yml or .json, as llamafactory-cli requires.")
    overrides = list(overrides)
    try:
        data = _read_args([str(path), *overrides])
    except Exception as exc:  # OmegaConf's and yaml's errors, a list YAML, an unreadable file, a file nested
        raise UsageError(_unreadable(path, overrides, exc)) from None  # past the recursion limit: one line
    if not isinstance(data, dict):  # read_args returns a list only when the file is not a config: not here
        raise UsageError(f"config {path} must be a mapping of LLaMA-Factory keys, not a list.")
    if not data:
        raise UsageError(
            f"config {path} is empty: give LLaMA-Factory's keys (model_name_or_path, stage, dataset, ...). "
            "Try `llamafactory-rocm presets list`."
        )
    _refuse_a_scalar(path, data)
    _refuse_words_read_as_keys(path, overrides)
    bad_keys = [key for key in data if not isinstance(key, str)]
    if bad_keys:
        raise UsageError(f"config {path} has a key that is not a name: {bad_keys[0]!r}. Keys are LLaMA-Factory's.")
    return data


def _unreadable(path: Path, overrides: list[str], exc: Exception) -> str:
    first = _first_line(exc)
    if path.suffix == ".json" and isinstance(exc, AttributeError):
        # llamafactory 0.9.5 parser.py read_args: `json.load(Path(sys.argv[1]).absolute())` hands json.load
        # a path; pinned by tests/test_config_io.py::test_a_json_config_is_refused_while_llamafactory_cannot_read_one
        return (
            f"config {path}: this LLaMA-Factory cannot read a .json config ({first}, from its read_args); "
            "write it as YAML."
        )
    if isinstance(exc, RecursionError):
        return f"cannot parse {path}: {first}. Fix the YAML and retry."
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError, RecursionError):
        return f"cannot parse {path}: {first}. Fix the YAML syntax and retry."
    if isinstance(loaded, list):
        return f"config {path} must be a mapping of LLaMA-Factory keys, not a list."
    if overrides:
        return f"cannot apply overrides {' '.join(overrides)} to {path}: {first}."
    return f"cannot read config {path}: {first}."


def _refuse_a_scalar(path: Path, data: dict[str, Any]) -> None:
    """A file holding one value, not a mapping: OmegaConf turns it into a key with no value, which
    LLaMA-Factory then reports as a missing model_name_or_path. Said here in one line (exit 2)."""
    if len(data) != 1 or next(iter(data.values())) is not None:
        return
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError, RecursionError):
        return
    if not isinstance(loaded, (dict, list)) and loaded is not None:
        raise UsageError(
            f"config {path} holds a single value ({str(loaded)[:40]!r}), not a mapping of LLaMA-Factory keys."
        )


def _refuse_words_read_as_keys(path: Path, overrides: list[str]) -> None:
    """What follows the file goes to OmegaConf's ``from_cli`` as ``key=value``: ``--lora_rank 8`` becomes
    the keys ``--lora_rank`` and ``8``, which LLaMA-Factory's parser refuses ("Some keys are not used by the
    HfArgumentParser"). Said here in one line, with the form it reads."""
    words = [word for word in overrides if "=" not in word or word.split("=", 1)[0].startswith("-") or word[0] == "="]
    if not words:
        return
    flags = [word for word in words if word.startswith("-")]
    if flags:
        key, _, value = flags[0].lstrip("-").partition("=")
        at = overrides.index(flags[0])
        if not value and at + 1 < len(overrides) and "=" not in overrides[at + 1]:
            value = overrides[at + 1]
        example = f"`{path} {key}={value or '...'}`"
    else:
        example = f"`{path} {words[0]}=...`"
    raised = [word.split("=", 1)[0] for word in words]
    become = f"{raised[0]!r} becomes a key" if len(raised) == 1 else f"{', '.join(map(repr, raised))} become keys"
    raise UsageError(
        f"{path} {' '.join(overrides)}: llamafactory-cli reads what follows a config file as key=value "
        f"overrides, so {become} and LLaMA-Factory stops with 'Some keys are "
        f"not used by the HfArgumentParser'. Write {example}, or give only --key value flags."
    )


def load_launch_args(tokens: list[str] | tuple[str, ...]) -> tuple[dict[str, Any], str | None]:
    """What ``llamafactory-cli train`` takes, as (config, config path or None): ``cfg.yaml [key=value ...]``
    (read by LLaMA-Factory's ``read_args``) or ``--key value ...`` (read by its parser, ``lf_schema``)."""
    tokens = list(tokens)
    if not tokens:
        raise UsageError(
            "give a config: a YAML/JSON file (`check my.yaml`) or LLaMA-Factory flags "
            "(`check --stage sft --model_name_or_path ...`). Try `llamafactory-rocm presets list`."
        )
    first = tokens[0]
    if not first.startswith("-") and "=" not in first:
        if not first.endswith(CONFIG_SUFFIXES):
            raise UsageError(
                f"{first!r} is not a config file: llamafactory-cli takes a .yaml/.yml/.json file first, "
                "or only --key value flags."
            )
        return load_config(first, tokens[1:]), first
    if not first.startswith("--"):
        raise UsageError(f"{first!r}: give the config file before key=value overrides (`cfg.yaml {first}`).")
    from ..lf.schema import load_schema

    return load_schema().flags_to_config(tokens), None


def dump_yaml(config: dict[str, Any]) -> str:
    return yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
