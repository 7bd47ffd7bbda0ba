"""The fuzz judged (issue 40 item 4): a seeded sample of tests/test_fuzz_check.py's wrong values, on a config
whose model is the tiny local one (so LLaMA-Factory's dry build is reached, not skipped for a model that is
not in the cache), must get the verdict LLaMA-Factory gives.

Oracles, both stock with this package's hook off: LLaMA-Factory's own ``get_train_args`` (in this process) and,
for every case the parser accepts, the real run (``llamafactory-cli train`` as run_exp runs it, one step, all
cases in one child process: tests/stock_runner.py). ``check`` must refuse (exit 1 or 2) every case either
refuses, and must call ready every case the stock run trains. ``LLAMAFACTORY_ROCM_FUZZ_SEED=N`` draws another
sample, as for the crash fuzz.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from llamafactory_rocm.cli.main import main
from llamafactory_rocm.errors import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from tests.conftest import tiny_train_config
from tests.stock_runner import hook_off_env, run_alone
from tests.test_fuzz_check import SEED, key_cases
from tests.test_refusal_fixes import stock_parser_words

pytestmark = pytest.mark.trainer

SAMPLE = 24


def sample() -> list[tuple[str, Any]]:
    cases = key_cases()
    return random.Random(SEED + 1).sample(cases, SAMPLE)


CASES = sample()


@pytest.fixture(scope="module")
def judged(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each case's config file, stock parser words, check's exit, and (parser accepting) the stock run's exit."""
    work = tmp_path_factory.mktemp("fuzz-judged")
    out: dict[str, dict[str, Any]] = {}
    for key, value in CASES:
        case_id = f"{key}-{type(value).__name__}"
        folder = work / case_id
        folder.mkdir()
        config = tiny_train_config(
            tiny_model, folder / "out", max_steps=1, max_samples=8, cutoff_len=64, plot_loss=False
        )
        config[key] = value
        path = folder / "config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        with contextlib.chdir(folder):
            words = stock_parser_words(yaml.safe_load(path.read_text(encoding="utf-8")))
        out[case_id] = {"dir": str(folder), "path": str(path), "words": words, "check": _check(path, folder)}
    runs = [{"id": cid, "dir": c["dir"], "args": [c["path"]]} for cid, c in out.items() if c["words"] is None]
    results, proc = run_alone(runs, work, hook_off_env(work), name="fuzz-stock", timeout=1500)
    for run in runs:
        assert run["id"] in results, f"the stock child died before {run['id']}: {proc.stderr[-2000:]}"
        out[run["id"]]["stock"] = results[run["id"]]
    return out


def _check(path: Path, folder: Path) -> tuple[int, set[str]]:
    """check's exit and its error codes (none for the one-line refusal, exit 2)."""
    out = io.StringIO()
    with contextlib.chdir(folder), contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["check", str(path), "--json"])
    try:
        findings = json.loads(out.getvalue())["findings"]
    except (ValueError, KeyError):
        return code, set()
    return code, {f["code"] for f in findings if f["level"] == "error"}


@pytest.mark.parametrize(("key", "value"), CASES, ids=[f"{k}-{type(v).__name__}" for k, v in CASES])
def test_check_gives_llamafactorys_verdict(key: str, value: Any, judged: dict[str, dict[str, Any]]) -> None:
    case = judged[f"{key}-{type(value).__name__}"]
    checked, errors = case["check"]
    assert checked in (EXIT_OK, EXIT_FINDINGS, EXIT_USAGE)
    if case["words"] is not None:
        assert checked != EXIT_OK, f"LLaMA-Factory's parser refuses ({case['words'][:300]}); check says ready"
        return
    stock = case["stock"]
    if stock["exit"] != 0:
        assert checked != EXIT_OK, f"the stock run fails ({stock['error'][:300]}); check says ready"
    elif checked != EXIT_OK:
        # Where the stock run trains, check refuses only a value of another type than the field's, which
        # LLaMA-Factory's parse_dict hands on unconverted (VALUE_INVALID: the run would hold "junk" where a number
        # is declared, unused by this run or read later); docs/troubleshooting.md says check is stricter there.
        assert errors == {"VALUE_INVALID"}, f"the stock run trains; check refuses with {sorted(errors)}"
