"""LLaMA-Factory's verdict on rows: planted converter failures give the counts its own preprocessing logs,
on alpaca, sharegpt and openai data; and the dataset commands around it (register, findings, CLI)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from llamafactory_rocm.cli.main import main
from llamafactory_rocm.dataset import add_dataset, config_dataset_findings, validate_dataset
from llamafactory_rocm.dataset.validate import CheckOptions
from llamafactory_rocm.errors import EXIT_FINDINGS, EXIT_OK, UsageError
from llamafactory_rocm.findings import Level


def ok_alpaca(i: int) -> dict:
    return {"instruction": f"question {i}", "input": "", "output": f"answer {i}"}


def ok_chat(i: int, role: str = "from", content: str = "value", user: str = "human", bot: str = "gpt") -> dict:
    return [{role: user, content: f"q{i}"}, {role: bot, content: f"a{i}"}]


# (formatting, entry extras, rows with planted defects, lines LLaMA-Factory drops)
PLANTED = {
    "alpaca": (
        {},
        [ok_alpaca(0), {"instruction": "q", "input": ""}, ok_alpaca(2), {"instruction": "q", "output": None}],
        [2, 4],
    ),
    "sharegpt": (
        {"formatting": "sharegpt"},
        [
            {"conversations": ok_chat(0)},
            {"conversations": list(reversed(ok_chat(1)))},  # roles out of order
            {"conversations": ok_chat(2)[:1]},  # no response
            {"conversations": ok_chat(3)},
        ],
        [2, 3],
    ),
    "openai": (
        {
            "formatting": "openai",
            "columns": {"messages": "messages"},
            "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
        },
        [
            {"messages": ok_chat(0, "role", "content", "user", "assistant")},
            {"messages": list(reversed(ok_chat(1, "role", "content", "user", "assistant")))},
            {"messages": ok_chat(2, "role", "content", "user", "assistant")[:1]},
        ],
        [2, 3],
    ),
}


def write(folder: Path, name: str, rows: list, entry: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    info = folder / "dataset_info.json"
    current = json.loads(info.read_text()) if info.exists() else {}
    info.write_text(json.dumps({**current, name: {"file_name": f"{name}.jsonl", **entry}}))
    return folder


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.dropped += record.getMessage().startswith("Dropped invalid example")


def llamafactory_drops(
    tiny_model: Path, folder: Path, name: str, tmp_path: Path, stage: str = "sft"
) -> tuple[int, int]:
    """(rows dropped as LLaMA-Factory's own preprocessing logs them, rows it keeps), with the tiny tokenizer."""
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    config = {"model_name_or_path": str(tiny_model), "stage": stage, "do_train": True, "template": "llama3"}
    config |= {"dataset": name, "dataset_dir": str(folder), "output_dir": str(tmp_path / "o"), "report_to": "none"}
    config |= {"finetuning_type": "lora", "cache_dir": str(tmp_path / "c"), "overwrite_cache": True}
    model_args, data_args, training_args, *_ = get_train_args(config)
    module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(module["tokenizer"], data_args)
    count, root = _Count(), logging.getLogger("llamafactory")
    root.addHandler(count)
    try:
        data = get_dataset(template, model_args, data_args, training_args, stage, **module)
    finally:
        root.removeHandler(count)
    return count.dropped, len(data["train_dataset"])


# Other stages' processors and drop rules: (entry, rows with a planted defect, lines LLaMA-Factory drops)
ALPACA_COLUMNS = {"prompt": "instruction", "query": "input"}
STAGES = {
    "rm": (
        {"ranking": True, "columns": {**ALPACA_COLUMNS, "chosen": "chosen", "rejected": "rejected"}},
        [{"instruction": f"q{i}", "input": "", "chosen": "a", "rejected": "b"} for i in range(3)],
        {"rejected": None},
    ),
    "kto": (
        {"columns": {**ALPACA_COLUMNS, "response": "output", "kto_tag": "kto_tag"}},
        [{**ok_alpaca(i), "kto_tag": bool(i % 2)} for i in range(3)],
        {"kto_tag": None},
    ),
}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_other_stages_drop_what_llamafactory_drops(tiny_model, tmp_path, stage):
    entry, rows, defect = STAGES[stage]
    rows[1] = {**rows[1], **defect}
    folder = write(tmp_path / "data", "d", rows, entry)
    report = validate_dataset("d", folder, options=CheckOptions(stage=stage))
    assert llamafactory_drops(tiny_model, folder, "d", tmp_path, stage) == (report.dropped, report.kept) == (1, 2)
    assert [r.line for r in report.dropped_rows] == [2] and report.ok and not report.errors
    assert not any("empty response" in w for w in report.warnings)  # KTO's own empty marker is not one


@pytest.mark.parametrize("formatting", sorted(PLANTED))
def test_planted_row_defects_get_llamafactorys_own_counts(tiny_model, tmp_path, formatting):
    entry, rows, lines = PLANTED[formatting]
    folder = write(tmp_path / "data", "d", rows, entry)
    report = validate_dataset("d", folder, options=CheckOptions(max_dropped=1.0))
    dropped, kept = llamafactory_drops(tiny_model, folder, "d", tmp_path)
    assert (report.dropped, report.kept) == (dropped, kept)
    assert [r.line for r in report.dropped_rows] == lines
    assert report.ok and "drops 2 of" in report.warnings[0]


def test_a_missing_mapped_column_is_where_llamafactory_stops(tiny_model, tmp_path):
    rows = [{"instruction": "q", "output": "a"}] * 3  # the default mapping reads "input" too
    folder = write(tmp_path / "data", "d", rows, {})
    report = validate_dataset("d", folder)
    assert not report.ok and report.failed == 3
    assert "(column 'input' in no row" in report.errors[0]  # not the sharegpt default 'conversations'
    sharegpt = write(tmp_path / "chat", "c", [{"conversations": ok_chat(0)}, {"messages": ok_chat(1)}], {})
    report = validate_dataset("c", sharegpt, formatting="sharegpt")  # the second row lacks 'conversations'
    assert report.failed == 1 and "in no row" not in report.errors[0] and "line 2" in report.errors[0]
    with pytest.raises(KeyError, match="input"):
        llamafactory_drops(tiny_model, folder, "d", tmp_path)


def test_a_few_dropped_rows_are_a_warning_and_too_many_an_error(tmp_path):
    rows = [ok_alpaca(i) for i in range(120)]
    for i in (3, 50, 99):
        rows[i]["output"] = None
    folder = write(tmp_path / "data", "d", rows, {})
    report = validate_dataset("d", folder)
    assert report.ok and (report.rows, report.kept, report.dropped) == (120, 117, 3)
    assert [r.line for r in report.dropped_rows] == [4, 51, 100]
    strict = validate_dataset("d", folder, options=CheckOptions(max_dropped=0.01))
    assert not strict.ok and "more than the 0.01 allowed" in strict.errors[0]
    shown = validate_dataset("d", folder, options=CheckOptions(max_errors=1))
    assert len(shown.dropped_rows) == 1 and shown.dropped == 3


def test_nothing_left_is_an_error(tmp_path):
    folder = write(tmp_path / "data", "d", [{"conversations": list(reversed(ok_chat(i)))} for i in range(4)], {})
    report = validate_dataset("d", folder, formatting="sharegpt")
    assert not report.ok and "drops all 4 rows" in report.errors[0]


def test_a_value_the_loader_cannot_take_is_a_loader_error_with_its_line(tmp_path):
    rows = [ok_alpaca(0), {**ok_alpaca(1), "output": 5}]
    folder = write(tmp_path / "data", "d", rows, {})
    report = validate_dataset("d", folder)
    assert not report.ok and "datasets cannot load it" in report.errors[0] and "d.jsonl:2" in report.errors[0]


# -- dataset_info.json, findings, register, CLI ---------------------------------------------------


@pytest.mark.parametrize(
    ("text", "needle"), [('{"d": {"file_name": "d.jsonl"},}', "not valid JSON"), ("[1]", "a list")]
)
def test_a_malformed_dataset_info_is_reported_as_malformed_not_as_unknown(tmp_path, text, needle):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "dataset_info.json").write_text(text)
    _, findings = config_dataset_findings({"dataset": "d", "dataset_dir": "data"}, tmp_path)
    assert [f.code for f in findings] == ["DATASET_INVALID"]
    assert "malformed" in findings[0].message and needle in findings[0].message
    assert str(folder / "dataset_info.json") in findings[0].message
    with pytest.raises(UsageError, match="malformed"):
        validate_dataset("d", folder)


