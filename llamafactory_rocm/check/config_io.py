"""Read a LLaMA-Factory config the way ``llamafactory-cli train`` does: a YAML/JSON file with
``key=value`` overrides, or the plain ``--key value`` list its HfArgumentParser reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..errors import UsageError


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Load ``path`` and merge ``key=value`` overrides with OmegaConf, as LLaMA-Factory's read_args."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = Path(path)
    if not path.is_file():
        hint = "it is a folder" if path.is_dir() else "no such file"
        raise UsageError(f"cannot read config {path}: {hint}. Try `llamafactory-rocm presets list`.")
    if path.suffix not in {".yaml", ".yml", ".json"}:
        raise UsageError(f"config {path} must end in .yaml, .yml or .json, as llamafactory-cli requires.")
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise UsageError(f"override {item!r} is not key=value (e.g. learning_rate=1e-4).")
    try:
        loaded = OmegaConf.load(path)
    except (yaml.YAMLError, OmegaConfBaseException, UnicodeDecodeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"cannot parse {path}: {first}. Fix the YAML syntax and retry.") from None
    if not OmegaConf.is_dict(loaded):
        raise UsageError(f"config {path} must be a mapping of LLaMA-Factory keys, not a list.")
    try:
        merged = OmegaConf.merge(loaded, OmegaConf.from_cli(list(overrides)))
        data = OmegaConf.to_container(merged, resolve=True)
    except (OmegaConfBaseException, ValueError, TypeError, yaml.YAMLError) as exc:  # `a=[1,2`: YAML
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"cannot apply overrides to {path}: {first}.") from None
    bad_keys = [key for key in data if not isinstance(key, str)]  # type: ignore[union-attr]
    if bad_keys:
        raise UsageError(f"config {path} has a key that is not a name: {bad_keys[0]!r}. Keys are LLaMA-Factory's.")
    return data  # type: ignore[return-value]


CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


def load_launch_args(tokens: list[str] | tuple[str, ...]) -> tuple[dict[str, Any], str | None]:
    """What ``llamafactory-cli train`` takes, as (config, config path or None): ``cfg.yaml [key=value ...]``,
    ``--key value ...`` (read by LLaMA-Factory's own parser, ``lf_schema``), or a file then flags."""
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
        rest = tokens[1:]
        flags_at = next((i for i, token in enumerate(rest) if token.startswith("--")), len(rest))
        config = load_config(first, rest[:flags_at])
        if flags_at < len(rest):  # `cfg.yaml key=value --key value`: the flags go last, on top
            from ..lf.schema import load_schema

            config.update(load_schema().flags_to_config(rest[flags_at:]))
        return config, first
    if not first.startswith("--"):
        raise UsageError(f"{first!r}: give the config file before key=value overrides (`cfg.yaml {first}`).")
    from ..lf.schema import load_schema

    return load_schema().flags_to_config(tokens), None


def dump_yaml(config: dict[str, Any]) -> str:
    return yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
