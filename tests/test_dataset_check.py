"""Dataset definitions: planted defects found at the right line, registration that never loses the
old dataset_info.json, and the pre-launch switch to the bundled folder. All fixtures are written
here, so nothing depends on the bundled data's exact content."""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamafactory_rocm import dataset_check
from llamafactory_rocm.cli import datasets_cmd
from llamafactory_rocm.dataset_check import (
    DATASET_ATTR_KEYS,
    add_dataset,
    config_dataset_findings,
    register_dataset,
    validate_dataset,
)
from llamafactory_rocm.dataset_entry import COLUMN_KEYS, TAG_KEYS, entry_problems
from llamafactory_rocm.dataset_scan import ScanError, iter_rows
from llamafactory_rocm.errors import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, UsageError
from llamafactory_rocm.findings import Level

ALPACA = [
    {"instruction": "What is ROCm?", "input": "", "output": "AMD's GPU compute stack."},
    {"instruction": "Name an AMD GPU.", "input": "datacenter", "output": "MI300X."},
    {"instruction": "What does LoRA train?", "input": "", "output": "Low-rank adapters."},
    {"instruction": "Is bf16 on gfx1100?", "input": "", "output": "Yes."},
]
SHAREGPT = [
    {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Hello."},
        ]
    },
    {
        "conversations": [
            {"from": "human", "value": "Q1"},
            {"from": "gpt", "value": "A1"},
            {"from": "human", "value": "Q2"},
            {"from": "gpt", "value": "A2"},
        ]
    },
    {"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]},
]


# -- fixtures -------------------------------------------------------------------------------------


