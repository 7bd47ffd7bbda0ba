"""Generated configs against LLaMA-Factory's real run (issue 20, item 5), and two cheap properties.

The oracle is stock LLaMA-Factory itself, not the package's own reading of it: a small fixed sample of
generated configs (hypothesis, derandomized; stages sft, pt, rm, dpo and kto, each with its own kind of
dataset or another kind) for the tiny model, one step on CPU (tests/property_oracle.py):

- ``check`` ok => stock ``llamafactory-cli train`` (hook off) trains the RESOLVED config;
- ``check`` refuses => stock LLaMA-Factory fails on the INPUT config.

``bench/bench_property.py --examples 60`` runs a larger sample with the same oracle and prints the counts.

Cheap, in-process, over many configs and every recorded machine: the input is never modified (the
resolution is a copy), and a ``pure_bf16`` that ``check`` accepts is still ``pure_bf16`` in the resolved
config (a request the card cannot honour is refused, never quietly dropped).
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamafactory_rocm.check.run import check_config
from tests.conftest import ALL_SNAPSHOTS, load_snapshot
from tests.property_oracle import run_oracle, sample, summary

ABSENT = object()
ORACLE_EXAMPLES = 10


def mostly_absent(*values: object) -> st.SearchStrategy[object]:
    """Absent three times in four, so that most configs reach LLaMA-Factory's own check."""
    return st.one_of(st.just(ABSENT), st.just(ABSENT), st.just(ABSENT), st.sampled_from(values))


BOOL = (True, False)
CONFIGS = st.fixed_dictionaries(
    {
        "stage": st.sampled_from(["sft", "sft", "pt", "rm", "dpo", "kto"]),
        "finetuning_type": mostly_absent("lora", "full", "freeze"),
        "fp16": mostly_absent(*BOOL),
        "bf16": mostly_absent(*BOOL),
        "pure_bf16": mostly_absent(*BOOL),
        "use_cpu": mostly_absent(*BOOL),
        "tf32": mostly_absent(*BOOL),
        "compute_dtype": mostly_absent("bfloat16", "float16", "int3"),
        "backend": mostly_absent("pt", "deepspeed"),
        "flash_attn": mostly_absent("auto", "sdpa", "fa2"),
        "quantization_bit": mostly_absent(4, 8),
        "predict_with_generate": mostly_absent(*BOOL),
        "do_predict": mostly_absent(*BOOL),
        "do_eval": mostly_absent(*BOOL),
        "val_size": mostly_absent(0.1),
        "max_steps": mostly_absent(2, "abc", 1.5, "2"),
        "learning_rate": mostly_absent("5e-5", 1.0e-4),
        "lr_scheduler_type": mostly_absent("cosine", "wavy"),
        "neat_packing": mostly_absent(*BOOL),
        "train_on_prompt": mostly_absent(*BOOL),
        "plot_loss": mostly_absent(*BOOL),
    }
)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    rows = [{"instruction": f"q{i}", "input": "", "output": f"a{i}"} for i in range(4)]
    (folder / "rows.json").write_text(json.dumps(rows))
    (folder / "dataset_info.json").write_text(json.dumps({"rows": {"file_name": "rows.json"}}))
    return folder


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(generated=CONFIGS, snapshot_name=st.sampled_from(ALL_SNAPSHOTS))
def test_the_input_is_never_modified_and_pure_bf16_is_never_dropped(
    generated, snapshot_name, data_dir, tmp_path_factory
):
    config = {key: value for key, value in generated.items() if value is not ABSENT}
    output_dir = tmp_path_factory.mktemp("out")
    config.update(
        model_name_or_path="some-org/some-model",
        do_train=True,
        dataset="rows",
        dataset_dir=str(data_dir),
        template="default",
        output_dir=str(output_dir),
    )
    before = copy.deepcopy(config)
    report = check_config(config, snapshot=load_snapshot(snapshot_name))
    assert config == before  # the input is resolved as a copy
    if report.ok and config.get("pure_bf16") is True:  # honoured or refused, never dropped
        assert report.config["pure_bf16"] is True


@pytest.mark.trainer
def test_check_agrees_with_stock_llamafactory_on_generated_configs(tiny_model, tmp_path):
    started = time.monotonic()
    choices = sample(ORACLE_EXAMPLES)
    examples = run_oracle(choices, tiny_model, tmp_path)
    print(f"\n{summary(examples)}\n({time.monotonic() - started:.0f} s)")
    asked = [e for e in examples if e.agrees is not None]
    # the sample asks both directions, and dpo/kto/rm are in it
    assert any(e.check_ok for e in asked) and any(not e.check_ok for e in asked), summary(examples)
    assert {"dpo", "kto", "rm"} <= {e.input["stage"] for e in examples}, [e.input["stage"] for e in examples]
    assert all(e.agrees for e in asked), summary(examples)
