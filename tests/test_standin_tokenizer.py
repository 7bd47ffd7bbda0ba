"""The stand-in tokenizers (llamafactory_rocm/standin/) in the real readers: transformers' AutoTokenizer and
LLaMA-Factory's load_tokenizer, get_template_and_fix_tokenizer and sft data pipeline on the bundled data.

Oracles: Llama 3's special-token ids are those of Meta's tokenizer (128000 <|begin_of_text|> .. 128009
<|eot_id|>, Llama 3.1's layout; bench/bench_standin_tokenizer.py compares the stand-in's counts with the real
tokenizer's), Qwen3's those of Qwen3's tokenizer_config.json; the bundled shapes' vocab_size bound every id.
LLaMA-Factory adds a template's missing special tokens itself (Template.fix_special_tokens), so a stand-in
without them grows past its 128,256 ids here and its rows hold several ids where one is wanted. No network:
the real tokenizers are the bench's alone.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

import llamafactory_rocm.models
from llamafactory_rocm.resources import datasets_dir
from llamafactory_rocm.standin import StandinInfo, standin_family, write_tokenizer
from llamafactory_rocm.standin.tokenizer import recorded_errors

# family -> (template, bundled shape, {special token: its id in the family's own tokenizer}, length)
FAMILIES: dict[str, tuple[str, str, dict[str, int], int]] = {
    "llama3": (
        "llama3",
        "llama3_8b",
        {
            "<|begin_of_text|>": 128000,
            "<|end_of_text|>": 128001,
            "<|start_header_id|>": 128006,
            "<|end_header_id|>": 128007,
            "<|eom_id|>": 128008,
            "<|eot_id|>": 128009,
        },
        128256,
    ),
    "qwen3": (
        "qwen3",
        "qwen3_8b",
        {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<think>": 151667, "</think>": 151668},
        151669,
    ),
}
TEMPLATES = [("llama3", "llama3"), ("qwen3", "qwen3"), ("qwen3", "qwen3_nothink")]
# A line as Llama 3's own tokenizer splits it (the bench's npm copy, 2026-12-07): numbers in groups of up to
# three digits from the left, a space before a number its own token. Qwen3's own split takes one digit a token.
LLAMA3_SPLIT = (
    "ROCm 6.4 since 2024-05-12: 12345",
    ["ROC", "m", "Ġ", "6", ".", "4", "Ġsince", "Ġ", "202", "4", "-", "05", "-", "12", ":", "Ġ", "123", "45"],
)


def shape_config(shape: str) -> dict[str, Any]:
    """The bundled shape's config.json (llamafactory_rocm/models/<shape>.json, its ``config``)."""
    folder = Path(llamafactory_rocm.models.__file__).parent
    return json.loads((folder / f"{shape}.json").read_text(encoding="utf-8"))["config"]


def sft_input_ids(folder: Path, template: str, dataset: str, work: Path) -> list[list[int]]:
    """Each row's input_ids from LLaMA-Factory's sft pipeline on the bundled ``dataset`` with the tokenizer in
    ``folder`` (no cutoff): what the trainer would get, as the dry run gets it."""
    _, ids = _sft_pipeline(folder, template, dataset, work)
    return ids


def _sft_pipeline(folder: Path, template: str, dataset: str, work: Path) -> tuple[Any, list[list[int]]]:
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    model_args, data_args, training_args, _, _ = get_train_args(
        {
            "model_name_or_path": str(folder),
            "stage": "sft",
            "do_train": True,
            "finetuning_type": "lora",
            "dataset": dataset,
            "dataset_dir": str(datasets_dir()),
            "template": template,
            "cutoff_len": 1_000_000,
            "output_dir": str(work / "out"),
            "cache_dir": str(work / "cache"),
            "overwrite_cache": True,
            "report_to": "none",
        }
    )
    module = load_tokenizer(model_args)
    fixed = get_template_and_fix_tokenizer(module["tokenizer"], data_args)
    data = get_dataset(fixed, model_args, data_args, training_args, stage="sft", **module)
    return module["tokenizer"], list(data["train_dataset"]["input_ids"])


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, StandinInfo]]:
    root = tmp_path_factory.mktemp("standin")
    return {family: (root / family, write_tokenizer(family, root / family)) for family in FAMILIES}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_transformers_reads_each_special_token_as_the_familys_own_id(family: str, folders) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folders[family][0])
    _, _, specials, length = FAMILIES[family]
    assert len(tokenizer) == length
    for text, wanted in specials.items():
        assert tokenizer.encode(text, add_special_tokens=False) == [wanted], text
    assert tokenizer.decode(tokenizer.encode("ROCm 6.4 on MI300X", add_special_tokens=False)) == "ROCm 6.4 on MI300X"
    if family == "llama3":
        assert tokenizer.tokenize(LLAMA3_SPLIT[0]) == LLAMA3_SPLIT[1]
        assert tokenizer("hi").input_ids[0] == 128000  # <|begin_of_text|> first, as Llama 3's tokenizer adds it
    # The family's own chat format, as apply_chat_template writes it.
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert (
        chat
        == {
            "llama3": "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
            "qwen3": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        }[family]
    )


