"""fp16 -> bf16 where bf16 is real; fp16 kept with a reason on gfx906/gfx908; CPU gets use_cpu."""

import pytest

from llamafactory_rocm.findings import Level
from llamafactory_rocm.rules import precision
from tests.conftest import make_ctx


@pytest.mark.parametrize("name", ["mi300x", "mi300x_8gpu", "mi250x", "rx7900xtx", "w7900", "rx7800xt"])
def test_fp16_becomes_bf16_on_archs_with_bf16_matrix_units(name):
    step = precision.prefer_bf16({"fp16": True}, {}, make_ctx(name))
    assert step.config["fp16"] is False and step.config["bf16"] is True
    assert [f.code for f in step.findings] == ["PRECISION_FP16_TO_BF16"]
    assert step.findings[0].level is Level.CHANGE


def test_fp16_is_kept_on_mi100_because_bf16_is_half_the_rate():
    step = precision.prefer_bf16({"fp16": True}, {}, make_ctx("mi100"))
    assert step.config == {"fp16": True}
    (finding,) = step.findings
    assert finding.code == "PRECISION_FP16_KEPT" and finding.level is Level.WARNING
    assert "half the fp16" in finding.message and "gfx908" in finding.message


def test_fp16_is_kept_on_mi50_because_it_has_no_bf16_matrix_units():
    step = precision.prefer_bf16({"fp16": True}, {}, make_ctx("mi50"))
    assert step.config == {"fp16": True}
    assert "gfx906 has no bf16 matrix units" in step.findings[0].message


def test_fp16_on_cpu_only_becomes_bf16_with_use_cpu():
    step = precision.prefer_bf16({"fp16": True}, {}, make_ctx("cpu_only"))
    assert step.config == {"fp16": False, "bf16": True, "use_cpu": True}
    assert step.findings[0].code == "PRECISION_CPU_FP16"


def test_fp16_on_cuda_is_left_alone():
    step = precision.prefer_bf16({"fp16": True}, {}, make_ctx("cuda_h200"))
    assert step.config == {"fp16": True} and step.findings == []


def test_bf16_on_cpu_gets_use_cpu():
    step = precision.bf16_on_cpu_needs_use_cpu({"bf16": True}, {}, make_ctx("cpu_only"))
    assert step.config == {"bf16": True, "use_cpu": True}
    assert precision.bf16_on_cpu_needs_use_cpu({"bf16": True}, {}, make_ctx("mi300x")).findings == []


def test_bf16_on_mi50_warns_that_torch_reports_it_supported_anyway():
    step = precision.warn_bf16_without_matrix_units({"bf16": True}, {}, make_ctx("mi50"))
    assert step.findings[0].code == "BF16_NOT_NATIVE"
    assert precision.warn_bf16_without_matrix_units({"bf16": True}, {}, make_ctx("mi300x")).findings == []


def test_pure_bf16_is_refused_where_bf16_is_not_real_never_quietly_dropped():
    refused = precision.pure_bf16_only_where_real({"pure_bf16": True}, {}, make_ctx("mi50"))
    assert refused.config["pure_bf16"] is True  # not turned into fp32 training behind the user's back
    assert [(f.code, f.level) for f in refused.findings] == [("PURE_BF16_UNSUPPORTED", Level.ERROR)]
    kept = precision.pure_bf16_only_where_real({"pure_bf16": True}, {}, make_ctx("mi300x"))
    assert kept.config["pure_bf16"] is True and kept.findings == []


@pytest.mark.parametrize(
    "snapshot, keep, drop", [("mi300x", "bf16", "fp16"), ("mi50", "fp16", "bf16"), ("cpu_only", "bf16", "fp16")]
)
def test_fp16_and_bf16_together_are_refused_naming_the_one_to_keep(snapshot, keep, drop):
    step = precision.one_half_precision({"fp16": True, "bf16": True}, {}, make_ctx(snapshot))
    (finding,) = step.findings
    assert finding.code == "PRECISION_CONFLICT" and finding.level is Level.ERROR
    assert finding.key == drop and f"keep {keep}: true" in finding.fix
    assert precision.one_half_precision({"fp16": False, "bf16": True}, {}, make_ctx(snapshot)).findings == []


def test_string_booleans_from_dict_users_count():
    step = precision.prefer_bf16({"fp16": "true"}, {}, make_ctx("mi300x"))
    assert step.config["bf16"] is True


@pytest.mark.parametrize(("name", "cited"), [("mi250x", "pytorch#182952"), ("rx7900xtx", "jax-ml/jax#21187")])
def test_the_rewrite_cites_the_failure_recorded_for_that_arch(name, cited):
    (finding,) = precision.prefer_bf16({"fp16": True}, {}, make_ctx(name)).findings
    assert cited in finding.message


def test_transformers_refuses_fp16_and_bf16_together_on_this_machine():
    """The oracle for PRECISION_CONFLICT: transformers' own TrainingArguments, not our rule."""
    from transformers import TrainingArguments

    with pytest.raises(ValueError, match="At most one of fp16 and bf16 can be True"):
        TrainingArguments(output_dir="unused", fp16=True, bf16=True, use_cpu=True)


@pytest.mark.parametrize("snapshot", ["mi300x", "mi250x", "rx7900xtx", "mi100", "mi50", "cpu_only", "cuda_h200"])
def test_fp16_and_bf16_together_stay_refused_through_every_rule_on_every_machine(snapshot):
    from llamafactory_rocm.rules import resolve

    config = {"fp16": True, "bf16": True}
    resolution = resolve(config, {}, make_ctx(snapshot))
    assert resolution.config["fp16"] is True and resolution.config["bf16"] is True  # never silently resolved
    conflicts = [f for f in resolution.findings if f.code == "PRECISION_CONFLICT"]
    assert [f.level for f in conflicts] == [Level.ERROR]
    rewrites = {"PRECISION_FP16_TO_BF16", "PRECISION_CPU_FP16", "PRECISION_CPU_USE_CPU"}
    assert not rewrites & {f.code for f in resolution.findings}