def write_rows(path: Path, rows: list, layout: str) -> Path:
    """``array``: pretty JSON array, one key per line (rows start at lines 2, 7, 12, ... for alpaca);
    ``jsonl``: one row per line (row i at line i + 1)."""
    if layout == "array":
        path.write_text(json.dumps(rows, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    else:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def row_lines(path: Path) -> list[int]:
    """The line each row starts on, as an independent reference (json.loads per value, whole file)."""
    text = path.read_text(encoding="utf-8")
    decoder, pos, lines = json.JSONDecoder(), 0, []
    if text.lstrip().startswith("["):
        pos = text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return lines
        lines.append(text.count("\n", 0, pos) + 1)
        _, pos = decoder.raw_decode(text, pos)


def bad(report) -> list[tuple[int, str]]:
    return [(b.line, b.reason) for b in report.bad_rows]


def make_dir(folder: Path, entries: dict, files: dict[str, tuple[list, str]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, (rows, layout) in files.items():
        write_rows(folder / name, rows, layout)
    (folder / "dataset_info.json").write_text(json.dumps(entries, indent=2), encoding="utf-8")
    return folder


LAYOUTS = pytest.mark.parametrize("layout", ["array", "jsonl"])


def suffix(layout: str) -> str:
    return ".json" if layout == "array" else ".jsonl"


# -- clean files ----------------------------------------------------------------------------------


@LAYOUTS
def test_clean_alpaca_passes(tmp_path, layout):
    path = write_rows(tmp_path / f"qa{suffix(layout)}", ALPACA, layout)
    report = validate_dataset(path)
    assert report.ok, report.summary()
    assert report.rows == len(ALPACA)
    assert report.layout == ("json-array" if layout == "array" else "json-lines")


@LAYOUTS
def test_clean_sharegpt_passes(tmp_path, layout):
    path = write_rows(tmp_path / f"chat{suffix(layout)}", SHAREGPT, layout)
    report = validate_dataset(path, formatting="sharegpt")
    assert report.ok, report.summary()
    assert report.rows == 3


# -- planted defects, each at its line ------------------------------------------------------------


@LAYOUTS
def test_missing_column_found_at_its_line(tmp_path, layout):
    rows = [dict(r) for r in ALPACA]
    del rows[2]["output"]
    path = write_rows(tmp_path / f"qa{suffix(layout)}", rows, layout)
    report = validate_dataset(path)
    assert report.bad_row_count == 1
    [(line, reason)] = bad(report)
    assert line == row_lines(path)[2]
    assert "missing column 'output'" in reason


@LAYOUTS
def test_near_miss_column_name_is_suggested(tmp_path, layout):
    rows = [dict(r) for r in ALPACA]
    rows[1]["outputs"] = rows[1].pop("output")
    path = write_rows(tmp_path / f"qa{suffix(layout)}", rows, layout)
    [(line, reason)] = bad(validate_dataset(path))
    assert line == row_lines(path)[1]
    assert "'outputs'" in reason and "columns.response" in reason


@LAYOUTS
def test_sharegpt_data_registered_as_alpaca(tmp_path, layout):
    folder = tmp_path / "data"
    name = f"chat{suffix(layout)}"
    make_dir(folder, {"chat": {"file_name": name}}, {name: (SHAREGPT, layout)})
    report = validate_dataset("chat", folder)
    assert report.bad_row_count == 3
    assert [line for line, _ in bad(report)] == row_lines(folder / name)
    assert all(
        "looks like sharegpt data" in reason and "set formatting sharegpt" in reason for _, reason in bad(report)
    )
    assert report.errors == []  # the never-seen 'input' column is a symptom here, not news


@LAYOUTS
def test_alpaca_data_read_as_sharegpt(tmp_path, layout):
    path = write_rows(tmp_path / f"qa{suffix(layout)}", ALPACA, layout)
    report = validate_dataset(path, formatting="sharegpt")
    assert report.bad_row_count == 4
    assert "looks like alpaca data" in report.bad_rows[0].reason


@LAYOUTS
def test_non_utf8_bytes_found_at_their_line(tmp_path, layout):
    path = write_rows(tmp_path / f"qa{suffix(layout)}", ALPACA, layout)
    target = row_lines(path)[3] + (1 if layout == "array" else 0)  # the "instruction" line of row 4
    lines = path.read_bytes().split(b"\n")
    lines[target - 1] = lines[target - 1].replace(b"gfx1100", b"gfx1100 caf\xe9")  # Latin-1 é
    path.write_bytes(b"\n".join(lines))
    report = validate_dataset(path)
    [(line, reason)] = bad(report)
    assert line == target
    assert reason.startswith("not UTF-8: byte 0xE9") and "re-save it as UTF-8" in reason
    assert report.rows == 4


def test_truncated_last_line_jsonl(tmp_path):
    path = write_rows(tmp_path / "qa.jsonl", ALPACA, "jsonl")
    path.write_bytes(path.read_bytes()[:-25])  # cut into the last row
    report = validate_dataset(path)
    [(line, reason)] = bad(report)
    assert line == 4
    assert reason.startswith("truncated: the last row is cut off")
    assert report.rows == 4


def test_truncated_json_array_inside_a_row(tmp_path):
    path = write_rows(tmp_path / "qa.json", ALPACA, "array")
    starts = row_lines(path)
    text = path.read_text()
    path.write_text(text[: text.rindex('"output"')])  # the file ends inside the last row
    [(line, reason)] = bad(validate_dataset(path))
    assert line == starts[3]
    assert reason.startswith("truncated")


def test_unterminated_json_array(tmp_path):
    path = write_rows(tmp_path / "qa.json", ALPACA, "array")
    text = path.read_text()
    path.write_text(text[: text.rindex("]")])
    report = validate_dataset(path)
    [(line, reason)] = bad(report)
    assert "not closed" in reason
    assert line == len(path.read_text().splitlines())  # the line of the last row's closing brace
    assert report.rows == 4


def test_malformed_line_in_the_middle_does_not_hide_later_ones(tmp_path):
    path = write_rows(tmp_path / "qa.jsonl", ALPACA, "jsonl")
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:-1]  # drop the closing brace of row 2
    lines[3] = lines[3].replace('"Yes."', '""')  # and empty the response of row 4
    path.write_text("\n".join(lines) + "\n")
    found = bad(validate_dataset(path))
    assert [line for line, _ in found] == [2, 4]
    assert found[0][1].startswith("malformed JSON")
    assert "empty response" in found[1][1]


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "empty.json"
    path.write_text(content)
    report = validate_dataset(path)
    assert not report.ok
    assert report.errors == ["empty.json is empty: there are no rows"]


def test_empty_json_array(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text("[\n]\n")
    report = validate_dataset(path)
    assert not report.ok and report.rows == 0
    assert "empty JSON array" in report.bad_rows[0].reason


@LAYOUTS
def test_empty_response(tmp_path, layout):
    rows = [dict(r) for r in ALPACA]
    rows[1]["output"] = ""
    rows[3]["output"] = "  \n "
    path = write_rows(tmp_path / f"qa{suffix(layout)}", rows, layout)
    found = bad(validate_dataset(path))
    assert [line for line, _ in found] == [row_lines(path)[1], row_lines(path)[3]]
    assert all("empty response" in reason for _, reason in found)


@LAYOUTS
def test_sharegpt_roles_out_of_order(tmp_path, layout):
    rows = json.loads(json.dumps(SHAREGPT))
    turns = rows[1]["conversations"]
    turns[2], turns[3] = turns[3], turns[2]  # gpt answers before the second question
    path = write_rows(tmp_path / f"chat{suffix(layout)}", rows, layout)
    [(line, reason)] = bad(validate_dataset(path, formatting="sharegpt"))
    assert line == row_lines(path)[1]
    assert reason.startswith("roles out of order: message 3 has role 'gpt' where a user turn")


@LAYOUTS
def test_sharegpt_odd_turns_and_empty_assistant(tmp_path, layout):
    rows = json.loads(json.dumps(SHAREGPT))
    rows[1]["conversations"].pop()  # ends on a user turn
    rows[2]["conversations"][1]["value"] = " "
    path = write_rows(tmp_path / f"chat{suffix(layout)}", rows, layout)
    found = bad(validate_dataset(path, formatting="sharegpt"))
    assert [line for line, _ in found] == row_lines(path)[1:]
    assert "odd number of turns (3)" in found[0][1]
    assert found[1][1].startswith("empty response: message 2")


def test_sharegpt_observation_and_function_turns_follow_llamafactory(tmp_path):
    row = {
        "conversations": [
            {"from": "human", "value": "weather?"},
            {"from": "function_call", "value": '{"name": "w"}'},
            {"from": "observation", "value": "sunny"},
            {"from": "gpt", "value": "It is sunny."},
        ]
    }
    path = write_rows(tmp_path / "tools.jsonl", [row], "jsonl")
    assert validate_dataset(path, formatting="sharegpt").ok


def test_openai_messages_with_role_tags(tmp_path):
    rows = [
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w", "arguments": "{}"}}]},
                {"role": "tool", "content": "sunny"},
                {"role": "tool", "content": "warm"},
                {"role": "assistant", "content": "Sunny and warm."},
            ]
        },
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]},
    ]
    folder = tmp_path / "data"
    tags = {
        "role_tag": "role",
        "content_tag": "content",
        "user_tag": "user",
        "assistant_tag": "assistant",
        "observation_tag": "tool",
        "function_tag": "function_call",
        "system_tag": "system",
    }
    entry = {"file_name": "o.jsonl", "formatting": "openai", "columns": {"messages": "messages"}, "tags": tags}
    make_dir(folder, {"o": entry}, {"o.jsonl": (rows, "jsonl")})
    found = bad(validate_dataset("o", folder))
    assert found == [(2, "empty response: message 2 ('assistant') has a blank 'content'")]


