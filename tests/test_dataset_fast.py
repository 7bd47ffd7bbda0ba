"""The clean-file fast path: it proves clean files clean without the line-by-line scan, and whatever it
is given, a report with it is the report without it, line for line.

The line-by-line scan (``fast=False``) is the reference. Every file here is checked both ways; the
cases are the ones where msgspec alone is more lenient than that scan (two rows on a line, a row
across lines, bad bytes in a column it skips) and the rules that typing does not cover."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from llamafactory_rocm import dataset_check, dataset_fast, dataset_parallel
from llamafactory_rocm.dataset_check import validate_dataset
from llamafactory_rocm.dataset_entry import resolve_mapping
from llamafactory_rocm.dataset_fast import prove_clean

ROW = {"instruction": "What is ROCm?", "input": "", "output": "AMD's GPU compute stack."}
ALPACA = resolve_mapping({"file_name": "x"})


def jsonl(rows: list, end: str = "\n") -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + end for r in rows).encode()


def write(tmp_path: Path, data: bytes, name: str = "qa.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def prove(path: Path, mapping=ALPACA):
    return prove_clean(path, 0, path.stat().st_size, mapping)


def both_ways(path: Path, **kwargs) -> dict:
    """The report with the fast path; asserts it equals the reference scan's."""
    fast = validate_dataset(path, max_errors=1000, **kwargs).as_json()
    reference = validate_dataset(path, max_errors=1000, fast=False, **kwargs).as_json()
    assert fast == reference
    return fast


# -- clean files are proven clean -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "rows", "newlines"),
    [
        pytest.param(jsonl([ROW] * 5), 5, 5, id="lf"),
        pytest.param(jsonl([ROW] * 5, end="\r\n"), 5, 5, id="crlf"),
        pytest.param(jsonl([ROW] * 5)[:-1], 5, 4, id="no-final-newline"),
        pytest.param(jsonl([{**ROW, "output": "中文 😀 é"}] * 3), 3, 3, id="utf8"),
        pytest.param(jsonl([{**ROW, "id": 7, "meta": {"src": ["x", None]}}] * 3), 3, 3, id="extra-columns"),
        pytest.param(jsonl([{"instruction": "q", "output": "a"}] * 2 + [ROW]), 3, 3, id="input-in-one-row"),
        pytest.param(
            jsonl([{"instruction": " ", "input": "context", "output": "a"}]), 1, 1, id="blank-prompt-with-query"
        ),
    ],
)
def test_clean_files_are_proven_clean(tmp_path, data, rows, newlines):
    path = write(tmp_path, data)
    clean = prove(path)
    assert clean is not None and (clean.rows, clean.newlines) == (rows, newlines)
    assert both_ways(path)["ok"]


def test_a_clean_file_never_reaches_the_line_by_line_scan(tmp_path, monkeypatch):
    path = write(tmp_path, jsonl([{**ROW, "output": f"a{i}"} for i in range(500)]))

    def scan_called(*args, **kwargs):
        raise AssertionError("the line-by-line scan ran on a clean file")

    monkeypatch.setattr(dataset_check, "_scan_rows", scan_called)
    report = validate_dataset(path)
    assert report.ok and report.rows == 500


def test_optional_columns_are_seen_only_where_a_row_has_them(tmp_path):
    entry = {"file_name": "qa.jsonl", "columns": {"prompt": "q", "response": "a", "system": "sys"}}
    (tmp_path / "dataset_info.json").write_text(json.dumps({"qa": entry}))
    path = write(tmp_path, jsonl([{"q": "x", "a": "y"}, {"q": "x", "a": "y", "sys": None}]))
    assert prove(path, resolve_mapping(entry)).types.seen_columns() == {"q", "a", "sys"}
    fast = validate_dataset("qa", tmp_path).as_json()
    assert fast == validate_dataset("qa", tmp_path, fast=False).as_json() and fast["ok"]
    path = write(tmp_path, jsonl([{"q": "x", "a": "y"}]))
    assert prove(path, resolve_mapping(entry)).types.seen_columns() == {"q", "a"}
    fast = validate_dataset("qa", tmp_path).as_json()
    assert fast == validate_dataset("qa", tmp_path, fast=False).as_json()
    assert "KeyError: 'sys'" in fast["errors"][0]


def test_history_pairs_are_typed(tmp_path):
    mapping = resolve_mapping({"file_name": "x", "columns": {"prompt": "q", "response": "a", "history": "h"}})
    path = write(tmp_path, jsonl([{"q": "x", "a": "y", "h": [["p", "r"]]}, {"q": "x", "a": "y", "h": None}]))
    assert prove(path, mapping) is not None
    path = write(tmp_path, jsonl([{"q": "x", "a": "y", "h": [["p", "r", "extra"]]}]))
    assert prove(path, mapping) is None


