"""Planning for another machine: a package missing here is the target's to install, not a refusal.

``check CONFIG --gpu rx7900xtx`` of a QLoRA config on a machine without bitsandbytes: LLaMA-Factory's own
``configure_quantization`` (its ``check_version("bitsandbytes>=0.39.0", mandatory=True)``) would stop the load
here; planned, that is a warning naming the target's install line, the meta model is still built and traced,
and the estimate is the quantized one. On this machine (no --gpu) it stays an error. A change that fits,
suggested by the memory rule, is one the package rules accept for the target.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

import llamafactory_rocm.models as models_package
from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.findings import Level
from llamafactory_rocm.lf.dry_run import dry_launch
from llamafactory_rocm.lf.memory import model_config_for
from llamafactory_rocm.presets import raw
from llamafactory_rocm.rules import memory_fit
from llamafactory_rocm.rules.memory_fit import refused_change
from tests.conftest import make_ctx, tiny_train_config

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is not None, reason="bitsandbytes is installed: nothing is missing here"
)


def llama3_8b_folder(tiny_model: Path, folder: Path) -> Path:
    """A Llama-3-8B config.json (llamafactory_rocm/models/llama3_8b.json) with the tiny tokenizer, no weights."""
    from transformers import LlamaConfig

    shape = json.loads((Path(models_package.__file__).parent / "llama3_8b.json").read_text())["config"]
    LlamaConfig(**{k: v for k, v in shape.items() if k != "model_type"}).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model / name, folder / name)
    return folder


def qlora(tiny_model: Path, tmp_path: Path, **overrides: object) -> dict:
    return tiny_train_config(tiny_model, tmp_path / "out", **{"quantization_bit": 4, "bf16": True, **overrides})


def test_stock_load_model_refuses_here_as_the_finding_says(tiny_model, tmp_path):
    """The oracle: LLaMA-Factory's own load_model, real weights, stops on the missing package."""
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_model, load_tokenizer

    model_args, _, training_args, finetuning_args, _ = get_train_args(qlora(tiny_model, tmp_path, bf16=False))
    tokenizer = load_tokenizer(model_args)["tokenizer"]
    with pytest.raises(ImportError, match=r"bitsandbytes>=0\.39\.0"):
        load_model(tokenizer, model_args, finetuning_args, training_args.do_train)


def test_on_this_machine_the_dry_run_says_the_package_and_still_builds_the_model(tiny_model, tmp_path):
    run = dry_launch(qlora(tiny_model, tmp_path, bf16=False))
    (finding,) = [f for f in run.findings if f.code == "QUANTIZATION_PACKAGE_MISSING"]
    assert finding.level is Level.ERROR and finding.new == "bitsandbytes>=0.39.0"
    assert 'pip install "bitsandbytes>=0.39.0"' in finding.fix
    assert "MODEL_MODULES_REFUSED" not in {f.code for f in run.findings}
    assert run.built is not None and run.built.activations is not None  # built and traced on the meta device


def test_on_this_machine_check_refuses(tiny_model, tmp_path):
    report = check_config(qlora(tiny_model, tmp_path, bf16=False))
    assert not report.ok
    assert "PACKAGE_MISSING" in {f.code for f in report.findings if f.level is Level.ERROR}


def test_planned_qlora_on_a_real_shape_is_ready_with_the_targets_install(tiny_model, tmp_path):
    folder = llama3_8b_folder(tiny_model, tmp_path / "llama3-8b")
    config = qlora(tiny_model, tmp_path, model_name_or_path=str(folder), cutoff_len=2048, per_device_train_batch_size=2)
    report = check_config(config, gpu="rx7900xtx")
    assert report.ok, [f.line() for f in report.findings if f.level is Level.ERROR]
    (finding,) = [f for f in report.findings if f.code == "QUANTIZATION_PACKAGE_MISSING"]
    assert finding.level is Level.WARNING
    assert "pip install 'bitsandbytes>=0.49' (its ROCm wheel for gfx1100)" in finding.fix
    estimate = report.estimate
    assert estimate["activations_from"] == "traced forward"
    # 8.03e9 parameters: bf16 would be 14.96 GiB; 4-bit decoder linears + bf16 embeddings and head ~5.5 GiB
    assert 4.5 < estimate["weights_gib"] < 6.5


def test_planned_for_an_arch_without_a_wheel_the_install_is_a_source_build(tiny_model, tmp_path):
    report = check_config(qlora(tiny_model, tmp_path), arch="gfx908")
    codes = {f.code: f for f in report.findings}
    assert codes["QLORA_ARCH_UNSUPPORTED"].level is Level.ERROR  # the rules refuse first; no dry run
    assert "QUANTIZATION_PACKAGE_MISSING" not in codes


def _over_budget(snapshot: str) -> tuple[dict, object]:
    config = {**raw("rx7900xtx_llama3_lora"), "cutoff_len": 8192, "per_device_train_batch_size": 1}
    ctx = replace(make_ctx(snapshot), model_config=model_config_for(config["model_name_or_path"]))
    return config, ctx


def test_quantization_is_no_change_that_fits_where_the_arch_has_no_bitsandbytes():
    config, ctx = _over_budget("mi100")  # gfx908: no bitsandbytes ROCm wheel (QLORA_ARCH_UNSUPPORTED)
    assert refused_change(config, {"quantization_bit": 4}, ctx) == ["QLORA_ARCH_UNSUPPORTED"]
    (finding,) = [f for f in memory_fit.memory_fit(config, {}, ctx).findings if f.code.startswith("MEMORY_OVER")]
    assert "quantization_bit" not in finding.fix


def test_each_change_that_fits_applied_is_accepted_and_fits():
    """Planned for an RX 7900 XTX (its packages unknown): every ``key: value`` change the rule suggests, applied
    to the config, passes the package rules and the memory rule."""
    from llamafactory_rocm.check.target import planned_snapshot
    from llamafactory_rocm.rules import Target

    config, ctx = _over_budget("rx7900xtx")
    ctx = replace(ctx, snapshot=planned_snapshot(Target(arch="gfx1100", alias="rx7900xtx", named_by="--gpu"), {}))
    (finding,) = [f for f in memory_fit.memory_fit(config, {}, ctx).findings if f.code.startswith("MEMORY_OVER")]
    assert "quantization_bit: 4" in finding.fix
    changes = finding.fix.split(":", 1)[1].split(";")
    applied = 0
    for change in changes:
        head = change.strip().split(" (")[0]
        pairs = [p.strip().split(": ") for p in head.split(" with ")]
        if not all(len(p) == 2 and p[0].isidentifier() for p in pairs):
            continue  # another GPU or a node: not a key of this config
        changed = {**config, **{k: int(v) for k, v in pairs}}
        assert refused_change(config, dict(changed), ctx) == [], change
        assert [f.code for f in memory_fit.memory_fit(changed, {}, ctx).findings] == ["MEMORY_ESTIMATE"], change
        applied += 1
    assert applied >= 2