def test_role_content_messages_without_tags_get_a_hint(tmp_path):
    rows = [{"conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    path = write_rows(tmp_path / "c.jsonl", rows, "jsonl")
    [(line, reason)] = bad(validate_dataset(path, formatting="sharegpt"))
    assert line == 1 and "has no 'from' key" in reason and "role_tag 'role'" in reason


def test_input_column_in_no_row_is_a_keyerror_in_llamafactory(tmp_path):
    rows = [{"instruction": r["instruction"], "output": r["output"]} for r in ALPACA]
    path = write_rows(tmp_path / "qa.jsonl", rows, "jsonl")
    report = validate_dataset(path)
    assert report.bad_row_count == 0
    assert len(report.errors) == 1 and "KeyError: 'input'" in report.errors[0]


def test_rows_that_are_not_objects(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text('{"instruction": "a", "input": "", "output": "b"}\n["a", "b"]\n"text"\n')
    found = bad(validate_dataset(path))
    assert found == [
        (2, "the row is a JSON array, expected an object"),
        (3, "the row is a JSON string, expected an object"),
    ]


def test_more_than_one_value_on_a_line(tmp_path):
    path = tmp_path / "qa.jsonl"
    row = json.dumps(ALPACA[0])
    path.write_text(f"{row}\n{row} {row}\n{row}\n")
    report = validate_dataset(path)
    assert bad(report) == [(2, "unexpected '{' after the row on this line (JSON lines hold one object per line)")]


def test_crlf_line_ends_and_blank_lines(tmp_path):
    path = tmp_path / "qa.jsonl"
    rows = [json.dumps(r) for r in ALPACA]
    path.write_bytes(("\r\n".join(rows[:2]) + "\r\n\r\n" + "\r\n".join(rows[2:]) + "\r\n").encode())
    report = validate_dataset(path)
    assert report.ok and report.rows == 4
    rows[3] = rows[3].replace('"Yes."', '""')
    path.write_bytes(("\r\n".join(rows[:2]) + "\r\n\r\n" + "\r\n".join(rows[2:]) + "\r\n").encode())
    assert [b.line for b in validate_dataset(path).bad_rows] == [5]


def test_bom_is_fine_in_jsonl_but_not_in_a_json_array(tmp_path):
    jsonl = write_rows(tmp_path / "qa.jsonl", ALPACA, "jsonl")
    jsonl.write_bytes(b"\xef\xbb\xbf" + jsonl.read_bytes())
    assert validate_dataset(jsonl).ok
    array = write_rows(tmp_path / "qa.json", ALPACA, "array")
    array.write_bytes(b"\xef\xbb\xbf" + array.read_bytes())
    [(line, reason)] = bad(validate_dataset(array))
    assert line == 1 and "byte-order mark" in reason


def test_max_errors_caps_the_list_not_the_count(tmp_path):
    rows = [{"instruction": f"q{i}", "input": "", "output": ""} for i in range(50)]
    path = write_rows(tmp_path / "qa.jsonl", rows, "jsonl")
    report = validate_dataset(path, max_errors=5)
    assert report.bad_row_count == 50
    assert [b.line for b in report.bad_rows] == [1, 2, 3, 4, 5]


def test_a_folder_of_files_is_checked_file_by_file(tmp_path):
    folder = tmp_path / "data"
    (folder / "parts").mkdir(parents=True)
    write_rows(folder / "parts" / "a.jsonl", ALPACA, "jsonl")
    write_rows(folder / "parts" / "b.jsonl", [*ALPACA[:1], {"instruction": "x", "input": "", "output": ""}], "jsonl")
    (folder / "dataset_info.json").write_text(json.dumps({"p": {"file_name": "parts"}}))
    report = validate_dataset("p", folder)
    assert report.rows == 6
    assert [(b.file, b.line) for b in report.bad_rows] == [("b.jsonl", 2)]


@pytest.mark.parametrize("name", [".ipynb_checkpoints", "old.jsonl"])
def test_a_folder_inside_the_dataset_folder_is_a_defect_not_a_crash(tmp_path, name):
    """LLaMA-Factory passes it to datasets as a file, which stops (File types should be identical)."""
    folder = tmp_path / "data"
    (folder / "parts" / name).mkdir(parents=True)
    write_rows(folder / "parts" / "a.jsonl", ALPACA, "jsonl")
    (folder / "dataset_info.json").write_text(json.dumps({"p": {"file_name": "parts"}}))
    report = validate_dataset("p", folder)
    assert not report.ok and report.rows == len(ALPACA)
    assert any(e.startswith(f"{name} is a folder: LLaMA-Factory hands every entry") for e in report.errors)


def test_missing_data_file_is_a_defect_not_a_crash(tmp_path):
    folder = make_dir(tmp_path / "data", {"gone": {"file_name": "gone.json"}}, {})
    report = validate_dataset("gone", folder)
    assert not report.ok and report.errors[0].startswith("file not found")


def test_unknown_name_and_missing_path_are_usage_errors(tmp_path):
    folder = make_dir(tmp_path / "data", {"qa": {"file_name": "qa.json"}}, {"qa.json": (ALPACA, "array")})
    with pytest.raises(UsageError, match="did you mean 'qa'"):
        validate_dataset("qa2", folder)
    with pytest.raises(UsageError, match="not found"):
        validate_dataset(tmp_path / "nope.jsonl")


def test_no_progress_bar_in_captured_output(tmp_path, capsys):
    path = write_rows(tmp_path / "qa.jsonl", ALPACA, "jsonl")
    validate_dataset(path)
    assert capsys.readouterr().err == ""


def test_token_length_percentiles_with_a_local_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(["a", "b", "c", "d", "e"])}}
    model = tokenizers.models.WordLevel(vocab, unk_token="[UNK]")
    raw = tokenizers.Tokenizer(model)
    raw.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]").save_pretrained(tmp_path / "tok")
    rows = [{"instruction": "a " * n, "input": "", "output": "b"} for n in range(1, 101)]
    path = write_rows(tmp_path / "qa.jsonl", rows, "jsonl")
    report = validate_dataset(path, tokenizer=tmp_path / "tok")
    assert report.tokens == {"p50": 51, "p90": 91, "p99": 100, "max": 101}
    with pytest.raises(UsageError, match="tokenizer"):
        validate_dataset(path, tokenizer=tmp_path / "nope")