@pytest.mark.parametrize(
    "mapping",
    [
        resolve_mapping({"file_name": "x", "formatting": "openai"}),
        resolve_mapping(
            {"file_name": "x", "ranking": True, "columns": {"prompt": "q", "chosen": "c", "rejected": "r"}}
        ),
        resolve_mapping({"file_name": "x", "columns": {"prompt": "t", "response": "t"}}),  # one column, two roles
        resolve_mapping({"file_name": "x", "columns": {"response": "a"}}),  # no prompt column
    ],
    ids=["openai", "ranking", "shared-column", "no-prompt"],
)
def test_formats_it_does_not_cover_step_aside(tmp_path, mapping):
    path = write(tmp_path, jsonl([ROW]))
    assert prove(path, mapping) is None


# -- anything it cannot prove goes to the scan, and the report is the same -------------------------

_LINE = json.dumps(ROW).encode()
DEFECTS = {
    # msgspec alone would accept these; the line-by-line scan does not
    "two rows on a line": _LINE + b" " + _LINE + b"\n",
    "row across two lines": b'{"instruction": "q",\n"input": "", "output": "a"}\n',
    "row across lines, plus two on a line": b'{"instruction": "q",\n"output": "a"}\n' + _LINE + _LINE + b"\n",
    "bad byte in a skipped column": b'{"instruction": "q", "output": "a", "note": "caf\xe9"}\n',
    "comma between rows": _LINE + b"," + _LINE + b"\n",
    # the rules typing leaves to passes over the rows
    "blank response": jsonl([{**ROW, "output": " \t"}]),
    "empty response": jsonl([{**ROW, "output": ""}]),
    "null response": jsonl([{**ROW, "output": None}]),
    "number response": jsonl([{**ROW, "output": 3}]),
    "missing response": jsonl([{"instruction": "q", "input": ""}]),
    "blank prompt and query": jsonl([{**ROW, "instruction": "\u3000", "input": " "}]),
    "null prompt with a query": jsonl([{**ROW, "instruction": None, "input": "ctx"}]),
    "number query": jsonl([{**ROW, "input": 5}]),
    "last wins on a duplicate key": b'{"instruction": "q", "output": "a", "output": ""}\n',
    # shapes the fast path leaves alone
    "blank line": _LINE + b"\n\n" + _LINE + b"\n",
    "indented line": b"  " + _LINE + b"\n",
    "byte-order mark": b"\xef\xbb\xbf" + _LINE + b"\n",
    "NaN in a skipped column": b'{"instruction": "q", "output": "a", "score": NaN}\n',
    "lone surrogate": b'{"instruction": "q\\ud800", "output": "a"}\n',
    "not an object": b'["q", "a"]\n',
    "truncated last row": _LINE + b'\n{"instruction": "q", "out',
    "mixed line ends": _LINE + b"\r\n" + _LINE + b"\n",
}


@pytest.mark.parametrize("name", list(DEFECTS))
def test_what_it_cannot_prove_is_scanned_line_by_line(tmp_path, name):
    path = write(tmp_path, _LINE + b"\n" + DEFECTS[name] + _LINE + b"\n")
    assert prove(path) is None
    both_ways(path)


def test_a_line_longer_than_a_chunk_is_proven_too(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset_fast, "CHUNK_BYTES", 64)
    path = write(tmp_path, jsonl([ROW, {**ROW, "output": "x" * 1000}, ROW, {**ROW, "input": "y" * 300}]))
    assert prove(path).rows == 4
    assert both_ways(path)["ok"]
    path = write(tmp_path, jsonl([ROW, {**ROW, "output": " " * 1000}, ROW]))
    assert prove(path) is None
    assert [b["line"] for b in both_ways(path)["bad_rows"]] == [2]