def test_findings_switch_to_the_bundled_folder_and_flag_unknown_names(tmp_path):
    config, findings = config_dataset_findings({"dataset": "amd_finetune_qa"}, tmp_path)
    assert [f.code for f in findings] == ["DATASET_DIR_BUNDLED"] and config["dataset_dir"] != "data"
    _, findings = config_dataset_findings({"dataset": "amd_finetune_qb"}, tmp_path)
    assert findings[0].code == "DATASET_UNKNOWN" and "amd_finetune_qa" in findings[0].message


def test_dataset_names_are_split_as_llamafactory_splits_them(tmp_path):
    """A trailing comma asks for a dataset called "": the oracle is LLaMA-Factory's own DataArguments and
    get_dataset_list, which stops with "Undefined dataset  in dataset_info.json"."""
    from llamafactory_rocm.lf.text_only import text_only_llamafactory

    write(tmp_path / "data", "d", [ok_alpaca(i) for i in range(4)], {})
    with text_only_llamafactory():
        from llamafactory.data.parser import get_dataset_list
        from llamafactory.hparams import DataArguments
    names = DataArguments(dataset="d,").dataset
    with pytest.raises(ValueError, match="Undefined dataset"):
        get_dataset_list(names, str(tmp_path / "data"))
    _, findings = config_dataset_findings({"dataset": "d,", "dataset_dir": "data"}, tmp_path, read_rows=True)
    assert [f.code for f in findings] == ["DATASET_UNKNOWN"] and "Undefined dataset" in findings[0].message
    _, findings = config_dataset_findings({"dataset": "d , d", "dataset_dir": "data"}, tmp_path, read_rows=True)
    assert findings == []