# -- the scanner on its own -----------------------------------------------------------------------

_text = st.text(alphabet=st.sampled_from(list('ab "\\\n\té中😀{}[],:')), max_size=12)
_rows = st.lists(st.fixed_dictionaries({"instruction": _text, "output": _text}), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_rows, layout=st.sampled_from(["compact", "indent", "jsonl"]), chunk=st.integers(1, 40))
def test_scan_is_independent_of_where_chunks_are_cut(tmp_path, rows, layout, chunk):
    path = tmp_path / "rows.json"
    if layout == "jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    else:
        path.write_text(
            json.dumps(rows, ensure_ascii=False, indent=2 if layout == "indent" else None), encoding="utf-8"
        )
    got = list(iter_rows(path, chunk_bytes=chunk))
    assert [value for _, value in got] == rows
    assert [line for line, _ in got] == row_lines(path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_rows, cut=st.floats(0.05, 0.95), chunk=st.integers(1, 40), jsonl=st.booleans())
def test_a_cut_file_never_passes_and_reads_the_same_in_any_chunks(tmp_path, rows, cut, chunk, jsonl):
    data = ("".join(json.dumps(r) + "\n" for r in rows) if jsonl else json.dumps(rows)).encode()
    data = data[: max(1, int(len(data) * cut))]
    if jsonl and data.endswith((b"\n", b"}")):
        data += b'{"cut'  # a cut at a row's end leaves a shorter, valid file: cut into a next row
    path = tmp_path / "cut.json"
    path.write_bytes(data)
    whole = list(iter_rows(path, chunk_bytes=1 << 20))
    assert any(isinstance(value, ScanError) for _, value in whole)
    assert list(iter_rows(path, chunk_bytes=chunk)) == whole


# -- dataset_info.json entries --------------------------------------------------------------------


def _parser_source() -> ast.Module:
    import importlib.util

    spec = importlib.util.find_spec("llamafactory")
    assert spec and spec.origin
    return ast.parse((Path(spec.origin).parent / "data" / "parser.py").read_text())


def test_key_sets_match_llamafactorys_parser():
    tree = _parser_source()
    attr = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "DatasetAttr")
    fields = {n.target.id for n in attr.body if isinstance(n, ast.AnnAssign)} - {"load_from", "dataset_name"}
    source_text = ast.unparse(tree)
    sources = {"hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name", "file_name"}
    for key in sources:
        assert f"'{key}'" in source_text
    options = {"formatting", "ranking", "subset", "split", "folder", "num_samples"}
    assert fields == options | COLUMN_KEYS | TAG_KEYS
    assert sources | options | {"columns", "tags"} == DATASET_ATTR_KEYS


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ({"file_name": "a.json", "colums": {}}, "unknown key 'colums' (did you mean 'columns'?)"),
        ({"file_name": "a.json", "columns": {"promt": "q"}}, "unknown columns key 'promt' (did you mean 'prompt'?)"),
        ({"file_name": "a.json", "formatting": "sharegpt", "tags": {"rol_tag": "r"}}, "did you mean 'role_tag'?"),
        ({"file_name": "a.json", "formatting": "sharegtp"}, "did you mean 'sharegpt'?"),
        ({"formatting": "alpaca"}, "no source"),
        ({"file_name": "a.json", "hf_hub_url": "x/y"}, "uses hf_hub_url and ignores file_name"),
        ({"file_name": "a.json", "columns": {"messages": "conversations"}}, 'add "formatting": "sharegpt"'),
        ({"file_name": "a.json", "formatting": "sharegpt", "columns": {"prompt": "q"}}, "read only for alpaca"),
        ({"file_name": "a.json", "columns": {"prompt": "q"}}, "does not set response"),
        ({"file_name": "a.json", "formatting": "sharegpt", "tags": {"role_tag": "role"}}, "leaves content_tag"),
        ({"file_name": "a.json", "ranking": True}, "chosen and rejected"),
        ({"file_name": "a.json", "num_samples": 0}, "num_samples must be a positive integer"),
    ],
)
def test_entry_problems(entry, needle):
    errors = entry_problems(entry).errors
    assert any(needle in e for e in errors), errors


def test_hubs_may_be_combined_and_clean_entries_pass():
    assert entry_problems({"hf_hub_url": "a/b", "ms_hub_url": "c/d"}).errors == []
    assert entry_problems({"file_name": "a.json", "file_sha1": "0" * 40}).errors == []
    sharegpt = {"file_name": "c.json", "formatting": "sharegpt", "columns": {"messages": "conversations"}}
    assert entry_problems(sharegpt) == entry_problems(sharegpt)  # deterministic
    assert entry_problems(sharegpt).errors == []


def test_tags_on_alpaca_are_a_warning():
    checked = entry_problems({"file_name": "a.json", "tags": {"role_tag": "from"}})
    assert checked.errors == [] and "ignores them" in checked.warnings[0]


