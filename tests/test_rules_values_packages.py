"""Values LLaMA-Factory's parser cannot convert, and packages a config's keys need."""

import contextlib
from dataclasses import replace

import pytest

from llamafactory_rocm.findings import Level
from llamafactory_rocm.lf.schema import load_schema
from llamafactory_rocm.rules import packages, values
from tests.conftest import make_ctx


@pytest.fixture(scope="module")
def ctx():
    return replace(make_ctx("cpu_only"), schema=load_schema())


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("max_steps", "abc", "a whole number"),
        ("lora_rank", 1.5, "a whole number"),
        ("learning_rate", "fast", "a number"),
        ("bf16", "maybe", "true or false"),
        ("template", "llama99", "a template LLaMA-Factory has"),
    ],
)
def test_each_value_the_parser_refuses_is_one_finding_naming_key_value_and_type(ctx, key, value, expected):
    (finding,) = values.refuse_unconvertible_values({key: value}, {}, ctx).findings
    assert (finding.code, finding.level, finding.key) == ("VALUE_INVALID", Level.ERROR, key)
    assert repr(value) in finding.message and expected in finding.message


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("stage", "foo", "one of: pt, sft, rm, ppo, dpo, kto"),
        ("lr_scheduler_type", "wavy", "one of: linear, cosine"),
        ("pref_loss", "hinge2", "one of: sigmoid, hinge"),
    ],
)
def test_a_value_outside_its_choices_is_said_and_never_refused_here(ctx, key, value, expected):
    """parse_dict checks no choices (LLaMA-Factory trains pref_loss: hinge2); LLaMA-Factory's own parser and
    the dry run refuse the ones the run stops on, in their words (tests/test_verdict_corpus.py)."""
    step = values.refuse_unconvertible_values({key: value}, {}, ctx)
    (finding,) = step.findings
    assert (finding.code, finding.level, finding.key, finding.old) == ("VALUE_NOT_A_CHOICE", Level.WARNING, key, value)
    assert expected in finding.message and step.config == {key: value}


def test_llamafactory_checks_no_choices_in_a_config_file():
    """The premise of VALUE_NOT_A_CHOICE, asked of the parser LLaMA-Factory reads YAML with: parse_dict
    builds the dataclasses with a Literal field outside its choices."""
    from llamafactory.hparams import FinetuningArguments
    from transformers import HfArgumentParser

    (finetuning,) = HfArgumentParser(FinetuningArguments).parse_dict({"stage": "dpo", "pref_loss": "hinge2"})
    assert finetuning.pref_loss == "hinge2"


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--pref_loss", "hinge2"], "--pref_loss/--pref-loss: invalid choice: 'hinge2'"),
        (["--stage", "foo"], "argument --stage: invalid choice: 'foo'"),
    ],
)
def test_on_the_command_line_a_value_outside_its_choices_is_argparses_refusal(argv, said, capsys):
    from transformers import HfArgumentParser

    from llamafactory_rocm.errors import UsageError
    from llamafactory_rocm.lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.hparams.parser import _TRAIN_ARGS
    with pytest.raises(SystemExit) as stock:  # the oracle: LLaMA-Factory's flag form, its own parser
        HfArgumentParser(_TRAIN_ARGS).parse_args_into_dataclasses(["--model_name_or_path", "m", *argv])
    assert stock.value.code == 2 and said in capsys.readouterr().err
    with pytest.raises(UsageError) as ours:
        load_schema().flags_to_config(argv)
    assert said in str(ours.value)


@pytest.mark.parametrize(
    "config",
    [
        {"max_steps": 2, "learning_rate": 1.0e-4, "bf16": True, "stage": "sft", "template": "llama3"},
        {"learning_rate": 1, "bf16": "true", "do_train": 1, "lora_target": "q_proj,v_proj"},
        {"quantization_bit": None, "lr_scheduler_type": "cosine", "report_to": "none"},
    ],
)
def test_values_the_trainer_takes_as_they_are_pass_untouched(ctx, config):
    step = values.refuse_unconvertible_values(config, {}, ctx)
    assert step.findings == [] and step.config == config