@pytest.mark.parametrize(("family", "template"), TEMPLATES)
def test_llamafactory_runs_its_sft_pipeline_on_the_bundled_data_with_ids_inside_the_embedding(
    family: str, template: str, folders, tmp_path: Path
) -> None:
    tokenizer, rows = _sft_pipeline(folders[family][0], template, "amd_finetune_qa", tmp_path)
    _, shape, _, length = FAMILIES[family]
    vocab_size = shape_config(shape)["vocab_size"]
    # LLaMA-Factory added no token (a template's missing stop word would be added here): nothing to resize, and
    # the model built from the bundled config keeps its vocab_size rows with or without resize_vocab.
    assert len(tokenizer) == length <= vocab_size
    assert len(rows) == len(json.loads((datasets_dir() / "amd_finetune_qa.json").read_text(encoding="utf-8")))
    assert max(max(row) for row in rows) < vocab_size
    # Every row opens with the family's own header ids and ends with its own end-of-turn id: the template's
    # special tokens are one id each (a text that quotes them reads them as the real tokenizer does).
    opening, closing = {"llama3": ([128000, 128006], [128009]), "qwen3": ([151644], [151645, 198])}[family]
    for row in rows:  # 198: the newline after Qwen3's <|im_end|>
        assert row[: len(opening)] == opening and row[-len(closing) :] == closing, tokenizer.decode(row)
    # resize_vocab: true on the model built from the bundled config (meta device, as the dry run builds it):
    # LLaMA-Factory's resize keeps its rows.
    assert _rows_after_resize(shape_config(shape), tokenizer) == vocab_size


def _rows_after_resize(config: dict[str, Any], tokenizer: Any) -> int:
    import torch
    from llamafactory.model.model_utils.embedding import resize_embedding_layer
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = {key: value for key, value in config.items() if key not in ("model_type", "torch_dtype")}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **shape))
    resize_embedding_layer(model, tokenizer)
    return model.get_input_embeddings().weight.shape[0]


def test_each_recorded_error_names_its_measure_command_and_date(folders) -> None:
    recorded = recorded_errors()
    assert set(recorded) == set(FAMILIES)
    for family, entry in recorded.items():
        assert entry["command"].startswith("python bench/bench_standin_tokenizer.py")
        assert datetime.date.fromisoformat(entry["date"]) <= datetime.date.today()
        assert entry["rows"] > 0 and entry["datasets"]
        info = folders[family][1]
        assert info.family == family and info.error is not None
        assert (
            entry["command"] in info.error
            and entry["date"] in info.error
            and f"{entry['total_pct']:+.2f}%" in info.error
        )
    # Qwen3's shipped tokenizer is Qwen3's own: its counts are the real ones, to the token.
    assert folders["qwen3"][1].exact and recorded["qwen3"]["standin_tokens"] == recorded["qwen3"]["real_tokens"]
    assert not folders["llama3"][1].exact


@pytest.mark.parametrize(
    ("shape", "hub_id", "family"),
    [
        ("llama3_8b", "meta-llama/Meta-Llama-3-8B-Instruct", "llama3"),
        ("llama3_8b", "meta-llama/Llama-3.1-8B", "llama3"),
        ("qwen3_8b", "Qwen/Qwen3-8B", "qwen3"),
        ("qwen3_4b", "Qwen/Qwen3-4B", "qwen3"),
        ("qwen3_30b_a3b", "Qwen/Qwen3-30B-A3B", "qwen3"),
        ("mixtral_defaults", "mistralai/Mixtral-8x7B-v0.1", None),
        ("gpt_oss_20b", "openai/gpt-oss-20b", None),
        ("deepseek_v3_defaults", "deepseek-ai/DeepSeek-V3", None),
    ],
)
def test_the_family_is_the_bundled_shapes_own(shape: str, hub_id: str, family: str | None) -> None:
    assert standin_family(shape_config(shape), hub_id) == family


def test_a_family_whose_ids_would_pass_the_embedding_gets_none() -> None:
    assert standin_family({"model_type": "llama", "vocab_size": 32000}, "meta-llama/Llama-2-7b-hf") is None
    assert standin_family({"model_type": "qwen3", "vocab_size": 151000}, "someone/Qwen3-cut") is None
    assert standin_family({}, "meta-llama/Llama-3.2-1B-Instruct") == "llama3"  # no config: the hub id says it
    assert standin_family({}, "mistralai/Mistral-7B-v0.1") is None


def test_an_unknown_family_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match="no stand-in tokenizer for family 'gemma3'; the families shipped: llama3, qwen3"
    ):
        write_tokenizer("gemma3", tmp_path)