def test_a_columns_block_without_query_stops_checking_input(tmp_path):
    rows = [{"q": r["instruction"], "a": r["output"]} for r in ALPACA]
    folder = tmp_path / "data"
    make_dir(
        folder,
        {"qa": {"file_name": "qa.jsonl", "columns": {"prompt": "q", "response": "a"}}},
        {"qa.jsonl": (rows, "jsonl")},
    )
    assert validate_dataset("qa", folder).ok


# -- registration ---------------------------------------------------------------------------------


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return make_dir(tmp_path / "data", {"old": {"file_name": "old.json"}}, {"old.json": (ALPACA, "array")})


def test_register_creates_dataset_info_in_a_new_folder(tmp_path):
    path = write_rows(tmp_path / "mine.jsonl", ALPACA, "jsonl")
    info_path = register_dataset(path, "mine", "alpaca", tmp_path / "fresh")
    info = json.loads(info_path.read_text())
    assert info == {"mine": {"file_name": str(path.resolve()), "formatting": "alpaca"}}
    assert not list((tmp_path / "fresh").glob("*.bak"))


def test_register_inside_the_folder_stores_a_relative_name(data_dir):
    (data_dir / "sub").mkdir()
    write_rows(data_dir / "sub" / "new.jsonl", ALPACA, "jsonl")
    done = add_dataset(data_dir / "sub" / "new.jsonl", "new", "alpaca", data_dir)
    info = json.loads(done.info_path.read_text())
    assert info["new"]["file_name"] == "sub/new.jsonl"
    assert info["old"] == {"file_name": "old.json"}
    assert done.backup == data_dir / "dataset_info.json.bak"
    assert json.loads(done.backup.read_text()) == {"old": {"file_name": "old.json"}}
    assert validate_dataset("new", data_dir).ok


def test_register_refuses_an_existing_name_without_force(data_dir, tmp_path):
    before = (data_dir / "dataset_info.json").read_bytes()
    path = write_rows(tmp_path / "other.jsonl", ALPACA, "jsonl")
    with pytest.raises(UsageError, match="--force"):
        register_dataset(path, "old", "alpaca", data_dir)
    assert (data_dir / "dataset_info.json").read_bytes() == before
    assert sorted(p.name for p in data_dir.iterdir()) == ["dataset_info.json", "old.json"]


def test_register_with_force_keeps_numbered_backups(data_dir, tmp_path):
    (data_dir / "dataset_info.json").write_bytes(b'{\r\n  "old": {"file_name": "old.json"}\r\n}\r\n')
    original = (data_dir / "dataset_info.json").read_bytes()
    path = write_rows(tmp_path / "other.jsonl", ALPACA, "jsonl")
    first = add_dataset(path, "old", "alpaca", data_dir, force=True)
    second = add_dataset(path, "old", "alpaca", data_dir, force=True)
    assert first.backup.name == "dataset_info.json.bak" and first.backup.read_bytes() == original
    assert second.backup.name == "dataset_info.json.1.bak"
    assert first.backup.read_bytes() == original  # the first backup was not overwritten
    assert json.loads((data_dir / "dataset_info.json").read_text())["old"]["file_name"] == str(path.resolve())


def test_register_refuses_a_file_with_defects(data_dir, tmp_path):
    before = (data_dir / "dataset_info.json").read_bytes()
    rows = [*ALPACA, {"instruction": "q", "input": "", "output": ""}]
    path = write_rows(tmp_path / "bad.jsonl", rows, "jsonl")
    with pytest.raises(UsageError, match=r"not registered: .*line 5: empty response"):
        register_dataset(path, "bad", "alpaca", data_dir)
    assert (data_dir / "dataset_info.json").read_bytes() == before


def test_register_maps_columns_for_alpaca_without_input(data_dir, tmp_path):
    rows = [{"instruction": r["instruction"], "output": r["output"]} for r in ALPACA]
    path = write_rows(tmp_path / "noinput.jsonl", rows, "jsonl")
    done = add_dataset(path, "noinput", "alpaca", data_dir)
    assert done.entry["columns"] == {"prompt": "instruction", "response": "output"}
    assert validate_dataset("noinput", data_dir).ok


def test_register_infers_role_content_tags(data_dir, tmp_path):
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}]
    path = write_rows(tmp_path / "chat.jsonl", rows, "jsonl")
    done = add_dataset(path, "chat", "sharegpt", data_dir)
    assert done.entry["columns"] == {"messages": "messages"}
    assert done.entry["tags"]["role_tag"] == "role" and done.entry["tags"]["user_tag"] == "user"
    assert validate_dataset("chat", data_dir).ok


@pytest.mark.parametrize("name", ["", " padded", "a,b"])
def test_register_refuses_bad_names(data_dir, tmp_path, name):
    path = write_rows(tmp_path / "x.jsonl", ALPACA, "jsonl")
    with pytest.raises(UsageError):
        register_dataset(path, name, "alpaca", data_dir)


def test_register_refuses_to_touch_a_broken_dataset_info(data_dir, tmp_path):
    (data_dir / "dataset_info.json").write_text('{"old": {"file_name": "old.json"},}')
    before = (data_dir / "dataset_info.json").read_bytes()
    path = write_rows(tmp_path / "x.jsonl", ALPACA, "jsonl")
    with pytest.raises(UsageError, match="not valid JSON"):
        register_dataset(path, "x", "alpaca", data_dir)
    assert (data_dir / "dataset_info.json").read_bytes() == before


