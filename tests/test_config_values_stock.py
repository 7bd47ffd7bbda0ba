"""Oracles from stock ``llamafactory-cli train`` (hook off, tiny model, 1 step) for how a config is read
(``check/config_io.py``) and what a YAML value becomes (``rules/values.py``): LLaMA-Factory's own run
decides, not our call of its parser."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm.check.config_io import load_launch_args
from llamafactory_rocm.errors import UsageError
from llamafactory_rocm.lf.schema import load_schema
from llamafactory_rocm.rules import values
from tests.conftest import make_ctx, offline_env, tiny_train_config

pytestmark = pytest.mark.trainer

LLAMAFACTORY_CLI = str(Path(sys.executable).parent / "llamafactory-cli")


def stock_train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = offline_env(cwd, LLAMAFACTORY_ROCM="0")
    return subprocess.run(
        [LLAMAFACTORY_CLI, "train", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def write(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_a_quoted_learning_rate_fails_stock_and_trains_once_coerced(tiny_model, tmp_path):
    config = tiny_train_config(tiny_model, tmp_path / "quoted", max_steps=1, learning_rate=1.0)
    path = write(tmp_path / "quoted.yaml", config)
    # quoted as a user quotes it (PyYAML would write 5e-5 bare, which OmegaConf reads as a float)
    path.write_text(path.read_text().replace("learning_rate: 1.0\n", 'learning_rate: "5e-5"\n'))
    quoted = load_launch_args([str(path)])[0]
    assert quoted["learning_rate"] == "5e-5"
    failed = stock_train([str(path)], tmp_path)
    assert failed.returncode != 0 and "TypeError" in failed.stderr, failed.stderr[-3000:]

    ctx = replace(make_ctx("cpu_only"), schema=load_schema())
    step = values.refuse_unconvertible_values(quoted, {}, ctx)
    assert [(f.code, f.key) for f in step.findings] == [("VALUE_COERCED", "learning_rate")]
    coerced = {**step.config, "output_dir": str(tmp_path / "coerced")}
    trained = stock_train([str(write(tmp_path / "coerced.yaml", coerced))], tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert (tmp_path / "coerced" / "adapter_model.safetensors").is_file()


def test_a_config_file_followed_by_flags_is_refused_as_stock_refuses_it(tiny_model, tmp_path):
    config = write(tmp_path / "cfg.yaml", tiny_train_config(tiny_model, tmp_path / "out", max_steps=1))
    stock = stock_train([str(config), "--lora_rank", "8"], tmp_path)
    assert stock.returncode != 0
    said = "Some keys are not used by the HfArgumentParser"
    assert said in stock.stderr and "'--lora_rank'" in stock.stderr, stock.stderr[-3000:]
    with pytest.raises(UsageError) as ours:
        load_launch_args([str(config), "--lora_rank", "8"])
    assert said in str(ours.value) and "'--lora_rank', '8' become keys" in str(ours.value)
    assert "lora_rank=8" in str(ours.value) and "\n" not in str(ours.value)


# warmup_steps: .inf, which the stock run stops on (transformers' get_warmup_steps: int(inf)), gave
# check's SCHEDULER_REFUSED by hand (2026-12-06); not run here, each stock run costs ~25 s of CI.
@pytest.mark.parametrize(("key", "trains"), [("learning_rate", True)])
def test_a_non_finite_float_is_judged_as_the_stock_run_judges_it(key, trains, tiny_model, tmp_path):
    """``.inf`` in a float key (issue 37): LLaMA-Factory's parser takes it and the stock run trains with
    ``learning_rate: .inf`` (a meaningless loss), so check says VALUE_NOT_FINITE and does not refuse it."""
    from llamafactory_rocm.check.run import check_config
    from llamafactory_rocm.findings import has_errors
    from tests.conftest import load_snapshot

    config = tiny_train_config(tiny_model, tmp_path / "out", max_steps=1, **{key: float("inf")})
    stock = stock_train([str(write(tmp_path / "cfg.yaml", config))], tmp_path)
    assert (stock.returncode == 0) is trains, stock.stderr[-3000:]
    findings = check_config(config, snapshot=load_snapshot("cpu_only")).resolution.findings
    assert has_errors(findings) is not trains, [f.line() for f in findings]
    assert any(f.code == "VALUE_NOT_FINITE" and f.key == key for f in findings)
