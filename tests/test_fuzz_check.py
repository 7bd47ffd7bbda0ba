"""Bad input never crashes ``check``: a seeded fuzz over every key of LLaMA-Factory's schema and over
files that are not configs. Each case goes through the CLI's own ``main`` in this process (the code users
run, without a subprocess per case) and must end with exit 0, 1 or 2, never 4 (``This is a bug in
llamafactory-rocm``) or a traceback; an exit 2 is one line on stderr.

The keys are LLaMA-Factory's own (``lf/schema.py`` reads them from its HfArgumentParser); each gets a
value of a wrong type (a number, a list, a mapping, a string of junk, one huge, one nested, null), drawn
with a fixed seed, one key to a config (a wrong value beside another one the parser refuses would never
reach the code behind it). The model is a
hub name that is not in the cache, so LLaMA-Factory's own parser and every rule run but no model is
built. ``LLAMAFACTORY_ROCM_FUZZ_SEED=N`` draws another sample (the failing seed is in the test's id).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from llamafactory_rocm.cli.main import main
from llamafactory_rocm.errors import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE

DEFAULT_SEED = 31
SEED = int(os.environ.get("LLAMAFACTORY_ROCM_FUZZ_SEED", str(DEFAULT_SEED)))


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


WRONG_VALUES: tuple[Any, ...] = (
    None,
    "",
    123,
    -1,
    0,
    1.5,
    True,
    [],
    {},
    [1, "two", None],
    {"a": {"b": [1, 2]}},
    "x" * 20_000,
    10**40,
    "\x00\x01junk\u202e",
    nested(60),
    "${oops}",
    "nan",
    "1e999",
    "a,b,,c",
)

BASE = {
    "model_name_or_path": "some-org/not-in-the-cache",
    "stage": "sft",
    "do_train": True,
    "finetuning_type": "lora",
    "dataset": "rows",
    "dataset_dir": "data",
    "template": "llama3",
    "output_dir": "out",
    "max_steps": 1,
}


def key_cases() -> list[tuple[str, Any]]:
    """(key, wrong value) for every key of LLaMA-Factory's schema, one key a config, the value drawn with SEED."""
    from llamafactory_rocm.lf.schema import load_schema

    rng = random.Random(SEED)
    return [(key, rng.choice(WRONG_VALUES)) for key in sorted(load_schema().keys)]


# What a wider run of this fuzz (every key with a NUL string, a list, a mapping and a number) once
# crashed on; each is now a finding or one line, run every time.
FOUND_WIDER = [  # (key, value) the wider fuzz found, run every time
    ("cache_dir", [1, [2]]),
    ("model_revision", 7),
    ("model_name_or_path", {"a": 1}),
    ("log_level", [1, [2]]),
    ("log_level_replica", {"a": 1}),
    ("optim_args", 7),
    ("report_to", {"a": 1}),
    ("deepspeed", "\x00junk"),
    ("dataset_dir", "\x00junk"),
    ("dataset", 123),
    ("stage", 123),
]


FILES: dict[str, bytes] = {
    "empty.yaml": b"",
    "binary.yaml": bytes(random.Random(SEED).randrange(256) for _ in range(4096)),
    "nul.yaml": b"stage: sft\x00\x00\n",
    "nested_lists.yaml": b"stage: " + b"[" * 5000 + b"]" * 5000 + b"\n",
    "nested_maps.yaml": b"stage: " + b"{a: " * 3000 + b"1" + b"}" * 3000 + b"\n",
    "duplicate_key.yaml": b"stage: sft\nstage: pt\n",
    "huge_value.yaml": b"stage: " + b"s" * 2_000_000 + b"\n",
    "tabs.yaml": b"stage:\tsft\n\t- x\n",
    "anchors.yaml": b"a: &a [1, 2]\nb: [*a, *a, *a]\nstage: *a\n",
    "utf16.yaml": "stage: sft\n".encode("utf-16"),
    "a_list.json": b"[1, 2, 3]",
    "bad.json": b"{",
}