def test_register_onto_a_read_only_folder(data_dir, tmp_path, monkeypatch):
    before = (data_dir / "dataset_info.json").read_bytes()
    path = write_rows(tmp_path / "x.jsonl", ALPACA, "jsonl")
    data_dir.chmod(0o555)
    try:
        if os.access(data_dir, os.W_OK):  # root ignores the mode: make the writes fail instead
            monkeypatch.setattr(dataset_check, "atomic_write_text", _raise(PermissionError(13, "Permission denied")))
        with pytest.raises(UsageError) as caught:
            register_dataset(path, "x", "alpaca", data_dir)
    finally:
        data_dir.chmod(0o755)
    message = str(caught.value)
    assert "\n" not in message and "Permission denied" in message and "nothing was changed" in message
    assert (data_dir / "dataset_info.json").read_bytes() == before
    assert sorted(p.name for p in data_dir.iterdir()) == ["dataset_info.json", "old.json"]


def _raise(exc: BaseException):
    def fail(*args, **kwargs):
        raise exc

    return fail


def test_interrupted_mid_write_leaves_the_old_file_intact(data_dir, tmp_path, monkeypatch):
    before = (data_dir / "dataset_info.json").read_bytes()
    path = write_rows(tmp_path / "x.jsonl", ALPACA, "jsonl")
    real_replace = os.replace

    def interrupted(src, dst, *args, **kwargs):
        if Path(dst).name == "dataset_info.json":
            assert Path(src).read_text().strip().startswith("{")  # the new text was fully written first
            raise KeyboardInterrupt
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        register_dataset(path, "x", "alpaca", data_dir)
    assert (data_dir / "dataset_info.json").read_bytes() == before
    assert sorted(p.name for p in data_dir.iterdir()) == ["dataset_info.json", "old.json"]  # no temp, no backup


# -- the pre-launch check -------------------------------------------------------------------------


@pytest.fixture
def bundled(tmp_path: Path, monkeypatch) -> Path:
    folder = make_dir(
        tmp_path / "bundled",
        {
            "b_qa": {"file_name": "b_qa.json"},
            "b_chat": {"file_name": "b_chat.json", "formatting": "sharegpt"},
            "b_hub": {"hf_hub_url": "someone/data"},
        },
        {"b_qa.json": (ALPACA, "array"), "b_chat.json": (SHAREGPT, "array")},
    )
    monkeypatch.setattr(dataset_check, "datasets_dir", lambda: folder)
    return folder


def test_switches_to_the_bundled_folder_when_only_it_has_the_datasets(tmp_path, bundled):
    cwd = tmp_path / "project"
    cwd.mkdir()
    config, findings = config_dataset_findings({"dataset": "b_qa, b_chat", "eval_dataset": "b_qa"}, cwd)
    assert config["dataset_dir"] == str(bundled)
    assert [(f.code, f.level) for f in findings] == [("DATASET_DIR_BUNDLED", Level.CHANGE)]
    assert findings[0].old == "data" and findings[0].new == str(bundled)


def test_keeps_a_local_folder_that_has_the_datasets(tmp_path, bundled):
    make_dir(tmp_path / "data", {"b_qa": {"file_name": "q.json"}}, {"q.json": (ALPACA, "array")})
    config, findings = config_dataset_findings({"dataset": "b_qa"}, tmp_path)
    assert "dataset_dir" not in config and findings == []


def test_flags_a_broken_dataset_with_its_line_and_the_command(tmp_path, bundled):
    rows = [dict(r) for r in ALPACA]
    rows[2]["output"] = ""
    make_dir(tmp_path / "data", {"mine": {"file_name": "mine.jsonl"}}, {"mine.jsonl": (rows, "jsonl")})
    config, findings = config_dataset_findings({"dataset": "mine", "dataset_dir": "data"}, tmp_path)
    [finding] = findings
    assert finding.code == "DATASET_INVALID" and finding.level is Level.ERROR
    assert "4 rows, 1 bad" in finding.message and "line 3: empty response" in finding.message
    assert f"llamafactory-rocm datasets validate mine --dataset-dir {tmp_path / 'data'}" in finding.fix
    assert config == {"dataset": "mine", "dataset_dir": "data"}


def _folder_of_runs(data: Path) -> Path:
    """Four files in load order; the third lacks src: in two processes (two runs of two files) it
    fixes src as absent for the fourth, in one process the first file fixes it as a string."""
    folder = data / "parts"
    folder.mkdir(parents=True)
    for number in range(4):
        (folder / f"part{number}.jsonl").touch()
    for position, name in enumerate(os.listdir(folder)):
        extra = {} if position == 2 else {"src": "web"}
        write_rows(folder / name, [{**row, **extra} for row in ALPACA], "jsonl")
    (data / "dataset_info.json").write_text(json.dumps({"parts": {"file_name": "parts"}}), encoding="utf-8")
    return folder


def test_a_folder_is_checked_as_the_configs_processes_load_it(tmp_path, bundled):
    _folder_of_runs(tmp_path / "data")
    config = {"dataset": "parts", "dataset_dir": "data"}
    assert config_dataset_findings(config, tmp_path)[1] == []  # no preprocessing_num_workers: one process
    assert config_dataset_findings({**config, "preprocessing_num_workers": 4}, tmp_path)[1] == []  # one a file
    [finding] = config_dataset_findings({**config, "preprocessing_num_workers": 2}, tmp_path)[1]
    assert finding.code == "DATASET_INVALID" and "column /src first appears here" in finding.message
    assert finding.fix.endswith(f"--dataset-dir {tmp_path / 'data'} --preprocessing-num-workers 2` to list every "
                                "bad row, then fix the data or its dataset_info.json entry.")  # fmt: skip


def test_cli_validate_takes_the_configs_processes(tmp_path, capsys):
    data = tmp_path / "data"
    _folder_of_runs(data)
    assert cli("validate", "parts", "--dataset-dir", str(data), "--preprocessing-num-workers", "1") == EXIT_OK
    assert cli("validate", "parts", "--dataset-dir", str(data), "--preprocessing-num-workers", "2") == EXIT_FINDINGS
    assert "the first of the 2 files one process loads" in capsys.readouterr().out
    cli("validate", "parts", "--dataset-dir", str(data))  # processes not known: says what was checked
    assert "note: its 4 files were checked as 1 process and as 4 processes load them" in capsys.readouterr().out


