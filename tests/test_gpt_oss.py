"""gpt-oss-20b from its published config.json (llamafactory_rocm/models/gpt_oss_20b.json), no weights.

LLaMA-Factory's ``configure_attn_implementation`` sets gpt-oss's attention to the hub kernel
``kernels-community/vllm-flash-attn3`` through transformers' ``load_and_register_kernel`` before it reads
``flash_attn``; transformers 5 has no such function. ``check`` says so (ATTENTION_KERNEL_UNAVAILABLE, the
library line named) and still counts the model as LLaMA-Factory loads it: ``Mxfp4Config(dequantize=True)``,
the MXFP4 experts in bf16, 20.9 B parameters x 2 bytes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import llamafactory_rocm.models as models_package
from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.findings import Level
from tests.conftest import tiny_train_config

PUBLISHED = json.loads((Path(models_package.__file__).parent / "gpt_oss_20b.json").read_text())["config"]
PARAMETERS = 20.91e9  # OpenAI's gpt-oss model card: 20.91 B total parameters


@pytest.fixture(scope="module")
def gpt_oss_folder(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The published config.json with the tiny tokenizer (so the launch reaches the model), no weights."""
    folder = tmp_path_factory.mktemp("gpt-oss-20b")
    (folder / "config.json").write_text(json.dumps(PUBLISHED))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model / name, folder / name)
    return folder


def test_stock_llamafactory_refuses_gpt_oss_in_its_attention_set_up():
    """The oracle: LLaMA-Factory's own configure_attn_implementation on the published config."""
    from llamafactory.hparams import ModelArguments
    from llamafactory.model.model_utils.attention import configure_attn_implementation
    from transformers import GptOssConfig

    config = GptOssConfig(**{k: v for k, v in PUBLISHED.items() if k != "model_type"})
    with pytest.raises(ImportError, match="load_and_register_kernel"):
        configure_attn_implementation(config, ModelArguments(model_name_or_path="x", flash_attn="sdpa"))


@pytest.mark.parametrize("flash_attn", ["sdpa", "disabled"])
def test_check_names_the_kernel_and_counts_the_dequantized_model(gpt_oss_folder, tiny_model, tmp_path, flash_attn):
    config = tiny_train_config(
        tiny_model, tmp_path / "out", model_name_or_path=str(gpt_oss_folder), template="gpt_oss",
        flash_attn=flash_attn, bf16=True, cutoff_len=1024, per_device_train_batch_size=1,
    )  # fmt: skip
    report = check_config(config, gpu="mi300x")
    errors = {f.code: f for f in report.findings if f.level is Level.ERROR}
    assert set(errors) == {"ATTENTION_KERNEL_UNAVAILABLE"}, [f.line() for f in errors.values()]
    refusal = errors["ATTENTION_KERNEL_UNAVAILABLE"]
    assert "kernels-community/vllm-flash-attn3" in refusal.message
    assert (
        "llamafactory/model/model_utils/attention.py:" in refusal.message
        and "load_and_register_kernel" in refusal.message
    )
    assert "No LLaMA-Factory key avoids it" in refusal.fix
    weights = report.estimate["weights_gib"] * 2**30
    assert abs(weights / (PARAMETERS * 2) - 1) < 0.03, report.estimate  # bf16 after dequantization, not 4-bit
    assert report.estimate["activations_from"] == "traced forward"


def test_on_this_machine_the_same_refusal(gpt_oss_folder, tiny_model, tmp_path):
    config = tiny_train_config(tiny_model, tmp_path / "out", model_name_or_path=str(gpt_oss_folder), template="gpt_oss")
    report = check_config(config)
    assert "ATTENTION_KERNEL_UNAVAILABLE" in {f.code for f in report.findings if f.level is Level.ERROR}