@pytest.mark.parametrize(
    "key, value, new",
    [
        ("learning_rate", "5e-5", 5e-5),
        ("learning_rate", "1e-4", 1e-4),
        ("cutoff_len", "1024", 1024),
        ("max_steps", 2.0, 2),
        ("lora_rank", 8.0, 8),
        ("max_samples", "1e3", 1000),
        ("bf16", "false", False),
    ],
)
def test_a_value_with_one_lossless_meaning_in_its_type_is_rewritten_and_said(ctx, key, value, new):
    step = values.refuse_unconvertible_values({key: value, "stage": "sft"}, {}, ctx)
    (finding,) = step.findings
    assert (finding.code, finding.level, finding.key, finding.old, finding.new) == (
        "VALUE_COERCED",
        Level.CHANGE,
        key,
        value,
        new,
    )
    assert step.config == {key: new, "stage": "sft"} and type(step.config[key]) is type(new)
    assert repr(value) in finding.message


def test_llamafactory_hands_yaml_values_to_the_dataclasses_unconverted():
    """The premise of VALUE_COERCED, asked of LLaMA-Factory's own parser (parse_dict converts nothing),
    so the rule is revisited if a release starts converting."""
    from transformers import HfArgumentParser

    from llamafactory_rocm.lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.hparams.parser import _TRAIN_ARGS

    _, data, training, *_ = HfArgumentParser(_TRAIN_ARGS).parse_dict(
        {"model_name_or_path": "unused", "output_dir": "unused", "use_cpu": True}
        | {"learning_rate": "5e-5", "cutoff_len": "1024", "bf16": "false"}
    )
    assert training.learning_rate == "5e-5" and data.cutoff_len == "1024"
    assert training.bf16 == "false"  # a true string: the run would train in bf16


def test_the_flag_form_is_read_by_llamafactorys_own_parser():
    schema = load_schema()
    argv = ["--stage", "sft", "--do_train", "--no_use_fast_tokenizer", "--max_steps", "3"]
    argv += ["--learning_rate", "1e-4", "--bf16", "false"]
    config = schema.flags_to_config([*argv, "--backend", "pt", "--compute_dtype=bfloat16"])
    assert config == {
        "stage": "sft",
        "do_train": True,
        "use_fast_tokenizer": False,
        "max_steps": 3,
        "learning_rate": 1e-4,
        "bf16": False,
        "backend": "pt",  # not LLaMA-Factory's: kept for the rules to translate or refuse
        "compute_dtype": "bfloat16",
    }
    assert schema.flags_to_config(["--max_steps", "abc"]) == {"max_steps": "abc"}  # a finding, not an exit


def _this_machine(name: str):
    """A recorded machine read as if probed here (the check asks this machine's packages)."""
    ctx = make_ctx(name)
    return replace(ctx, snapshot=ctx.snapshot.model_copy(update={"source": "probe"}))


def test_a_missing_package_is_an_error_here_and_a_requirement_when_planning():
    here = replace(_this_machine("cpu_only"), installed=frozenset({"torch"}))
    found = packages.require_packages({"plot_loss": True, "deepspeed": "ds.json"}, {}, here).findings
    assert sorted((f.code, f.key, f.level) for f in found) == [
        ("PACKAGE_MISSING", "deepspeed", Level.ERROR),
        ("PACKAGE_MISSING", "plot_loss", Level.ERROR),
    ]
    planned = replace(make_ctx("mi300x"), installed=frozenset({"torch"}))
    found = packages.require_packages({"deepspeed": "ds.json"}, {}, planned).findings
    assert [(f.code, f.level) for f in found] == [("PACKAGE_REQUIRED", Level.INFO)]
    installed = replace(here, installed=frozenset({"matplotlib", "deepspeed"}))
    assert packages.require_packages({"plot_loss": True, "deepspeed": "ds.json"}, {}, installed).findings == []


def test_bitsandbytes_is_left_to_the_arch_rule_on_rocm():
    rocm = replace(make_ctx("mi300x"), installed=frozenset())
    assert packages.require_packages({"quantization_bit": 4}, {}, rocm).findings == []
    cpu = replace(_this_machine("cpu_only"), installed=frozenset())
    (finding,) = packages.require_packages({"quantization_bit": 4}, {}, cpu).findings
    assert finding.key == "quantization_bit" and "bitsandbytes" in finding.message


