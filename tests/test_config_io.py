"""check/config_io.py reads a config with LLaMA-Factory's own read_args: the oracle is read_args itself
(and, for a file followed by flags, stock llamafactory-cli in tests/test_config_values_stock.py)."""

from __future__ import annotations

import sys

import pytest

from llamafactory_rocm.check.config_io import load_config, load_launch_args
from llamafactory_rocm.errors import UsageError


def llamafactory_reads(tokens: list[str]):
    from llamafactory.hparams.parser import read_args

    saved, sys.argv = sys.argv, ["llamafactory-cli", *tokens]
    try:
        return read_args(None)
    finally:
        sys.argv = saved


def test_a_file_and_overrides_read_as_llamafactory_reads_them_interpolations_unresolved(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text('model_name_or_path: m\noutput_dir: ${model_name_or_path}-out\nlearning_rate: "5e-5"\n')
    tokens = [str(cfg), "lora_rank=16", "template=llama3"]
    ours = load_launch_args(tokens)[0]
    assert ours == llamafactory_reads(tokens)
    assert ours["output_dir"] == "${model_name_or_path}-out" and ours["learning_rate"] == "5e-5"


@pytest.mark.parametrize("text", ["", "# only a comment\n", "null\n", "{}\n"])
def test_an_empty_config_is_one_line(tmp_path, text):
    cfg = tmp_path / "empty.yaml"
    cfg.write_text(text)
    assert llamafactory_reads([str(cfg)]) == {}  # LLaMA-Factory would go on to "Please provide model_name_or_path"
    with pytest.raises(UsageError, match=r"empty\.yaml is empty") as said:
        load_config(cfg)
    assert "\n" not in str(said.value)


def test_a_json_config_is_refused_while_llamafactory_cannot_read_one(tmp_path):
    """llamafactory 0.9.5 read_args hands json.load a Path; when a release reads .json, this fails and the
    refusal in config_io._unreadable goes."""
    cfg = tmp_path / "cfg.json"
    cfg.write_text('{"model_name_or_path": "m"}')
    with pytest.raises(AttributeError):
        llamafactory_reads([str(cfg)])
    with pytest.raises(UsageError, match=r"cannot read a \.json config"):
        load_config(cfg)


@pytest.mark.parametrize(
    ("tail", "said"),
    [
        (["--lora_rank", "8"], "lora_rank=8"),
        (["--lora_rank=8"], "lora_rank=8"),
        (["lora_rank"], "lora_rank=..."),
    ],
)
def test_words_after_the_file_that_llamafactory_reads_as_keys_are_one_line(tmp_path, tail, said):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("model_name_or_path: m\n")
    read = llamafactory_reads([str(cfg), *tail])
    assert set(read) - {"model_name_or_path", "lora_rank"} or read.get("lora_rank", 0) is None
    with pytest.raises(UsageError, match="Some keys are not used by the HfArgumentParser") as ours:
        load_launch_args([str(cfg), *tail])
    assert said in str(ours.value) and "\n" not in str(ours.value)
