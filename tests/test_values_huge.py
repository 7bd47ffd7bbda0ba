"""Every number key of LLaMA-Factory's parser given a finite value too large for the code that reads it (issue 53):
``1e30`` and ``2**63`` for every int and float field, and ``2.5`` where a whole number is read. ``check`` never
stops with an internal error (exit 4), refuses each one LLaMA-Factory's stock parser refuses, and refuses a
whole-number key given a value beyond 64 bits in one line naming the key, the value and a value that works (the
field's default): ``lf/schema.py`` ``WHOLE_RANGE``.

The keys are the int and float fields of LLaMA-Factory's ``_TRAIN_ARGS`` dataclasses, read from the dataclasses
(tests/test_values_nonfinite.py ``number_fields``), not from our schema. The sweep is ``check_config`` (the Python
API the CLI calls) in this process on the recorded CPU snapshot, on the fuzz's config (tests/test_fuzz_check.py
``BASE``: a hub model not in the cache), so that the rules, LLaMA-Factory's parser and the launch run dry (the data,
the optimizer, the dataloader's batches the fuzz crashed in) are reached by every value the rules let through, but
no model is built. The fuzz's own case and the stock sample run on the tiny local model, through the CLI's ``main``.
Oracles, stock with this package's hook off: LLaMA-Factory's own ``get_train_args`` in this process for every case,
and for a sample of keys the stock run (``llamafactory-cli train``, one step, all in one child process:
tests/stock_runner.py). Where the stock run trains with a
whole-number key beyond 64 bits (``cutoff_len: 1e30``, ``max_samples: 2**63``: nothing but Python's own
arithmetic reads them), check is stricter and refuses it, as it refuses ``2.5`` there; a float key is followed
as the stock run follows it.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.cli.main import main
from llamafactory_rocm.errors import EXIT_FINDINGS, EXIT_OK, UsageError
from llamafactory_rocm.findings import Level, has_errors
from tests.conftest import load_snapshot, tiny_train_config
from tests.stock_runner import hook_off_env, run_alone
from tests.test_fuzz_check import BASE  # the fuzz's config and data
from tests.test_refusal_fixes import stock_parser_words

# its fixtures (the fuzz's data, the hook off, the packages read once) and its enumeration of the number keys
from tests.test_values_nonfinite import installed, number_fields, workdir, world  # noqa: F401

HUGE = (1e30, 2**63)  # a YAML 1e30 reaches the field as a float; 2**63 is one past int64 and sys.maxsize
FRACTION = 2.5  # a float with a fraction, where an integer is read

FIELDS = number_fields()
CASES = [(key, value) for key in sorted(FIELDS) for value in (*HUGE, *((FRACTION,) if FIELDS[key][0] is int else ()))]


def works_text(key: str) -> str:
    """The value that works, as the fix must say it: the dataclass's default, or leave the key out."""
    default = FIELDS[key][1]
    return "leave it out" if default is None else repr(default)


