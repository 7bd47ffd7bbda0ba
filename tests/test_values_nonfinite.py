"""Every number key of LLaMA-Factory's parser given ``.inf``, ``-.inf`` and ``.nan`` (issue 37): ``check``
never stops with an internal error (exit 4) and refuses each one that LLaMA-Factory's stock parser refuses.

The keys are the int and float fields of LLaMA-Factory's ``_TRAIN_ARGS`` dataclasses (its own and
transformers' ``TrainingArguments``), read from the dataclasses, not from our schema. The oracle is the stock
``get_train_args`` in this process with the hook off. The check is ``check_config`` (the Python API the CLI
calls) in this process on the recorded CPU snapshot; the model is a hub name that is not in the cache, so the
rules, LLaMA-Factory's parser and the launch run dry (optimizer, scheduler) all run but no model is built.
Where the stock parser takes a float's non-finite value, the launch steps run dry decide, as they do in the
stock run (torch's AdamW refuses ``learning_rate: .nan``; transformers' ``get_warmup_steps`` stops on
``warmup_steps: .inf``); that is not asserted here, where no trainer runs.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path
from typing import Any

import pytest

from llamafactory_rocm.check import run as check_run
from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.errors import UsageError
from llamafactory_rocm.findings import has_errors
from llamafactory_rocm.machine.probe import installed_distributions
from tests.conftest import load_snapshot
from tests.test_fuzz_check import BASE, write_rows  # the fuzz's config and data: LLaMA-Factory's parser runs

NON_FINITE = (math.inf, -math.inf, math.nan)


def number_fields() -> dict[str, tuple[type, Any]]:
    """key -> (int or float, its default) for each init field of LLaMA-Factory's train dataclasses whose type
    is a number or an Optional number (the first dataclass that has a name wins, as in HfArgumentParser)."""
    from llamafactory_rocm.lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.hparams import parser as lf_parser

    fields: dict[str, tuple[type, Any]] = {}
    for cls in lf_parser._TRAIN_ARGS:
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            kinds = [k for k in typing.get_args(hints[field.name]) or (hints[field.name],) if k in (int, float)]
            if field.init and kinds and field.name not in fields:
                default = None if field.default is dataclasses.MISSING else field.default
                fields[field.name] = (kinds[0], default)
    return fields


FIELDS = number_fields()
CASES = [(key, value) for key in sorted(FIELDS) for value in NON_FINITE]


def stock_refusal(config: dict[str, Any]) -> str | None:
    """What LLaMA-Factory's own get_train_args raises on ``config`` (None where it returns)."""
    from llamafactory.hparams import get_train_args

    try:
        get_train_args(dict(config))
    except (Exception, SystemExit) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_rows(tmp_path_factory.mktemp("nonfinite"))


@pytest.fixture(scope="module")
def installed() -> Any:
    return installed_distributions()  # read once: reading every package's metadata is most of a check here


@pytest.fixture
def world(workdir, installed, monkeypatch):
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("LLAMAFACTORY_ROCM", "0")  # the stock parser as llamafactory-cli runs it, hook off
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(workdir / "hf"))
    monkeypatch.setattr(check_run, "installed_distributions", lambda: installed)
    return workdir


def test_the_keys_are_the_parsers_number_keys():
    """The enumeration finds what it must (the keys of issue 37 among them), so the test below cannot pass
    by finding nothing."""
    assert FIELDS["warmup_steps"][0] is float and FIELDS["max_samples"][0] is int
    assert FIELDS["learning_rate"] == (float, 5e-05) and FIELDS["lora_rank"] == (int, 8)
    assert len(FIELDS) > 100


def test_the_base_config_passes_stock_and_check(world):
    assert stock_refusal(BASE) is None
    assert not has_errors(check_config(BASE, snapshot=load_snapshot("cpu_only")).resolution.findings)


@pytest.mark.parametrize(("key", "value"), CASES, ids=[f"{key}={value}" for key, value in CASES])
def test_a_non_finite_number_is_never_an_internal_error(key, value, world):
    config = {**BASE, key: value}
    stock = stock_refusal(config)
    kind, default = FIELDS[key]
    try:
        findings = check_config(config, snapshot=load_snapshot("cpu_only")).resolution.findings
    except UsageError:  # exit 2, one line; any other exception is the CLI's exit 4 and fails here
        assert stock is not None, f"check refused a config LLaMA-Factory's parser takes: {key}: {value}"
        return
    if stock is not None:
        assert has_errors(findings), f"stock get_train_args refuses it ({stock[:200]}), check did not"
    (named,) = [f for f in findings if f.key == key and f.code in ("VALUE_INVALID", "VALUE_NOT_FINITE")]
    # a whole-number field refuses it, as int("inf") does on the command line; a float field says it
    assert named.code == ("VALUE_INVALID" if kind is int else "VALUE_NOT_FINITE")
    works = "leave it out" if default is None else repr(default)  # the dataclass's default: a value that works
    assert key in named.fix and works in named.fix, named.fix