def write_rows(folder: Path) -> Path:
    """``folder`` with the dataset BASE names (``rows`` in ``data/``), two rows."""
    data = folder / "data"
    data.mkdir()
    (data / "rows.json").write_text(json.dumps([{"instruction": "q", "input": "", "output": "a"}] * 2))
    (data / "dataset_info.json").write_text(json.dumps({"rows": {"file_name": "rows.json"}}))
    return folder


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_rows(tmp_path_factory.mktemp("fuzz"))


def run_check(path: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    monkeypatch.chdir(workdir)
    # The user has not switched the Hub off: the model, not in the cache, is "not checked" (the dry run itself
    # never downloads); under HF_HUB_OFFLINE=1 it is refused (MODEL_NOT_FOUND), as the real run fails there.
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(workdir / "hf"))
    monkeypatch.delenv("LLAMAFACTORY_ROCM_DEBUG", raising=False)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["check", str(path)])
    return code, out.getvalue(), err.getvalue()


def assert_clean(code: int, out: str, err: str) -> None:
    assert code in (EXIT_OK, EXIT_FINDINGS, EXIT_USAGE), err
    assert "Traceback" not in err + out and "This is a bug" not in err, err
    if code == EXIT_USAGE:
        assert len(err.strip().splitlines()) == 1, err


def test_the_base_config_is_ready(workdir, tmp_path, monkeypatch):
    """The world the fuzz runs in reaches LLaMA-Factory's parser and the data: the base config passes."""
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(BASE))
    code, out, err = run_check(path, workdir, monkeypatch)
    assert code == EXIT_OK, out + err


CASES = key_cases()


@pytest.mark.parametrize(("key", "value"), CASES, ids=[f"{key}-{type(value).__name__}" for key, value in CASES])
def test_a_wrong_value_for_any_key_is_a_finding_or_one_line(key, value, workdir, tmp_path, monkeypatch):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**BASE, key: value}, allow_unicode=True))
    assert_clean(*run_check(path, workdir, monkeypatch))


@pytest.mark.parametrize(("key", "value"), FOUND_WIDER, ids=[f"{k}-{type(v).__name__}" for k, v in FOUND_WIDER])
def test_what_the_wider_fuzz_found_is_a_finding_or_one_line(key, value, workdir, tmp_path, monkeypatch):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**BASE, key: value}, allow_unicode=True))
    assert_clean(*run_check(path, workdir, monkeypatch))


@pytest.mark.parametrize("name", sorted(FILES))
def test_files_that_are_not_configs_are_one_line(name, workdir, tmp_path, monkeypatch):
    path = tmp_path / name
    path.write_bytes(FILES[name])
    code, out, err = run_check(path, workdir, monkeypatch)
    assert_clean(code, out, err)
    assert code != EXIT_OK


def test_a_duplicate_key_names_the_key_and_its_line(workdir, tmp_path, monkeypatch):
    """Oracle: yaml's own error for the file (OmegaConf refuses duplicate keys the same way)."""
    path = tmp_path / "dup.yaml"
    path.write_text("model_name_or_path: m\nstage: sft\ndo_train: true\nstage: pt\n")
    code, _, err = run_check(path, workdir, monkeypatch)
    assert code == EXIT_USAGE
    assert "duplicate key stage" in err and "line 4" in err


def test_a_stage_that_is_not_a_name_is_a_finding(workdir, tmp_path, monkeypatch):
    """``stage: 123`` reaches LLaMA-Factory's parser unconverted (its parse_dict converts no types)."""
    path = tmp_path / "stage.yaml"
    path.write_text(yaml.safe_dump({**BASE, "stage": 123}))
    code, out, err = run_check(path, workdir, monkeypatch)
    assert_clean(code, out, err)
    assert code == EXIT_FINDINGS