@pytest.fixture(scope="module")
def base(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A one-step LoRA run on the tiny local model that the stock run trains and check calls ready."""
    work = tmp_path_factory.mktemp("huge")
    return tiny_train_config(tiny_model, work / "out", max_steps=1, max_samples=8, cutoff_len=64, plot_loss=False)


def test_the_sweep_covers_every_number_key():
    """The enumeration finds what it must (the fuzz's key among them), so the sweep cannot pass by finding none."""
    assert FIELDS["per_device_train_batch_size"] == (int, 8) and FIELDS["save_steps"][0] is float
    whole = sum(kind is int for kind, _ in FIELDS.values())
    assert whole > 50 and len(FIELDS) - whole > 30
    assert len(CASES) == 2 * len(FIELDS) + whole


@pytest.mark.usefixtures("world")
def test_the_base_config_passes_stock_and_check():
    assert stock_parser_words(BASE) is None
    assert not has_errors(check_config(BASE, snapshot=load_snapshot("cpu_only")).resolution.findings)


@pytest.mark.usefixtures("world")
@pytest.mark.parametrize(("key", "value"), CASES, ids=[f"{key}={value!r}" for key, value in CASES])
def test_a_huge_number_is_never_an_internal_error(key, value):
    config = {**BASE, key: value}
    stock = stock_parser_words(config)
    kind, _ = FIELDS[key]
    try:
        findings = check_config(config, snapshot=load_snapshot("cpu_only")).resolution.findings
    except UsageError:  # exit 2, one line; any other exception is the CLI's exit 4 and fails here
        assert stock is not None, f"check refused a config LLaMA-Factory's parser takes: {key}: {value}"
        return
    if stock is not None:
        assert has_errors(findings), f"stock get_train_args refuses it ({stock[:200]}), check did not"
    named = [f for f in findings if f.key == key and f.code == "VALUE_INVALID"]
    if kind is float:  # a finite float is a value the field holds: LLaMA-Factory's parser and the dry run decide
        assert not named, named[0].line()
        return
    # a whole-number field: 2.5 is not a whole number; 1e30 and 2**63 are beyond the 64 bits its readers hold
    (refused,) = named
    assert refused.level is Level.ERROR and refused.remedy == {key: None}
    assert key in refused.message and repr(value) in refused.message, refused.message
    assert key in refused.fix and works_text(key) in refused.fix, refused.fix
    if value != FRACTION:
        assert "64 bits" in refused.message, refused.message


def _cli(path: Path, *args: str) -> tuple[int, str, dict[str, Any] | None]:
    """check's exit, its text and (with --json) its report, through the CLI's own main in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(path.parent), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["check", str(path), *args])
    try:
        report = json.loads(out.getvalue()) if "--json" in args else None
    except ValueError:
        report = None
    return code, out.getvalue() + err.getvalue(), report


@pytest.mark.parametrize("gpu", [(), ("--gpu", "mi300x")], ids=["this machine", "planned mi300x"])
def test_the_fuzz_case_is_refused_with_its_key_and_a_remedy(gpu, base, tmp_path, monkeypatch):
    """The fuzz's ``per_device_train_batch_size: 1e30`` on the tiny model (exit 4: "Stop argument for islice() must
    be None or an integer" from the dataloader built dry) is one error line: the key, the value, the default that
    works; planned for another card too."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump({**base, "per_device_train_batch_size": 1e30}, sort_keys=False))
    code, text, _ = _cli(path, *gpu)
    assert code == EXIT_FINDINGS, text
    assert "This is a bug" not in text and "Traceback" not in text, text
    (line,) = [line for line in text.splitlines() if "[error]" in line]
    assert "VALUE_INVALID: per_device_train_batch_size: 1e+30 is not a whole number within 64 bits" in line, line
    assert "Give per_device_train_batch_size a whole number" in line and "such as 8" in line, line


# The stock run as the oracle: the keys the issue names, and max_steps / data_seed with 2**63 (the stock run
# stops on the first and trains with the second).
STOCK_SAMPLE = [
    ("per_device_train_batch_size", 1e30),
    ("gradient_accumulation_steps", 1e30),
    ("cutoff_len", 1e30),
    ("save_steps", 1e30),
    ("lora_rank", 1e30),
    ("max_samples", 1e30),
    ("dataloader_num_workers", 1e30),
    ("max_steps", 2**63),
    ("data_seed", 2**63),
]


@pytest.fixture(scope="module")
def judged(base: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each sample case's check (exit, report) and stock run (exit, error), both on the same config file."""
    work = tmp_path_factory.mktemp("huge-stock")
    out: dict[str, dict[str, Any]] = {}
    for key, value in STOCK_SAMPLE:
        folder = work / key
        folder.mkdir()
        path = folder / "config.yaml"
        path.write_text(yaml.safe_dump({**base, key: value, "output_dir": str(folder / "out")}, sort_keys=False))
        code, text, report = _cli(path, "--json")
        out[key] = {"dir": str(folder), "path": str(path), "check": code, "text": text, "report": report}
    runs = [{"id": key, "dir": case["dir"], "args": [case["path"]]} for key, case in out.items()]
    results, proc = run_alone(runs, work, hook_off_env(work), name="huge-stock", timeout=900)
    for run in runs:
        assert run["id"] in results, f"the stock child died before {run['id']}: {proc.stderr[-2000:]}"
        out[run["id"]]["stock"] = results[run["id"]]
    return out


@pytest.mark.trainer
@pytest.mark.parametrize(("key", "value"), STOCK_SAMPLE, ids=[f"{k}={v!r}" for k, v in STOCK_SAMPLE])
def test_check_refuses_what_the_stock_run_refuses(key, value, judged):
    case = judged[key]
    code, stock, report = case["check"], case["stock"], case["report"]
    assert code in (EXIT_OK, EXIT_FINDINGS) and report is not None, case["text"][-2000:]
    errors = [f for f in report["findings"] if f["level"] == "error"]
    if stock["exit"] != 0:
        assert code == EXIT_FINDINGS, f"the stock run stops ({stock['error'][:300]}); check says ready"
        assert any(f["key"] == key for f in errors), f"no error names {key}: {errors}"
        return
    if FIELDS[key][0] is float:  # the stock run trains with a float key's value: check follows it
        assert code == EXIT_OK, f"the stock run trains; check refuses: {errors}"
        return
    # the stock run trains with a whole-number key beyond 64 bits, which only Python's arithmetic read: check is
    # stricter, one refusal of the value (as for 2.5), never another code
    assert code == EXIT_OK or {(f["code"], f.get("key")) for f in errors} == {("VALUE_INVALID", key)}, errors
