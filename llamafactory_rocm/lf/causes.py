"""The cause of a library's refusal, and the change that passes that point.

A refusal is said by the code of the step that raised it (LLAMAFACTORY_REFUSED: LLaMA-Factory's parser;
MODEL_MODULES_REFUSED: its load_model/init_adapter; ...). Which fix answers it is chosen by what was refused:
the library's words (each pattern in lf/causes.json names the file and function that raise them), the key
they name and the config's own values, never by the first keyword or the finetuning_type. A cause carries
the fix's case in its code's registry entry (findings/codes/*.json), the values that template is filled with,
and the remedy: the key changes that pass that point (``tests/test_refusal_fixes.py`` applies each remedy and
runs LLaMA-Factory's stock parser, or the check, again). Words no pattern knows still get a fix that names
the keys of the config the words name, with a value that works where the parser knows one.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

CAUSES_FILE = "causes.json"
# each step of the launch may keep its own patterns beside it: lf/causes_<step>.json, read after causes.json
# (the codes of one file are not repeated in another)
CAUSES_GLOB = re.compile(r"^causes(_[a-z0-9_]+)?\.json$")


@dataclass(frozen=True)
class Pattern:
    code: str
    case: str
    words: re.Pattern[str]
    keys: tuple[str, ...]
    remedy: Mapping[str, Any] | None
    source: str
    command_only: bool = False  # only where the command is not train (the keys of another command)
    values: str | None = None  # the name in COMPUTED of what its fix is filled with beyond the words' groups
    # changes to the tests' tiny training config that make stock LLaMA-Factory say these words (null removes a
    # key): tests/test_refusal_fixes.py runs each, then the remedy, through the stock parser
    triggers: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Cause:
    """What was refused: the fix's case, the values its template is filled with, the key to change and the
    change that passes (None where no key change does: a package to install, an environment variable)."""

    case: str
    values: Mapping[str, Any] = field(default_factory=dict)
    key: str | None = None
    remedy: Mapping[str, Any] | None = None


@lru_cache(maxsize=1)
def patterns() -> dict[str, tuple[Pattern, ...]]:
    raw: dict[str, Any] = {}
    names = sorted(e.name for e in resources.files(__package__).iterdir() if CAUSES_GLOB.match(e.name))
    for name in sorted(names, key=lambda n: n != CAUSES_FILE):
        found = json.loads(resources.files(__package__).joinpath(name).read_text(encoding="utf-8"))
        repeated = (set(found) & set(raw)) - {"about"}
        if repeated:
            raise ValueError(f"lf/{name} repeats the codes {sorted(repeated)} of another causes file")
        raw.update({k: v for k, v in found.items() if k != "about" or "about" not in raw})
    return {
        code: tuple(
            Pattern(
                code=code,
                case=entry["case"],
                words=re.compile(entry["words"]),
                keys=tuple(entry["keys"]),
                remedy=entry["remedy"],
                source=entry["source"],
                command_only=entry.get("command_only", False),
                values=_computed_name(code, entry),
                triggers=tuple(entry.get("triggers", ())),
            )
            for entry in entries
        )
        for code, entries in raw.items()
        if code != "about"
    }


def _computed_name(code: str, entry: Mapping[str, Any]) -> str | None:
    name = entry.get("values")
    if name is not None and name not in COMPUTED:
        raise ValueError(f"{code} {entry['case']!r}: values {name!r} is not in lf/causes.py COMPUTED")
    return name


def cause_of(
    code: str, words: str, config: Mapping[str, Any], *, trains: bool = True, given: Mapping[str, Any] | None = None
) -> Cause:
    """The cause of ``code``'s refusal with the library's ``words``, for ``config``; the "other" case, naming
    the config keys the words name, where no pattern matches. ``given``: template values the caller knows (a
    dataset's name, the command that lists its rows)."""
    for pattern in patterns().get(code, ()):
        if pattern.command_only and trains:
            continue
        match = pattern.words.search(words)
        if match is None:
            continue
        groups = {name: value for name, value in match.groupdict().items() if value is not None}
        values = {**(given or {}), **groups, **_values(pattern, groups, config)}
        if not _fills(code, pattern.case, values):  # the words lacked what its fix names (an Enum's key)
            break
        remedy = _remedy(pattern.remedy, values)
        key = values.get("key") or next(
            (k for k in pattern.keys if k in config), pattern.keys[0] if pattern.keys else None
        )
        if remedy and key is None:
            key = next(iter(remedy))
        return Cause(pattern.case, values, key, remedy)
    return _named_keys(words, config)


def _fills(code: str, case: str, values: Mapping[str, Any]) -> bool:
    from ..findings.registry import fix_text

    try:
        fix_text(code, {"command": "train", **values}, case)
    except KeyError:
        return False
    return True


def _values(pattern: Pattern, groups: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    """The template values of a matched pattern: the groups of its words, and what they imply for the config."""
    values: dict[str, Any] = {}
    requirement = next(
        (groups[g] for g in ("requirement", "requirement2", "requirement3", "requirement4") if g in groups), None
    )
    if requirement is not None:
        values["requirement"] = requirement.strip("`'\".,")
    if "option" in groups:
        option = groups["option"]
        values["option"] = option
        values["option_off"] = None if option == "loraplus_lr_ratio" else False
        if option in ("logging_steps", "eval_steps", "save_steps"):
            values["option_rounded"] = max(1, round(float(config.get(option, 1))))
        if option in ("image", "video"):
            values["max_pixels"] = config.get(f"{option}_min_pixels")
    if "value" in groups:  # an Enum field's value: the key is the one holding it
        key = next((k for k, v in config.items() if str(v) == groups["value"].strip()), None)
        if key is not None:
            values.update(key=key, value=config[key], default=_default(key), choices=_choices(key))
    if "param" in groups:  # torch's optimizer: its parameter name -> the config key that sets it
        key = _OPTIMIZER_KEYS.get(groups["param"].split(" ")[0], "learning_rate")
        if groups.get("index") is not None:
            key = f"adam_beta{int(groups['index']) + 1}"
        values.update(key=key, value=config.get(key), default=_default(key))
        values["value_now"] = f"; now {config[key]!r}" if key in config else ""
    if "module" in groups:
        values.update(module=groups["module"], choices=groups.get("choices", "").strip(" ."))
        extra = str(groups["module"]) in str(config.get("freeze_extra_modules", ""))
        values["freeze_key"] = "freeze_extra_modules" if extra else "freeze_trainable_modules"
        values["key"] = values["freeze_key"]
        values.update(_freeze_modules(values["freeze_key"], str(groups["module"]), values["choices"], config))
    if pattern.values is not None:  # the entry's computed values (lf/causes.json "values": a COMPUTED name)
        values.update(COMPUTED[pattern.values](groups, config))
    present = [key for key in pattern.keys if key in config]
    if present:
        values.setdefault("key", present[0])
    return values


def meant_template(given: str, config: Mapping[str, Any]) -> tuple[str | None, str]:
    """The template meant by an unknown ``template`` name, and why: LLaMA-Factory's own template for the model
    (extras/constants.py DEFAULT_TEMPLATE, by the model folder's name as LLaMA-Factory lists it or its hub id)
    where the name is near it or near no template, else the closest template name; (None, "") where neither is
    known. Never the key removed: without a template the run trains with the tokenizer's chat template, or
    with the "empty" one where the tokenizer has none (data/template.py get_template_and_fix_tokenizer)."""
    from .text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.data.template import TEMPLATES
        from llamafactory.extras.constants import DEFAULT_TEMPLATE, SUPPORTED_MODELS

    by_name = {name.lower(): template for name, template in DEFAULT_TEMPLATE.items()}
    for name, sources in SUPPORTED_MODELS.items():
        for hub_id in sources.values():
            by_name.setdefault(str(hub_id).rsplit("/", 1)[-1].lower(), DEFAULT_TEMPLATE.get(name))
    model = Path(str(config.get("model_name_or_path") or "").rstrip("/\\")).name
    family = by_name.get(model.lower())
    near = difflib.get_close_matches(given, sorted(TEMPLATES), n=3, cutoff=0.6)
    if family and (family in near or not near):
        return family, f"LLaMA-Factory's template for {model}"
    if near:
        return near[0], "the closest name LLaMA-Factory has"
    return None, ""


def _closest(name: str, names: list[str] | tuple[str, ...]) -> str | None:
    """The name meant: the closest spelling among ``names`` (difflib's ratio of at least 0.6), else None."""
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return close[0] if close else None


def _freeze_modules(freeze_key: str, module: str, choices: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The freeze module list with the unknown name replaced by the closest one LLaMA-Factory lists. "all" is a
    name only freeze_trainable_modules takes (model/adapter.py _setup_freeze_tuning expands it there; an extra
    module "all" is refused as "Module all is not found"), so an extra module nothing is close to is dropped."""
    listed = [c.strip() for c in choices.split(",") if c.strip()]
    given = [m.strip() for m in str(config.get(freeze_key, "")).split(",") if m.strip()]
    meant = _closest(module, listed)
    if meant is None and freeze_key == "freeze_trainable_modules":
        meant = "all"
    kept = list(dict.fromkeys(meant if m == module else m for m in given if m != module or meant is not None))
    if meant is not None:
        said = f"Set {freeze_key}: {','.join(kept)} ({module} -> {meant})"
    else:
        said = f"Remove {module} from {freeze_key}" + ("" if kept else " (the key then goes: no extra module)")
    return {"closest_module": ",".join(kept) if kept else None, "freeze_said": said}


def _accelerator_config(groups: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    """accelerator_config without the key transformers' AcceleratorConfig lacks: renamed to the closest field
    it has (``split_batch`` -> ``split_batches``), else dropped; a JSON file's keys are changed in the file."""
    import dataclasses

    from transformers.trainer_pt_utils import AcceleratorConfig

    fields = [f.name for f in dataclasses.fields(AcceleratorConfig)]
    name = groups["name"]
    meant = _closest(name, fields)
    raw = config.get("accelerator_config")
    if isinstance(raw, str) and raw.strip().startswith("{"):
        with contextlib.suppress(ValueError):  # not JSON: said as the file it names
            raw = json.loads(raw)
    values: dict[str, Any] = {"fields": ", ".join(fields)}
    what = f"rename {name} to {meant}" if meant else f"remove {name}"
    if not isinstance(raw, Mapping):  # a JSON file: the change is in the file, not a key of this config
        values["change"] = f"In the file {raw}, {what}."
        return values
    fixed = {(meant if k == name else k): v for k, v in raw.items() if k != name or meant}
    values["accelerator_config_fixed"] = fixed or None
    values["change"] = (
        f"Set accelerator_config: {json.dumps(fixed)} ({what})."
        if fixed
        else (f"Remove accelerator_config ({name} was its only key).")
    )
    return values


def _oft_values(groups: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    """peft's OFTConfig takes r (LLaMA-Factory's oft_rank, default 0) or oft_block_size (default 32), not both:
    the one the config set is kept and the other turned off (0); both set, the rank is kept."""
    only_block = "oft_block_size" in config and not config.get("oft_rank")
    off, kept = ("oft_rank", "oft_block_size") if only_block else ("oft_block_size", "oft_rank")
    return {"oft_off": off, "oft_kept": kept, "key": off}


def _tool_format(groups: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    """The tool format LLaMA-Factory has that is closest to the one given (data/tool_utils.py TOOLS), else none:
    without tool_format the template's own format is used."""
    from .text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.data.tool_utils import TOOLS

    names = sorted(TOOLS)
    meant = _closest(groups["name"], names)
    said = f"Set tool_format: {meant}" if meant else "Remove tool_format (the template's own tool format is used)"
    return {"tool_formats": ", ".join(names), "closest_tool_format": meant, "tool_said": said}


def _mix_strategy(groups: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    """A mix_strategy the installed datasets cannot run (interleave_once asks for the stopping_strategy
    all_exhausted_without_replacement): concat reads every row once, as interleave_once meant, and the trainer
    shuffles the rows; streamed rows are not shuffled across datasets, so there interleave_over keeps them mixed
    (every row of each dataset, the smaller ones read again)."""
    streaming = str(config.get("streaming", "")).lower() in ("true", "1")
    works = "interleave_over" if streaming else "concat"
    why = (
        "every row of each dataset, the smaller ones read again, mixed as they stream"
        if streaming
        else "every row once, as interleave_once meant; the trainer shuffles them"
    )
    return {"mix_strategy": config.get("mix_strategy", ""), "mix_strategy_works": works, "mix_why": why}


def _run_length(groups: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    """The key that makes the run as long as it is: max_steps where it is set above 0 (transformers then ignores
    num_train_epochs), else num_train_epochs; its default is the value that works."""
    try:
        by_steps = float(config.get("max_steps") or -1) > 0
    except (TypeError, ValueError):
        by_steps = False
    key = "max_steps" if by_steps else "num_train_epochs"
    value = config.get(key, _default(key))
    unit = "steps" if by_steps else "epochs"
    length = f"{value:,} {unit}" if isinstance(value, int) else f"{value!r} {unit}"
    return {"key": key, "value": value, "default": _default(key), "length": length}


def _optim_args(groups: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    """optim_args as transformers reads it (_parse_optim_args: spaces dropped, split at commas, each piece
    ``key=value``): a piece written ``key: value`` is rewritten with "=", a piece with no single separator is
    dropped (and said); None (the key removed) where no piece is left."""
    given = str(config.get("optim_args") or "")
    kept, dropped = [], []
    for piece in given.replace(" ", "").split(","):
        if piece.count("=") != 1 and piece.count(":") == 1 and "=" not in piece:
            piece = piece.replace(":", "=")
        (kept if piece.count("=") == 1 and not piece.startswith("=") else dropped).append(piece)
    fixed = ",".join(kept) or None
    said = f"Set optim_args: {fixed}" if fixed else "Remove optim_args"
    if dropped:
        said += f" ({', '.join(repr(p) for p in dropped)} is no key=value pair)"
    return {"optim_args_fixed": fixed, "optim_args_said": said, "key": "optim_args", "value": given}


def _media_values(groups: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    """The dataset whose rows hold the media and the template whose plugin takes none, for the fix."""
    return {"dataset": config.get("dataset", ""), "template": config.get("template", ""), "key": "dataset"}


def _split_values(groups: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    """The datasets the config names, for the fix of a split their files lack."""
    names = [str(config.get(k)) for k in ("dataset", "eval_dataset") if config.get(k)]
    splits = groups.get("splits", "").replace("'", "")
    return {"datasets": ", ".join(names) or "the dataset", "splits": splits, "first_split": splits.split(",")[0]}


def _free_output_dir(groups: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    output_dir = config.get("output_dir")
    return {"output_dir": output_dir, "free_output_dir": free_folder(str(output_dir))} if output_dir else {}


def _val_size_rows(groups: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    return {"val_size_rows": max(1, int(float(config.get("val_size", 0)) * 1000))}  # a whole number of rows


def _save_steps_kept(groups: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    return {"save_steps": config.get("save_steps") or 500}


def _eval_strategy_now(groups: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    return {"eval_strategy": config.get("eval_strategy", "no")}


def _eval_steps_multiple(groups: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    eval_steps = float(config.get("eval_steps") or 1)
    save_steps = float(config.get("save_steps") or eval_steps)
    return {"eval_steps_multiple": _round_multiple(save_steps, eval_steps)}


def _first_template(groups: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    template = config.get("template")
    return {"first_template": template[0] if isinstance(template, list) and template else "llama3"}


def _even_probs(groups: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    names = [n for n in str(config.get("dataset", "")).split(",") if n.strip()]
    return {"even_probs": ",".join([f"{1 / max(len(names), 1):.4g}"] * max(len(names), 1))}


# What a cause's fix is filled with beyond its words' groups, computed from the config: named by the entry's
# "values" in lf/causes.json (a name here, checked when the file is read; tests/test_refusal_fixes.py: each is
# named by an entry).
COMPUTED: dict[str, Callable[[Mapping[str, str], Mapping[str, Any]], dict[str, Any]]] = {
    "split_values": _split_values,
    "media_values": _media_values,
    "optim_args": _optim_args,
    "accelerator_config": _accelerator_config,
    "oft_values": _oft_values,
    "tool_format": _tool_format,
    "mix_strategy": _mix_strategy,
    "run_length": _run_length,
    "free_output_dir": _free_output_dir,
    "val_size_rows": _val_size_rows,
    "save_steps_kept": _save_steps_kept,
    "eval_strategy_now": _eval_strategy_now,
    "eval_steps_multiple": _eval_steps_multiple,
    "reward_model_type": lambda groups, config: {"reward_model_type": _reward_model_type(config)},
    "first_template": _first_template,
    "even_probs": _even_probs,
}


_OPTIMIZER_KEYS = {
    "learning": "learning_rate",
    "weight_decay": "weight_decay",
    "epsilon": "adam_epsilon",
    "momentum": "momentum",
}


def _reward_model_type(config: Mapping[str, Any]) -> str:
    """The reward_model_type a ppo run with this finetuning_type takes: the config's own (lora by default: a LoRA
    rm run's adapter), else full (a whole model's folder), as LLaMA-Factory's FinetuningArguments accepts them
    (its __post_init__ refuses lora for a freeze/full policy)."""
    from .text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.hparams import FinetuningArguments

    given = str(config.get("reward_model_type") or _default("reward_model_type"))
    for candidate in dict.fromkeys((given, "full")):
        try:
            FinetuningArguments(
                stage="ppo",
                finetuning_type=config.get("finetuning_type", _default("finetuning_type")),
                reward_model="<reward model>",
                reward_model_type=candidate,
            )
        except (ValueError, AssertionError, TypeError):  # its refusals: ValueError, and asserts on the method
            continue
        return candidate
    return given  # the finetuning_type itself is refused: its own cause says so


def _round_multiple(save_steps: float, eval_steps: float) -> int | float:
    multiple = max(1, math.ceil(save_steps / eval_steps)) * eval_steps
    return int(multiple) if float(multiple).is_integer() else multiple


def _remedy(template: Mapping[str, Any] | None, values: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pattern's remedy with its ``{name}`` keys and values filled; None where one cannot be filled."""
    if template is None:
        return None
    remedy: dict[str, Any] = {}
    for raw_key, raw_value in template.items():
        key = _filled(raw_key, values)
        value = _filled(raw_value, values)
        if key is _MISSING or value is _MISSING:
            return None
        remedy[str(key)] = value
    return remedy


_MISSING = object()


def _filled(template: Any, values: Mapping[str, Any]) -> Any:
    """``"{name}"`` -> that value (its type kept); ``"{a}_b"`` -> formatted text; anything else as is."""
    if not isinstance(template, str) or "{" not in template:
        return template
    whole = re.fullmatch(r"\{(\w+)\}", template)
    if whole:
        return values.get(whole.group(1), _MISSING)
    try:
        return template.format_map(dict(values))
    except KeyError:
        return _MISSING


def free_folder(output_dir: str) -> str:
    """A sibling of ``output_dir`` that does not exist yet (``out-2``, ``out-3``, ...): the finished run stays."""
    base = Path(output_dir.rstrip("/\\") or ".")
    for n in range(2, 1000):
        candidate = base.with_name(f"{base.name}-{n}")
        if not candidate.exists():
            return str(candidate)
    return str(base.with_name(f"{base.name}-new"))


def _named_keys(words: str, config: Mapping[str, Any]) -> Cause:
    """No pattern knows these words: the config keys they name (`key`, --key or the bare word), each with the
    value the parser gives it by default, so the fix still names what to change."""
    named = [k for k in config if re.search(rf"(?<![\w-]){re.escape(k)}(?!\w)", words)]
    if not named:
        return Cause("other", {"keys": "the keys its words name"}, None, None)
    key = named[0]
    default = _default(key)
    values = {"keys": ", ".join(named), "key": key, "value": config[key], "default": default}
    # back to LLaMA-Factory's default (the key removed) where it has one; a required key has none to go back to
    remedy = {key: None} if default is not None and default != config[key] else None
    return Cause("named keys", values, key, remedy)


def _default(key: str) -> Any:
    from .schema import field_defaults

    value = field_defaults().get(key)
    value = getattr(value, "value", value)
    return value if not isinstance(value, float) or math.isfinite(value) else None


def _choices(key: str) -> str:
    from .schema import load_schema

    parser = load_schema().parser
    if parser is None:
        return ""
    for action in parser._actions:
        if action.dest == key and action.choices is not None:
            return ", ".join(str(getattr(c, "value", c)) for c in action.choices)
    return ""