def test_a_broken_bundled_dataset_is_flagged_after_the_switch(tmp_path, bundled):
    (bundled / "b_qa.json").write_text((bundled / "b_qa.json").read_text()[:-10])
    _, findings = config_dataset_findings({"dataset": "b_qa"}, tmp_path)
    assert [f.code for f in findings] == ["DATASET_DIR_BUNDLED", "DATASET_INVALID"]
    assert "truncated" in findings[1].message


def test_unknown_remote_and_online(tmp_path, bundled):
    _, findings = config_dataset_findings({"dataset": "b_qa2"}, tmp_path)
    assert [f.code for f in findings] == ["DATASET_UNKNOWN"]
    assert "Did you mean 'b_qa'?" in findings[0].message and "datasets register" in findings[0].fix
    _, findings = config_dataset_findings({"dataset": "b_hub"}, tmp_path)
    assert [(f.code, f.level) for f in findings] == [
        ("DATASET_DIR_BUNDLED", Level.CHANGE),
        ("DATASET_REMOTE", Level.INFO),
    ]
    config, findings = config_dataset_findings({"dataset": "x/y", "dataset_dir": "ONLINE"}, tmp_path)
    assert [(f.code, f.level) for f in findings] == [("DATASET_ONLINE", Level.INFO)] and config[
        "dataset_dir"
    ] == "ONLINE"
    assert config_dataset_findings({"stage": "sft"}, tmp_path) == ({"stage": "sft"}, [])


def test_findings_are_deterministic(tmp_path, bundled):
    runs = [config_dataset_findings({"dataset": "b_chat,b_qa,b_hub"}, tmp_path) for _ in range(2)]
    assert runs[0] == runs[1]


def test_the_bundled_datasets_validate_clean():
    """The shipped data itself (whatever it holds): every entry parses and every row is sound."""
    from llamafactory_rocm.resources import datasets_dir

    info = json.loads((datasets_dir() / "dataset_info.json").read_text())
    for name in info:
        report = validate_dataset(name, datasets_dir())
        assert report.ok, report.summary()


# -- the CLI --------------------------------------------------------------------------------------


def cli(*argv: str) -> int:
    """``llamafactory-rocm datasets ...`` through the module's own register(), as main() runs it."""
    parser = argparse.ArgumentParser(prog="llamafactory-rocm")
    subs = parser.add_subparsers(dest="command", required=True)
    datasets_cmd.register(subs)
    args = parser.parse_args(["datasets", *argv])
    try:
        return args.run(args)
    except UsageError as err:
        print(f"llamafactory-rocm datasets: {err}", file=sys.stderr)
        return err.exit_code


def test_cli_validate_exit_codes(tmp_path, capsys):
    clean = write_rows(tmp_path / "clean.jsonl", ALPACA, "jsonl")
    assert cli("validate", str(clean)) == EXIT_OK
    assert "4 rows, ok" in capsys.readouterr().out
    rows = [dict(r) for r in ALPACA]
    rows[1]["output"] = ""
    broken = write_rows(tmp_path / "broken.jsonl", rows, "jsonl")
    assert cli("validate", str(broken)) == EXIT_FINDINGS
    out = capsys.readouterr().out
    assert "4 rows, 1 bad" in out and "line 2: empty response" in out
    assert cli("validate", str(tmp_path / "nope.jsonl")) == EXIT_USAGE
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not found" in err


def test_cli_validate_json_and_max_errors(tmp_path, capsys):
    rows = [{"instruction": f"q{i}", "input": "", "output": ""} for i in range(30)]
    path = write_rows(tmp_path / "qa.jsonl", rows, "jsonl")
    assert cli("validate", str(path), "--max-errors", "3") == EXIT_FINDINGS
    assert "and 27 more bad rows" in capsys.readouterr().out
    assert cli("validate", str(path), "--json", "--max-errors", "2") == EXIT_FINDINGS
    report = json.loads(capsys.readouterr().out)
    assert report["bad_row_count"] == 30 and len(report["bad_rows"]) == 2 and report["ok"] is False


def test_cli_list(data_dir, capsys):
    assert cli("list", "--dataset-dir", str(data_dir)) == EXIT_OK
    out = capsys.readouterr().out
    assert "old" in out and "alpaca" in out and "4" in out and "ok" in out
    assert cli("list", "--dataset-dir", str(data_dir), "--json") == EXIT_OK
    assert json.loads(capsys.readouterr().out) == [
        {"name": "old", "formatting": "alpaca", "file": "old.json", "rows": 4, "status": "ok"}
    ]


def test_cli_register_prints_where_and_the_backup(data_dir, tmp_path, capsys):
    path = write_rows(tmp_path / "x.jsonl", ALPACA, "jsonl")
    assert cli("register", str(path), "--name", "x", "--dataset-dir", str(data_dir)) == EXIT_OK
    out = capsys.readouterr().out
    assert str(data_dir / "dataset_info.json") in out and "dataset_info.json.bak" in out
    assert cli("register", str(path), "--name", "x", "--dataset-dir", str(data_dir)) == EXIT_USAGE
    assert "--force" in capsys.readouterr().err
    assert cli("register", str(path), "--name", "x", "--dataset-dir", str(data_dir), "--force") == EXIT_OK
    assert (data_dir / "dataset_info.json.1.bak").is_file()


# -- the multi-process scan -----------------------------------------------------------------------


