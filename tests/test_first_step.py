"""Step 1 for real on a shrunk twin (issue 51 items 1-3, lf/dry_step.py, lf/twin.py): the runs check called ready
that fail inside ``trainer.train()`` are refused, each with its key and a remedy, and the one ready run check
refused (warmup_stable_decay without num_decay_steps) is accepted.

The oracle is stock LLaMA-Factory (tests/stock_runner.py: ``run_exp`` as ``llamafactory-cli train`` calls it,
the hook off, HF_HUB_OFFLINE set): each case as given fails with the library's words, and with check's remedy
applied trains (exit 0, the adapter written); the accepted case trains as given.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.findings import Level
from llamafactory_rocm.lf.twin import shrunk_config, vocab_needed
from tests.conftest import tiny_train_config
from tests.test_refusal_fixes import applied

pytestmark = pytest.mark.trainer

# id -> (changes to the tiny config, the stock run's words, the key check names)
REFUSED: dict[str, tuple[dict[str, Any], str, str]] = {
    "eval_on_start without eval set": ({"eval_on_start": True}, "evaluation requires an eval_dataset", "eval_on_start"),
    "early stopping without metric": (
        {"early_stopping_steps": 2, "val_size": 0.1, "eval_strategy": "steps", "eval_steps": 1},
        "EarlyStoppingCallback requires metric_for_best_model",
        "metric_for_best_model",
    ),
    "save_strategy best without metric": (
        {"save_strategy": "best"},
        "metric_for_best_model` must be provided",
        "metric_for_best_model",
    ),
    "freeze with nothing trainable": (
        {"finetuning_type": "freeze", "freeze_trainable_layers": 0},
        "does not require grad",
        "freeze_trainable_layers",
    ),
    "asft with lora and no reference model": ({"use_asft_loss": True}, "object is not callable", "ref_model"),
    "push_to_hub offline": ({"push_to_hub": True}, "OfflineModeIsEnabled", "push_to_hub"),
    # issue 53: a run too long for LLaMA-Factory's log callback to time (timedelta overflows at step 1)
    "max_steps 2**62": ({"max_steps": 2**62}, "OverflowError", "max_steps"),
    "num_train_epochs 1e30": ({"max_steps": -1, "num_train_epochs": 1e30}, "OverflowError", "num_train_epochs"),
}
ACCEPTED = {"warmup_stable_decay without num_decay_steps": {"lr_scheduler_type": "warmup_stable_decay"}}
# FIRST_STEP_ONLY=regex runs only the cases whose id matches (for a mutation run: the stock runs are the cost)
ONLY = re.compile(os.environ.get("FIRST_STEP_ONLY", ""))
REFUSED = {case: v for case, v in REFUSED.items() if ONLY.search(case)}
ACCEPTED = {case: v for case, v in ACCEPTED.items() if ONLY.search(case)}


def _config(model: Path, out: Path, changes: dict[str, Any]) -> dict[str, Any]:
    return tiny_train_config(
        model, out, **{"max_steps": 1, "max_samples": 8, "cutoff_len": 64, "plot_loss": False, **changes}
    )


def _errors(config: dict[str, Any]) -> list[Any]:
    return [f for f in check_config(config, plan_without_gpu=False).findings if f.level is Level.ERROR]


@pytest.fixture(scope="module")
def verdicts(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """check on each case and on each remedied case, then every config in one stock child (hook off)."""
    from tests.stock_runner import hook_off_env, run_alone

    work = tmp_path_factory.mktemp("first-step")
    checked, runs = {}, {}
    for n, (case, (changes, _words, _key)) in enumerate(REFUSED.items()):
        config = _config(tiny_model, work / f"out-{n}", changes)
        errors = _errors(config)
        fixed = applied(config, errors[0].remedy or {}, config) if errors else None
        if fixed is not None:
            fixed["output_dir"] = str(work / f"fixed-{n}")
        checked[case] = (errors, fixed, _errors(fixed) if fixed is not None else None)
        runs[f"{n}-given"], runs[f"{n}-fixed"] = config, fixed
    for n, (case, changes) in enumerate(ACCEPTED.items()):
        config = _config(tiny_model, work / f"accepted-{n}", changes)
        checked[case] = (check_config(config, plan_without_gpu=False).findings, None, None)
        runs[f"a{n}-given"] = config
    cases = []
    for name, config in runs.items():
        if config is None:
            continue
        (work / f"{name}.yaml").write_text(yaml.safe_dump(config))
        cases.append({"id": name, "dir": str(work), "args": [str(work / f"{name}.yaml")]})
    results, proc = run_alone(cases, work, hook_off_env(work), name="first-step", timeout=1500)
    return {"checked": checked, "stock": results, "log": proc.stderr[-3000:]}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_run_that_fails_at_step_1_is_refused_with_a_remedy_that_trains(case: str, verdicts: dict[str, Any]) -> None:
    _changes, words, key = REFUSED[case]
    n = list(REFUSED).index(case)
    errors, fixed, again = verdicts["checked"][case]
    given = verdicts["stock"].get(f"{n}-given")
    assert given is not None and given["exit"] != 0 and words in given["error"], (given, verdicts["log"])
    assert errors, f"check calls {case!r} ready; the stock run fails: {given['error'][:300]}"
    first = errors[0]
    assert (first.code, first.key) == ("FIRST_STEP_REFUSED", key), first.line()
    assert words in " ".join(first.message.split()), first.message
    assert first.remedy and key in first.remedy, first.line()
    assert not again, [f.line() for f in again]  # the remedied config is ready for check
    trained = verdicts["stock"].get(f"{n}-fixed")  # and for LLaMA-Factory
    assert trained is not None and trained["exit"] == 0, (first.remedy, trained, verdicts["log"])
    assert Path(fixed["output_dir"], "adapter_model.safetensors").is_file() or Path(fixed["output_dir"]).is_dir()


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_a_run_that_trains_is_accepted_after_its_first_step_ran(case: str, verdicts: dict[str, Any]) -> None:
    findings, _fixed, _again = verdicts["checked"][case]
    n = list(ACCEPTED).index(case)
    stock = verdicts["stock"].get(f"a{n}-given")
    assert stock is not None and stock["exit"] == 0, (stock, verdicts["log"])
    assert not [f for f in findings if f.level is Level.ERROR], [f.line() for f in findings]
    assert "FIRST_STEP_RAN" in {f.code for f in findings}, [f.line() for f in findings]


class _Tokenizer:
    """A tokenizer of 1000 tokens without special ones: the config's own ids (gpt-oss's pad 199999) decide."""

    all_special_ids: tuple[int, ...] = ()

    def __len__(self) -> int:
        return 1000


@pytest.mark.parametrize("shape", ["llama3_8b", "qwen3_30b_a3b", "gpt_oss_20b", "deepseek_v3_defaults"])
def test_the_twin_keeps_the_layers_the_head_ratio_and_the_experts(shape: str) -> None:
    """The published shapes' twins, built by transformers from the shrunk config (meta device): every layer,
    the query/key-value head ratio and the experts kept, the widths cut, the module names the same."""
    import json

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import llamafactory_rocm

    models = Path(llamafactory_rocm.__file__).parent / "models"
    raw = json.loads((models / f"{shape}.json").read_text())["config"]
    raw = {k: v for k, v in raw.items() if k != "quantization_config"}
    config = AutoConfig.for_model(**raw)
    twin, size = shrunk_config(config, vocab_needed(_Tokenizer(), config))
    assert size.layers == config.num_hidden_layers and size.hidden <= 64
    assert (
        twin.num_attention_heads // twin.num_key_value_heads
        == (config.num_attention_heads // config.num_key_value_heads)
        or twin.num_attention_heads == twin.num_key_value_heads
    )
    with torch.device("meta"):
        real, small = AutoModelForCausalLM.from_config(config), AutoModelForCausalLM.from_config(twin)
    assert [n for n, _ in real.named_modules()] == [n for n, _ in small.named_modules()]
    assert sum(p.numel() for p in small.parameters()) < 0.01 * sum(p.numel() for p in real.parameters())


def test_a_forecast_only_check_skips_step_1_and_says_so(tiny_model: Path, tmp_path: Path, monkeypatch) -> None:
    """presets list --forecast shows each preset's forecast only (cli/presets_cmd.py): its checks skip step 1 on the
    twin and say why; the same config checked plainly runs it."""
    from llamafactory_rocm.lf.dry_step import FORECAST_ONLY, forecast_only

    monkeypatch.chdir(tmp_path)
    config = _config(tiny_model, tmp_path / "out", {})
    with forecast_only():
        skipped = check_config(config, plan_without_gpu=False).findings
    assert "FIRST_STEP_RAN" not in {f.code for f in skipped}
    assert any(f.code == "DRY_RUN_NOT_CHECKED" and FORECAST_ONLY in f.message for f in skipped), skipped
    ran = check_config(config, plan_without_gpu=False).findings
    assert "FIRST_STEP_RAN" in {f.code for f in ran}, [f.line() for f in ran]
