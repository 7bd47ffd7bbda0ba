"""Every refusal of the verdict corpus (tests/test_verdict_corpus.py) carries a fix that works (issue 37).

For each corpus case ``check`` refuses, its first error (the one the run stops on) must have a fix that is
more than "read LLaMA-Factory's message", must not offer to delete what a run produced, and, where the fix is a
key change (the finding's ``remedy``), that change applied to the case's own config must pass that point:
``check`` run again no longer says that refusal, and where LLaMA-Factory's own parser refused, the stock
``get_train_args`` no longer refuses with the same words. The corpus's stock runs (hook off) are the oracle
that each of these refusals is real; tests/test_refusal_fixes.py holds the parser's refusals one by one.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import test_verdict_corpus as corpus
from tests.test_refusal_fixes import applied, stock_parser_words

REFUSED = [c for c in corpus.CASES if c.expect == "fails" and not c.check_only]
# A fix that only sends the user back to the library's words, or that deletes trained weights or checkpoints.
VAGUE = re.compile(r"as LLaMA-Factory's message says|then run check again$", re.IGNORECASE)
DESTROYS = re.compile(
    r"\b(remove|delete|rm -rf)\b(?! resume_from_checkpoint)[^.(]*\b(final weights|trained model|checkpoints?)\b",
    re.IGNORECASE,
)


def check_findings(prep: corpus.Prepared, args: list[str]) -> tuple[int, list[dict[str, Any]]]:
    """``llamafactory-rocm check ARGS --json`` in this process from the case's folder (as the corpus runs it)."""
    from llamafactory_rocm.cli.main import main

    env = corpus.case_env(prep.case, prep.case_dir)
    out = io.StringIO()
    saved, cwd = dict(os.environ), os.getcwd()
    try:
        os.chdir(prep.case_dir)
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "FORCE_TORCHRUN", "LLAMAFACTORY_ROCM_CHECKED"):
            os.environ.pop(key, None)
        for key in ("HF_HOME", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TOKENIZERS_PARALLELISM", "WANDB_DISABLED"):
            if key in env:
                os.environ[key] = env[key]
        for key, value in prep.case.env:
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            try:
                code = main(["check", *args, "--json"])
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 1
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)
    try:
        return int(code), json.loads(out.getvalue())["findings"]
    except (ValueError, KeyError):
        return int(code), []  # the one-line refusal of a config that cannot be read (exit 2): no findings


def case_config(prep: corpus.Prepared) -> dict[str, Any] | None:
    """The case's config as a mapping (its YAML file), or None for flags and files YAML cannot read back."""
    if prep.case.flags or not prep.args or not prep.args[0].endswith((".yaml", ".yml")):
        return None
    try:
        config = yaml.safe_load(Path(prep.args[0]).read_text(encoding="utf-8"))
    except yaml.YAMLError:
        return None
    return config if isinstance(config, dict) else None


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus-fixes")


@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_the_first_refusal_has_a_fix_that_works(case: corpus.Case, tiny_model: Path, work: Path) -> None:
    prep = corpus.prepare(case, tiny_model, work / case.id)
    code, findings = check_findings(prep, prep.args)
    errors = [f for f in findings if f["level"] == "error"]
    if not errors:
        assert code != 0, f"{case.id}: check calls ready what the stock run refuses ({case.words})"
        return  # the one-line refusal (exit 2): its line is tested by tests/test_check_cli.py
    first = errors[0]
    assert not VAGUE.search(first["fix"]), f"{case.id}: {first['code']}'s fix is no fix: {first['fix']}"
    assert not DESTROYS.search(first["fix"]), f"{case.id}: {first['code']}'s fix destroys data: {first['fix']}"
    remedy = first.get("remedy")
    config = case_config(prep)
    if not remedy or config is None:
        return
    # a value the user supplies is the working one: the base config's, a reward model for ppo
    working = {**corpus.base_config(tiny_model, prep.output_dir), "reward_model": str(tiny_model)}
    fixed = applied(config, remedy, working)
    fixed_path = prep.case_dir / f"fixed{Path(prep.args[0]).suffix}"
    fixed_path.write_text(yaml.safe_dump(fixed, sort_keys=False), encoding="utf-8")
    _, again = check_findings(prep, [str(fixed_path), *prep.args[1:]])
    still = {(f["code"], f["message"]) for f in again if f["level"] == "error"}
    assert (first["code"], first["message"]) not in still, f"{case.id}: {remedy} leaves {first['code']}"
    if first["code"] == "LLAMAFACTORY_REFUSED":
        words = first["message"].split("refuses this config: ", 1)[-1]
        with contextlib.chdir(prep.case_dir):
            assert stock_parser_words(fixed) != words, f"{case.id}: LLaMA-Factory still refuses after {remedy}"