@pytest.mark.parametrize("size_mb, jobs", [(1, 1), (70, 2), (342, 2), (342, 3), (10_000, 2), (10_000, 8)])
def test_every_worker_gets_as_many_ranges_and_none_is_too_big(size_mb, jobs):
    from llamafactory_rocm.dataset_parallel import RANGE_BYTES, RANGES_PER_JOB, range_count

    size = size_mb << 20
    count = range_count(size, jobs)
    assert count % jobs == 0
    assert count >= RANGES_PER_JOB * jobs
    assert size / count <= RANGE_BYTES
    assert count == RANGES_PER_JOB * jobs or size / (count - jobs) > RANGE_BYTES  # no more than needed


def test_parallel_scan_reports_exactly_what_one_process_does(tmp_path, monkeypatch):
    from llamafactory_rocm import dataset_parallel

    if not dataset_parallel.can_fork():
        pytest.skip("no fork on this platform: the scan stays in one process")
    rows = [{"instruction": f"q{i}", "input": "", "output": f"a{i}"} for i in range(3000)]
    rows[10]["output"] = ""
    rows[1500].pop("instruction")
    rows[2999]["output"] = " "
    path = write_rows(tmp_path / "big.jsonl", rows, "jsonl")
    lines = path.read_bytes().split(b"\n")
    lines[700] = lines[700].replace(b"q700", b"q\xe9700")
    lines[2100] = lines[2100][:-3]  # a malformed line
    path.write_bytes(b"\n".join(lines))
    monkeypatch.setattr(dataset_check, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(dataset_parallel, "RANGE_BYTES", 4096)  # ~30 ranges, cut at random rows
    one = validate_dataset(path, jobs=1, max_errors=100)
    monkeypatch.setattr(dataset_check, "_scan_rows", _raise(AssertionError("scanned in one process")))
    many = validate_dataset(path, jobs=3, max_errors=100)
    assert bad(one) == bad(many)
    assert [line for line, _ in bad(one)] == [11, 701, 1501, 2101, 3000]
    assert (one.rows, one.bad_row_count, one.errors) == (many.rows, many.bad_row_count, many.errors) == (3000, 5, [])
    capped = validate_dataset(path, jobs=3, max_errors=2)
    assert [b.line for b in capped.bad_rows] == [11, 701] and capped.bad_row_count == 5


def test_parallel_scan_keeps_a_column_seen_in_any_range(tmp_path, monkeypatch):
    from llamafactory_rocm import dataset_parallel

    if not dataset_parallel.can_fork():
        pytest.skip("no fork on this platform")
    rows = [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(2000)]
    rows[1900]["input"] = ""  # only the last range has it: still no KeyError in LLaMA-Factory
    path = write_rows(tmp_path / "big.jsonl", rows, "jsonl")
    monkeypatch.setattr(dataset_check, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(dataset_parallel, "RANGE_BYTES", 4096)
    assert validate_dataset(path, jobs=2).ok
    rows[1900].pop("input")
    write_rows(path, rows, "jsonl")
    assert "KeyError: 'input'" in validate_dataset(path, jobs=2).errors[0]


def test_output_closed_early_stops_quietly(tmp_path):
    """`datasets validate big.jsonl | head -1`: exit 141 as for SIGPIPE, and no traceback."""
    import subprocess

    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps({"instruction": "q", "input": "", "output": ""}) + "\n" for _ in range(20000)))
    command = [sys.executable, "-m", "llamafactory_rocm.cli.main", "datasets", "validate", str(path)]
    with subprocess.Popen([*command, "--max-errors", "20000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as run:
        assert run.stdout is not None and run.stderr is not None
        assert run.stdout.readline().startswith(str(path).encode())
        run.stdout.close()
        stderr = run.stderr.read().decode()
    assert run.returncode == 141, stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize("block", [{"columns": {"prompt": []}}, {"formatting": "sharegpt", "tags": {"role_tag": []}}])
def test_a_column_name_that_is_not_a_string_is_an_entry_error_not_a_crash(tmp_path, block):
    folder = make_dir(tmp_path / "data", {"d": {"file_name": "d.jsonl", **block}}, {"d.jsonl": (ALPACA, "jsonl")})
    report = validate_dataset("d", folder)
    assert not report.ok and any("must be a string (the name in the data), not" in e for e in report.errors)


def test_a_folder_entry_that_is_a_pipe_is_an_error_not_a_hang(tmp_path):
    folder = tmp_path / "data"
    (folder / "parts").mkdir(parents=True)
    write_rows(folder / "parts" / "a.jsonl", ALPACA, "jsonl")
    os.mkfifo(folder / "parts" / "b.jsonl")
    (folder / "dataset_info.json").write_text(json.dumps({"p": {"file_name": "parts"}}))
    report = validate_dataset("p", folder)
    assert "b.jsonl is not a regular file (a pipe or a device?): give the data as a file" in report.errors


def test_dataset_info_nested_past_pythons_limit_is_bad_input(tmp_path):
    (tmp_path / "dataset_info.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UsageError, match="cannot be read as JSON here"):
        validate_dataset("d", tmp_path)


def test_a_folder_given_as_a_path_is_checked_as_llamafactory_loads_it(tmp_path, monkeypatch, capsys):
    parts = tmp_path / "parts"
    parts.mkdir()
    write_rows(parts / "a.jsonl", ALPACA, "jsonl")
    write_rows(parts / "b.jsonl", [*ALPACA[:1], {"instruction": "x", "input": "", "output": ""}], "jsonl")
    monkeypatch.chdir(tmp_path)
    report = validate_dataset("./parts")
    assert report.rows == 6 and [(b.file, b.line) for b in report.bad_rows] == [("b.jsonl", 2)]
    assert cli("validate", "./parts") == EXIT_FINDINGS
    assert "b.jsonl:2: empty response" in capsys.readouterr().out