def test_findings_warn_for_dropped_rows_and_refuse_nothing_left(tmp_path):
    rows = [ok_alpaca(i) for i in range(10)] + [{"instruction": "q", "input": "", "output": None}]
    write(tmp_path / "data", "d", rows, {})
    _, findings = config_dataset_findings({"dataset": "d", "dataset_dir": "data"}, tmp_path)
    assert [(f.code, f.level) for f in findings] == [("DATASET_ROWS_DROPPED", Level.WARNING)]
    write(tmp_path / "data", "e", rows[-1:], {})
    _, findings = config_dataset_findings({"dataset": "e", "dataset_dir": "data"}, tmp_path)
    assert findings[0].code == "DATASET_INVALID" and "datasets validate" in findings[0].fix


def test_the_bundled_datasets_are_usable():
    from llamafactory_rocm.dataset import load_dataset_info
    from llamafactory_rocm.resources import datasets_dir

    for name in load_dataset_info(datasets_dir()):
        report = validate_dataset(name)
        assert report.ok and report.dropped == 0 and report.rows > 0, report.as_json()


def test_register_validates_refuses_an_existing_name_and_keeps_a_backup(tmp_path):
    folder = write(tmp_path / "data", "old", [ok_alpaca(0)], {})
    before = (folder / "dataset_info.json").read_bytes()
    new = tmp_path / "new.jsonl"
    new.write_text("".join(json.dumps(ok_alpaca(i)) + "\n" for i in range(3)))
    with pytest.raises(UsageError, match="--force"):
        add_dataset(new, "old", "alpaca", folder)
    assert (folder / "dataset_info.json").read_bytes() == before
    done = add_dataset(new, "old", "alpaca", folder, force=True)
    assert done.backup is not None and done.backup.read_bytes() == before
    assert validate_dataset("old", folder).rows == 3
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "q", "input": "", "output": "a"}\n{"instruction": 5}\n')
    with pytest.raises(UsageError, match="not registered"):
        add_dataset(bad, "bad", "alpaca", folder)


def test_register_maps_what_the_file_has(tmp_path):
    noinput = tmp_path / "noinput.jsonl"
    noinput.write_text(json.dumps({"instruction": "q", "output": "a"}) + "\n")
    done = add_dataset(noinput, "noinput", "alpaca", tmp_path / "data")
    assert done.entry["columns"] == {"prompt": "instruction", "response": "output"} and done.report.kept == 1
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": ok_chat(0, "role", "content", "user", "assistant")}) + "\n")
    done = add_dataset(chat, "chat", "sharegpt", tmp_path / "data")
    assert done.entry["tags"]["role_tag"] == "role" and done.report.kept == 1