def test_workers_prove_clean_ranges_and_scan_the_others(tmp_path, monkeypatch):
    """In several processes each range is proven or scanned on its own: the lines of later defects
    depend on the newline counts that the proven ranges report."""
    if not dataset_parallel.can_fork():
        pytest.skip("no fork on this platform: the scan stays in one process")
    monkeypatch.setattr(dataset_check, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(dataset_parallel, "RANGE_BYTES", 2048)
    monkeypatch.setattr(dataset_fast, "CHUNK_BYTES", 512)
    rows = [{**ROW, "output": f"answer {i}"} for i in range(400)]
    rows[37]["output"] = ""
    rows[250]["input"] = 12
    data = jsonl(rows).replace(b'"answer 300"', b'"answer\xff300"')
    path = write(tmp_path, data)
    many = validate_dataset(path, jobs=2, max_errors=100).as_json()
    assert many == validate_dataset(path, fast=False, max_errors=100).as_json()
    assert [b["line"] for b in many["bad_rows"]] == [38, 251, 301]
    for start, end in _ranges(path):  # proven exactly where the line-by-line scan finds nothing
        scanned = dataset_parallel.scan_range((str(path), start, end, ALPACA, 10, False))
        assert (prove_clean(path, start, end, ALPACA) is not None) == (scanned.bad_count == 0)


def _ranges(path: Path) -> list[tuple[int, int]]:
    size = path.stat().st_size
    return dataset_parallel.plan_ranges(path, size, -(-size // dataset_parallel.RANGE_BYTES))


# -- the property -------------------------------------------------------------------------------------

_clean_text = st.sampled_from(["a", "q?", "中", "x y", "a\\nb", "tab\\tend", "😀"])
_any_text = st.sampled_from(["", " ", "\t", "\u3000", None, 0, "ok"])
_extra = st.sampled_from([1, "z", None, [1, "2"], {"k": "v"}])
_clean_row = st.fixed_dictionaries(
    {"instruction": _clean_text, "output": _clean_text},
    optional={"input": st.sampled_from(["", " ", "ctx"]), "extra": _extra},
)
_any_row = st.fixed_dictionaries({"instruction": _any_text, "output": _any_text}, optional={"input": _any_text})
_edit = st.sampled_from(["none", "none", "none", "join", "split", "blank", "bad-byte", "crlf", "indent", "comma"])


def _apply(data: bytes, edit: str, where: float) -> bytes:
    lines = data.split(b"\n")
    i = min(int(where * (len(lines) - 1)), max(len(lines) - 2, 0))
    if edit == "join" and len(lines) > 2:
        lines[i : i + 2] = [lines[i] + b" " + lines[i + 1]]
    elif edit == "split" and len(lines[i]) > 2:
        cut = max(1, int(where * len(lines[i])))
        lines[i : i + 1] = [lines[i][:cut], lines[i][cut:]]
    elif edit == "blank":
        lines.insert(i, b"")
    elif edit == "bad-byte":
        lines[i] = lines[i].replace(b'"', b'"\xff', 1)
    elif edit == "crlf":
        lines[i] += b"\r"
    elif edit == "indent":
        lines[i] = b" " + lines[i]
    elif edit == "comma":
        lines[i] += b","
    return b"\n".join(lines)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(_clean_row, min_size=1, max_size=12),
    odd_row=st.none() | _any_row,
    edit=_edit,
    where=st.floats(0, 1),
    chunk=st.integers(40, 400),
)
def test_a_report_is_the_same_with_and_without_the_fast_path(tmp_path, monkeypatch, rows, odd_row, edit, where, chunk):
    """A clean file, maybe with one odd row, maybe with one line edited; chunks of any size."""
    monkeypatch.setattr(dataset_fast, "CHUNK_BYTES", chunk)
    if odd_row is not None:
        rows.insert(int(where * len(rows)), odd_row)
    path = write(tmp_path, _apply(jsonl(rows), edit, where))
    if path.read_bytes().lstrip()[:1] in (b"", b"["):
        return  # not JSON lines: the fast path is never offered these
    event("proven clean" if prove(path) is not None else "left to the scan")
    both_ways(path)


def test_a_progress_bar_starts_over_when_the_scan_takes_over(tmp_path, capsys):
    path = write(tmp_path, jsonl([ROW] * 50 + [{**ROW, "output": ""}]))
    shown = validate_dataset(path, progress=True)
    assert [b.line for b in shown.bad_rows] == [51]
    assert shown.as_json() == validate_dataset(path, progress=False, fast=False).as_json()
    assert "qa.jsonl" in capsys.readouterr().err  # the bar, labelled with the file


# -- sharegpt -------------------------------------------------------------------------------------

SHAREGPT = resolve_mapping({"file_name": "x", "formatting": "sharegpt"})


def turn(role: str, value: object) -> dict:
    return {"from": role, "value": value}


def chat(*turns: dict, **extra: object) -> dict:
    return {"conversations": list(turns), **extra}


CLEAN_CHATS = [
    chat(turn("human", "Hi"), turn("gpt", "Hello.")),
    chat(turn("system", "Be brief."), turn("human", "Q1"), turn("gpt", "A1"), turn("human", "Q2"), turn("gpt", "A2")),
    chat(turn("human", "Weather?"), turn("function_call", "{}"), turn("observation", "sun"), turn("gpt", "Sunny.")),
    chat(turn("human", ""), turn("gpt", "A blank question is allowed."), id=3),
    chat(turn("system", 5), turn("human", "Is a system value read as a turn?"), turn("gpt", "No, so it is free.")),
]


def test_clean_sharegpt_is_proven_clean(tmp_path):
    path = write(tmp_path, jsonl(CLEAN_CHATS[:4]))
    clean = prove(path, SHAREGPT)
    assert clean is not None and clean.rows == 4
    assert both_ways(path, formatting="sharegpt")["ok"]


def test_sharegpt_with_role_content_tags(tmp_path):
    entry = {"file_name": "chat.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"}}
    entry["tags"] = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    (tmp_path / "dataset_info.json").write_text(json.dumps({"chat": entry}))
    rows = [{"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]}] * 3
    path = write(tmp_path, jsonl(rows), "chat.jsonl")
    assert prove(path, resolve_mapping(entry)).rows == 3
    fast = validate_dataset("chat", tmp_path).as_json()
    assert fast == validate_dataset("chat", tmp_path, fast=False).as_json() and fast["ok"]


CHAT_DEFECTS = {
    "roles out of order": chat(turn("gpt", "A"), turn("human", "Q")),
    "odd number of turns": chat(turn("human", "Q"), turn("gpt", "A"), turn("human", "Q2")),
    "blank answer": chat(turn("human", "Q"), turn("gpt", " ")),
    "empty answer": chat(turn("human", "Q"), turn("gpt", "")),
    "system only": chat(turn("system", "Be brief.")),
    "no messages": chat(),
    "role no tag names": chat(turn("human", "Q"), turn("bot", "A")),
    "system in the middle": chat(turn("human", "Q"), turn("system", "S"), turn("gpt", "A")),
    "two user turns": chat(turn("human", "Q"), turn("observation", "O"), turn("gpt", "A")),
    "number as a value": chat(turn("human", "Q"), turn("gpt", 3)),
    "null role": chat(turn("human", "Q"), {"from": None, "value": "A"}),
    "message without value": chat(turn("human", "Q"), {"from": "gpt"}),
    "not a list": {"conversations": "Q: hi A: hello"},
    "alpaca row": ROW,
}


@pytest.mark.parametrize("name", list(CHAT_DEFECTS))
def test_what_it_cannot_prove_in_sharegpt_is_scanned_line_by_line(tmp_path, name):
    path = write(tmp_path, jsonl([CLEAN_CHATS[0], CHAT_DEFECTS[name], CLEAN_CHATS[1]]))
    assert prove(path, SHAREGPT) is None
    both_ways(path, formatting="sharegpt")


_roles = st.sampled_from(["human", "gpt", "system", "observation", "function_call", "bot"])
_chat_turn = st.fixed_dictionaries({"from": _roles, "value": st.one_of(_clean_text, _any_text)})
_clean_chat = st.lists(st.sampled_from(CLEAN_CHATS[:4]), min_size=1, max_size=8)
_odd_chat = st.builds(lambda turns: {"conversations": turns}, st.lists(_chat_turn, max_size=5))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=_clean_chat,
    odd_row=st.none() | st.just(CLEAN_CHATS[4]) | _odd_chat,
    edit=_edit,
    where=st.floats(0, 1),
    chunk=st.integers(200, 2000),  # the longest clean line is 193 bytes
)
def test_a_sharegpt_report_is_the_same_with_and_without_the_fast_path(
    tmp_path, monkeypatch, rows, odd_row, edit, where, chunk
):
    monkeypatch.setattr(dataset_fast, "CHUNK_BYTES", chunk)
    if odd_row is not None:
        rows.insert(int(where * len(rows)), odd_row)
    path = write(tmp_path, _apply(jsonl(rows), edit, where))
    if path.read_bytes().lstrip()[:1] in (b"", b"["):
        return
    event("proven clean" if prove(path, SHAREGPT) is not None else "left to the scan")
    both_ways(path, formatting="sharegpt")


def test_the_cli_starts_without_the_fast_paths_libraries():
    """numpy and msgspec load when a file is checked, not for `llamafactory-rocm --help` or `presets`."""
    import subprocess
    import sys

    code = "import sys, llamafactory_rocm.cli.main; print(sorted({'numpy', 'msgspec'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
