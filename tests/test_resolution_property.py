"""A resolution never contradicts itself (issue 14, item 4).

Over generated configs and every recorded machine: whenever ``check`` says ok, LLaMA-Factory's own
``get_train_args`` accepts the resolved config (with that machine's device answers), and whenever it
refuses the resolved config, ``check`` is not ok. A request the card cannot honour is refused, never
quietly degraded: ``pure_bf16`` that ``check`` accepts is still ``pure_bf16`` in the resolved config.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamafactory_rocm.check.run import check_config, device_answers
from llamafactory_rocm.lf.schema import load_schema
from llamafactory_rocm.lf.verdict import parser_verdict
from tests.conftest import ALL_SNAPSHOTS, load_snapshot

ABSENT = object()


def mostly_absent(*values: object) -> st.SearchStrategy[object]:
    """Absent three times in four, so that most configs reach LLaMA-Factory's own check."""
    return st.one_of(st.just(ABSENT), st.just(ABSENT), st.just(ABSENT), st.sampled_from(values))


BOOL = (True, False)
CONFIGS = st.fixed_dictionaries(
    {
        "stage": st.sampled_from(["sft", "sft", "pt", "rm"]),
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
        "max_steps": mostly_absent(2, "abc", 1.5),
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
def test_ok_means_llamafactory_accepts_the_resolved_config_and_refused_means_not_ok(
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
    snapshot = load_snapshot(snapshot_name)
    before = copy.deepcopy(config)
    report = check_config(config, snapshot=snapshot)
    assert config == before  # the input is resolved as a copy
    verdict = parser_verdict(report.config, device_answers(report.snapshot))
    problems = load_schema().value_problems(report.config)
    if report.ok:
        assert verdict.accepted, (snapshot_name, config, verdict.message)
        assert not problems, problems
        if config.get("pure_bf16") is True:  # honoured or refused, never dropped
            assert report.config["pure_bf16"] is True
    if not verdict.accepted or problems:
        assert not report.ok, (snapshot_name, config)