@pytest.mark.parametrize(
    "method, quantization_config",
    [("bnb", None), ("bitsandbytes", None), ("hqq", None), ("bnb", {"quant_method": "gptq", "bits": 4})],
)
def test_bitsandbytes_is_needed_exactly_when_llamafactorys_quantization_asks_for_it(method, quantization_config):
    """The oracle is LLaMA-Factory's own configure_quantization, its check_version calls recorded: a PTQ
    model ignores quantization_bit, and only quantization_method "bnb" loads bitsandbytes."""
    import types

    from llamafactory_rocm.lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.hparams import ModelArguments
        from llamafactory.model.model_utils import quantization

    asked: list[str] = []
    original = quantization.check_version
    quantization.check_version = lambda requirement, mandatory=False: asked.append(requirement)
    try:
        model_args = ModelArguments(model_name_or_path="m", quantization_bit=4, quantization_method=method)
        with contextlib.suppress(ImportError):  # hqq not installed: its own import check
            quantization.configure_quantization(
                types.SimpleNamespace(quantization_config=quantization_config), None, model_args, True, {}
            )
    finally:
        quantization.check_version = original
    stock = any(requirement.startswith("bitsandbytes") for requirement in asked)
    config = {"quantization_bit": 4, "quantization_method": method}
    model_config = {"quantization_config": quantization_config} if quantization_config else {}
    assert packages.quantizes_with_bitsandbytes(config, model_config) is stock
    assert any(need.key == "quantization_bit" for need in packages.required_packages(config, model_config)) is stock


def test_the_packages_a_config_needs_are_llamafactorys_own_check_version_calls():
    """The oracle is LLaMA-Factory's _check_extra_dependencies on its real argument dataclasses, its
    check_version calls recorded: every mandatory call, version floors included; predict's are its own rule's."""
    from transformers import HfArgumentParser

    from llamafactory_rocm.lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.hparams import parser
    config = {"use_kt": True, "use_badam": True, "finetuning_type": "full", "mixture_of_depths": "convert"}
    config["predict_with_generate"] = True
    model_args, _, training_args, finetuning_args, _ = HfArgumentParser(parser._TRAIN_ARGS).parse_dict(
        {"model_name_or_path": "m", "output_dir": "o", **config}
    )
    asked: list[tuple[str, bool]] = []
    original = parser.check_version
    parser.check_version = lambda requirement, mandatory=False: asked.append((requirement, mandatory))
    try:
        parser._check_extra_dependencies(model_args, finetuning_args, training_args)
    finally:
        parser.check_version = original
    stock = {requirement for requirement, mandatory in asked if mandatory} - {"jieba", "nltk", "rouge_chinese"}
    assert {need.requirement for need in packages.required_packages(config)} == stock
    assert {"badam>=1.2.1", "kt-kernel", "mixture-of-depth>=1.1.6"} <= stock


def test_a_package_below_llamafactorys_floor_is_missing_and_planning_names_the_floor():
    old_badam = replace(
        _this_machine("cpu_only"),
        installed=frozenset({"badam"}),
        snapshot=_this_machine("cpu_only").snapshot.model_copy(update={"packages": {"badam": "1.0.0"}}),
    )
    (finding,) = packages.require_packages({"use_badam": True}, {}, old_badam).findings
    assert (finding.code, finding.key) == ("PACKAGE_MISSING", "use_badam")
    assert "badam>=1.2.1" in finding.message and "badam 1.0.0 is installed" in finding.message
    planned = replace(make_ctx("mi300x"), installed=frozenset())
    found = packages.require_packages({"use_kt": True}, {}, planned).findings
    assert [(f.code, f.key) for f in found] == [("PACKAGE_REQUIRED", "use_kt")] * 3


def test_rules_read_absent_keys_as_llamafactorys_field_defaults():
    """lf_value: the config's value, else the default of LLaMA-Factory's own dataclass field (an enum's
    value), so a rule never carries its own copy of a default."""
    import dataclasses

    from llamafactory_rocm.lf.text_only import text_only_llamafactory
    from llamafactory_rocm.rules.base import lf_value

    with text_only_llamafactory():
        from llamafactory.hparams.parser import _TRAIN_ARGS
    fields = {f.name: f for cls in _TRAIN_ARGS for f in dataclasses.fields(cls)}
    for key in ("flash_attn", "infer_backend", "export_device", "quantization_method", "ray_num_workers"):
        default = fields[key].default
        assert lf_value({}, key, object()) == getattr(default, "value", default)
        assert lf_value({key: "given"}, key, None) == "given"
    assert lf_value({}, "not_a_key", "fallback") == "fallback"