def test_cli_validate_exit_codes_and_json(tmp_path, capsys):
    write(tmp_path / "data", "d", [ok_alpaca(0), {"instruction": "q", "input": "", "output": None}], {})
    assert main(["datasets", "validate", "d", "--dataset-dir", str(tmp_path / "data")]) == EXIT_OK
    assert "1 dropped" in capsys.readouterr().out
    code = main(["datasets", "validate", "d", "--dataset-dir", str(tmp_path / "data"), "--max-dropped", "0.1"])
    assert code == EXIT_FINDINGS
    capsys.readouterr()
    main(["datasets", "validate", str(tmp_path / "data" / "d.jsonl"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert (out["rows"], out["kept"], out["dropped"], out["dropped_rows"][0]["line"]) == (2, 1, 1, 2)
    main(["datasets", "validate", str(tmp_path / "data" / "d.jsonl"), "--json", "--max-samples", "1"])
    out = json.loads(capsys.readouterr().out)
    assert (out["rows"], out["kept"], out["dropped"]) == (1, 1, 0)  # the bad second row is past max_samples
    assert main(["datasets", "validate", "nope", "--dataset-dir", str(tmp_path / "data")]) == 2
    assert main(["datasets", "list", "--dataset-dir", str(tmp_path / "data")]) == EXIT_OK
    assert "ok, 1 dropped" in capsys.readouterr().out


def test_the_ranking_rule_is_llamafactorys():
    """validate.py mirrors this condition of LLaMA-Factory's _get_merged_dataset (it loads the data first)."""
    import inspect

    from llamafactory.data.loader import _get_merged_dataset

    source = " ".join(inspect.getsource(_get_merged_dataset).split())
    assert (
        '(stage == "rm" and dataset_attr.ranking is False) or (stage != "rm" and dataset_attr.ranking is True)'
        in source
    )


@pytest.mark.parametrize(("stage", "ranking", "ok"), [("dpo", True, True), ("dpo", False, False), ("sft", True, False)])
def test_the_check_reads_data_with_the_stage_the_workflow_passes(tmp_path, stage, ranking, ok):
    """run_dpo calls get_dataset(stage="rm"): DPO needs ranking data, and an sft dataset is refused."""
    columns = {**ALPACA_COLUMNS, "chosen": "chosen", "rejected": "rejected"} if ranking else ALPACA_COLUMNS
    rows = [{"instruction": f"q{i}", "input": "", "output": "a", "chosen": "a", "rejected": "b"} for i in range(3)]
    folder = write(tmp_path / "data", "d", rows, {"ranking": ranking, "columns": columns})
    config = {"stage": stage, "dataset": "d", "dataset_dir": str(folder)}
    _, findings = config_dataset_findings(config, tmp_path)
    assert (not any(f.level.value == "error" for f in findings)) is ok, findings


def test_the_entry_keys_are_llamafactorys_own():
    """entry.py records the keys by running LLaMA-Factory's parser; this pins them to DatasetAttr's fields
    (and FORMATTINGS, a constant for the CLI's choices, to its Literal), so a release that adds a key or a
    formatting fails here."""
    import dataclasses
    import typing

    from llamafactory.data.parser import DatasetAttr

    from llamafactory_rocm.dataset import entry

    fields = {f.name: f for f in dataclasses.fields(DatasetAttr)}
    read = set(entry.OPTION_KEYS) - {"columns", "tags"}
    assert read | set(entry.COLUMN_KEYS) | set(entry.TAG_KEYS) == set(fields) - {"load_from", "dataset_name"}
    assert typing.get_args(fields["formatting"].type) == entry.FORMATTINGS
    assert entry.SOURCE_KEYS[-1] == "file_name" and {"hf_hub_url", "script_url"} <= set(entry.SOURCE_KEYS)


def test_a_key_llamafactory_ignores_is_a_warning_not_a_refusal(tmp_path):
    """Oracle: LLaMA-Factory's own get_dataset_list reads the entry the same with and without the key."""
    from llamafactory.data.parser import get_dataset_list

    rows = [ok_alpaca(i) for i in range(4)]
    plain = {"file_name": "d.jsonl"}
    commented = {**plain, "comment": "from the wiki", "colums": {"prompt": "instruction"}}
    assert vars(get_dataset_list(["d"], {"d": commented})[0]) == vars(get_dataset_list(["d"], {"d": plain})[0])
    folder = write(tmp_path / "data", "d", rows, {"comment": "from the wiki", "colums": {"prompt": "instruction"}})
    report = validate_dataset("d", folder)
    assert report.errors == [] and report.kept == 4
    assert any("'comment'" in w for w in report.warnings)
    assert any("'colums' (did you mean 'columns'?)" in w for w in report.warnings)


# Entries stock LLaMA-Factory trains although they carry what its converter does not read (issue 31).
EXTRA_COLUMN_ENTRIES = {
    "sharegpt_with_prompt": (
        {"formatting": "sharegpt", "columns": {"messages": "conversations", "prompt": "instruction"}},
        [{"conversations": ok_chat(i), "instruction": f"q{i}"} for i in range(4)],
        "columns.prompt",
    ),
    "alpaca_with_messages": (
        {"columns": {"prompt": "instruction", "query": "input", "response": "output", "messages": "conversations"}},
        [{**ok_alpaca(i), "conversations": ok_chat(i)} for i in range(4)],
        "columns.messages",
    ),
}


@pytest.mark.parametrize("name", sorted(EXTRA_COLUMN_ENTRIES))
def test_a_column_the_converter_does_not_read_is_a_warning_as_llamafactory_trains_it(tiny_model, tmp_path, name):
    """Oracle: LLaMA-Factory's own get_dataset (tiny tokenizer) loads and keeps every row."""
    entry, rows, column = EXTRA_COLUMN_ENTRIES[name]
    folder = write(tmp_path / "data", name, rows, entry)
    dropped, kept = llamafactory_drops(tiny_model, folder, name, tmp_path)
    assert (dropped, kept) == (0, len(rows))
    report = validate_dataset(name, folder)
    assert report.ok and report.kept == kept, report.errors
    [warning] = [w for w in report.warnings if column in w]
    assert "ignores it" in warning


@pytest.mark.parametrize(
    ("entry", "raised", "words"),
    [
        ({"formatting": "sharegpt", "columns": {"system": "system"}}, KeyError, "KeyError"),  # no messages named
        ({"formatting": "sharegpt", "tags": {"role_tag": "from"}}, RuntimeError, "Cannot find valid samples"),
        ({"formatting": "sharegpt_v2"}, ValueError, "Dataset converter sharegpt_v2 not found"),
    ],
)
def test_where_llamafactorys_converter_stops_the_check_stops_in_its_words(tiny_model, tmp_path, entry, raised, words):
    """Oracle: LLaMA-Factory's own get_dataset raises on the same entry."""
    rows = [{"conversations": ok_chat(i)} for i in range(3)]
    folder = write(tmp_path / "data", "d", rows, entry)
    with pytest.raises(raised):
        llamafactory_drops(tiny_model, folder, "d", tmp_path)
    report = validate_dataset("d", folder)
    assert not report.ok and words in report.first_problem()


def test_an_entry_llamafactorys_parser_cannot_read_is_one_error_in_its_words(tmp_path):
    from llamafactory.data.parser import get_dataset_list

    (tmp_path / "dataset_info.json").write_text(json.dumps({"nosource": {"columns": {}}, "alist": [1]}))
    for name, raised, words in (("nosource", KeyError, "KeyError: 'file_name'"), ("alist", TypeError, "TypeError")):
        with pytest.raises(raised):
            get_dataset_list([name], str(tmp_path))
        report = validate_dataset(name, tmp_path)
        assert report.errors and words in report.errors[0], report.errors


def test_two_sources_are_a_warning_naming_the_one_llamafactory_ignores(tiny_model, tmp_path):
    rows = [ok_alpaca(i) for i in range(3)]
    folder = write(tmp_path / "data", "d", rows, {"cloud_file_name": "s3://bucket/d.json"})
    from llamafactory.data.parser import get_dataset_list

    attr = get_dataset_list(["d"], str(folder))[0]
    assert attr.load_from == "cloud_file"  # LLaMA-Factory takes the cloud file and never reads file_name
    report = validate_dataset("d", folder)
    assert report.ok and report.remote
    assert any("ignores file_name" in w for w in report.warnings)


@pytest.mark.parametrize("formatting", ["alpaca", "sharegpt", "openai"])
def test_the_columns_a_converter_reads_are_the_ones_that_change_its_output(formatting):
    """Oracle: LLaMA-Factory's converter itself: pointing a column it does not read (entry.converter_reads)
    at a column the row lacks changes nothing (so the warning "ignores it" is true); the conversation's
    own column is among those it reads."""
    from llamafactory.data.converter import get_dataset_converter
    from llamafactory.data.parser import DatasetAttr
    from llamafactory.hparams import DataArguments

    from llamafactory_rocm.dataset.entry import COLUMN_KEYS, converter_reads

    row = {**ok_alpaca(0), "conversations": ok_chat(0)}

    def convert(**columns: str) -> object:
        attr = DatasetAttr("file", "d.json", formatting=formatting)
        for key, value in columns.items():
            setattr(attr, key, value)
        try:
            return get_dataset_converter(formatting, attr, DataArguments())(row)
        except Exception as err:
            return type(err)

    plain = convert()
    reads = converter_reads(formatting)
    for column in COLUMN_KEYS:
        if column not in reads:
            assert convert(**{column: "absent"}) == plain, column
    main_column = "prompt" if formatting == "alpaca" else "messages"
    assert main_column in reads and convert(**{main_column: "absent"}) is KeyError
