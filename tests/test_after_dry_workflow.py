"""Issue 31 (item 5): the training dry run builds what the workflow builds besides the policy: DPO/KTO's
reference model (``ref_model``), and the packages ``load_model`` asks for the quantization method.

Oracle: stock ``llamafactory-cli train`` (``run_exp`` as it calls it, hook off), all cases in one child
process (tests/stock_runner.py). check must be ok exactly when the stock run trains, and refuse with the
recorded code and LLaMA-Factory's words when it does not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.findings import Level
from llamafactory_rocm.resources import datasets_dir
from tests import stock_runner
from tests.conftest import tiny_train_config

pytestmark = pytest.mark.trainer

RANKING_COLUMNS = {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"}

# id -> (changes, expected: "trains" or (words, code))
CASES: dict[str, tuple[dict[str, Any], Any]] = {
    "dpo_plain": ({"stage": "dpo"}, "trains"),
    "dpo_ref_model_itself": ({"stage": "dpo", "ref_model": "MODEL"}, "trains"),
    "dpo_ref_model_missing": (
        {"stage": "dpo", "ref_model": "saves/no-such-model"},
        ("Failed to load tokenizer", "REF_MODEL_NOT_LOADABLE"),
    ),
    "dpo_ref_adapter_missing": (
        {"stage": "dpo", "ref_model": "MODEL", "ref_model_adapters": "saves/no-such-adapter"},
        ("Can't find 'adapter_config.json'", "REF_MODEL_NOT_LOADABLE"),
    ),
    "sft_hqq_without_hqq": (
        {"quantization_bit": 4, "quantization_method": "hqq"},
        ("hqq", "QUANTIZATION_PACKAGE_MISSING"),
    ),
}


def _pairs(folder: Path) -> Path:
    rows = json.loads((datasets_dir() / "amd_finetune_qa.json").read_text(encoding="utf-8"))[:16]
    data = folder / "data"
    data.mkdir(parents=True)
    pairs = [{"instruction": r["instruction"], "input": r.get("input", ""), "chosen": r["output"], "rejected": "No."}
             for r in rows]  # fmt: skip
    (data / "pairs.json").write_text(json.dumps(pairs), encoding="utf-8")
    info = {"pairs": {"file_name": "pairs.json", "ranking": True, "columns": RANKING_COLUMNS}}
    (data / "dataset_info.json").write_text(json.dumps(info), encoding="utf-8")
    return data


@pytest.fixture(scope="module")
def runs(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, Any, dict]]:
    work = tmp_path_factory.mktemp("workflow-models")
    data = _pairs(work)
    configs, manifest = {}, []
    for cid, (changes, _) in CASES.items():
        folder = work / cid
        folder.mkdir()
        changes = {k: (str(tiny_model) if v == "MODEL" else v) for k, v in changes.items()}
        config = tiny_train_config(tiny_model, folder / "out", max_steps=1, **changes)
        if changes.get("stage") == "dpo":
            config.update(dataset="pairs", dataset_dir=str(data))
        configs[cid] = config
        (folder / "config.yaml").write_text(yaml.safe_dump(config))
        manifest.append({"id": cid, "dir": str(folder), "args": ["config.yaml"]})
    checked = {cid: check_config(config) for cid, config in configs.items()}  # before anything is written
    results, proc = stock_runner.run_alone(
        manifest, work, stock_runner.hook_off_env(work), name="workflow", timeout=400
    )
    assert len(results) == len(CASES), proc.stderr[-3000:]
    return {cid: (checked[cid], CASES[cid][1], results[cid]) for cid in CASES}


@pytest.mark.parametrize("cid", list(CASES))
def test_check_and_llamafactory_alone_agree(cid: str, runs):
    report, expected, ran = runs[cid]
    errors = {f.code: f.message for f in report.findings if f.level is Level.ERROR}
    if expected == "trains":
        assert ran["exit"] == 0, ran["error"]
        assert report.ok, errors
        return
    words, code = expected
    assert ran["exit"] != 0 and words in ran["error"], ran
    assert code in errors, errors
    assert words in errors[code]
