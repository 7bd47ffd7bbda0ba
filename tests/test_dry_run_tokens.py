"""The tokenizer against the model's embedding: a template of another family adds tokens past the rows.

The oracle is stock LLaMA-Factory (``run_exp``, hook off) on the tiny Llama: ``template: gemma`` adds
``<end_of_turn>`` (id 460 of a 460-row embedding) and the first forward fails with IndexError; with
``resize_vocab: true`` LLaMA-Factory resizes the embedding and it trains; ``add_special_tokens`` makes
LLaMA-Factory turn resize_vocab on by itself. ``check`` must agree on each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.findings import Level
from tests import stock_runner
from tests.conftest import tiny_train_config

CASES: dict[str, tuple[dict[str, Any], str | None]] = {  # id -> (changes, the error check gives, or None)
    "foreign_template": ({"template": "gemma"}, "TOKENIZER_BEYOND_EMBEDDING"),
    "foreign_template_resized": ({"template": "gemma", "resize_vocab": True}, None),
    "added_special_token": ({"add_special_tokens": "<|tool|>"}, None),
}


@pytest.fixture(scope="module")
def runs(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, dict[str, Any]]]:
    work = tmp_path_factory.mktemp("tokens")
    configs, manifest = {}, []
    for cid, (changes, _) in CASES.items():
        folder = work / cid
        folder.mkdir()
        # cutoff_len 512 (the tiny model's length): at 128 LLaMA-Factory truncates the prompt before <end_of_turn>
        config = tiny_train_config(tiny_model, folder / "out", max_steps=1, max_samples=8, cutoff_len=512, **changes)
        configs[cid] = config
        (folder / "config.yaml").write_text(yaml.safe_dump(config))
        manifest.append({"id": cid, "dir": str(folder), "args": ["config.yaml"]})
    checked = {cid: check_config(config) for cid, config in configs.items()}  # before anything is written
    results, proc = stock_runner.run_alone(manifest, work, stock_runner.hook_off_env(work), name="tokens", timeout=400)
    assert len(results) == len(CASES), proc.stderr[-3000:]
    return {cid: (checked[cid], results[cid]) for cid in CASES}


@pytest.mark.parametrize("cid", list(CASES))
def test_check_and_llamafactory_alone_agree(cid: str, runs):
    report, ran = runs[cid]
    errors = {f.code: f for f in report.findings if f.level is Level.ERROR}
    expected = CASES[cid][1]
    if expected is None:
        assert ran["exit"] == 0, ran["error"]
        assert report.ok, [f.line() for f in errors.values()]
        return
    assert ran["exit"] != 0 and "IndexError" in ran["error"] and "index out of range" in ran["error"], ran
    assert set(errors) == {expected}, [f.line() for f in errors.values()]
    finding = errors[expected]
    assert finding.key == "resize_vocab" and "resize_vocab: true" in finding.fix
    assert "<end_of_turn>" in finding.message
