"""The loader's verdict: ours must be datasets' own on every layout (single files, batches, folders
loaded in 1-3 processes, 0-byte files, values pyarrow cannot hold), and failures name their line."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from llamafactory_rocm.dataset.loader import LoadError, stream_tables

BATCH = 10 << 20  # the json builder's chunksize


def real_load(files: list[Path], num_proc: int | None, cache: Path) -> int | None:
    """Rows datasets.load_dataset("json") loads as LLaMA-Factory calls it; None when it fails."""
    import datasets

    try:
        data = datasets.load_dataset(
            "json", data_files=[str(f) for f in files], num_proc=num_proc, cache_dir=str(cache), split="train"
        )
    except Exception:
        return None
    return len(data)


def ours(files: list[Path], num_proc: int | None) -> int | None:
    try:
        return sum(batch.table.num_rows for batch in stream_tables(files, num_proc, progress=False))
    except LoadError:
        return None


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def big_then(path: Path, later: dict) -> Path:
    """A JSON-lines file longer than one batch whose last row differs from the first batch's rows."""
    row = json.dumps({"instruction": "q" * 200, "output": "a" * 200}) + "\n"
    with path.open("w", encoding="utf-8") as handle:
        handle.write(row * (BATCH // len(row) + 50))
        handle.write(json.dumps(later) + "\n")
    return path


FILES = {
    "clean": ('{"a": "x", "b": 1}\n{"a": "y", "b": 2}\n', ".jsonl"),
    "blank lines": ('{"a": "x"}\n\n   \n{"a": "y"}\n', ".jsonl"),
    "number in a text column": ('{"a": "x"}\n{"a": 5}\n', ".jsonl"),
    "malformed line": ('{"a": "x"}\n{"a": }\n{"a": "z"}\n', ".jsonl"),
    "truncated last line": ('{"a": "x"}\n{"a": "y', ".jsonl"),
    "object then list": ('{"a": {"k": 1}}\n{"a": [1]}\n', ".jsonl"),
    "dates then words": ('{"a": "2024-01-01"}\n{"a": "hello"}\n', ".jsonl"),
    "integer too big": ('{"a": 1}\n{"a": 123456789012345678901234567890}\n', ".jsonl"),
    "deep nesting": ('{"a": ' + "[" * 200 + "1" + "]" * 200 + "}\n", ".jsonl"),
    "array": (json.dumps([{"a": "x"}, {"a": "y"}], indent=2), ".json"),
    "array mixed types": (json.dumps([{"a": "x"}, {"a": 5}]), ".json"),
    "array unterminated": ('[{"a": "x"},\n{"a": "y"}\n', ".json"),
    "array of dates": (json.dumps([{"a": "2024-01-01"}, {"a": "2024-01-02"}]), ".json"),
    "empty file": ("", ".jsonl"),
    "empty array": ("[]", ".json"),
    "not utf-8": (b'{"a": "x"}\n{"a": "\xff"}\n', ".jsonl"),
}


@pytest.mark.parametrize("case", sorted(FILES))
def test_a_file_gets_the_loaders_own_verdict(tmp_path, case):
    text, suffix = FILES[case]
    path = tmp_path / f"data{suffix}"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert ours([path], None) == real_load([path], None, tmp_path / "cache")


@pytest.mark.parametrize("later", [{"instruction": 5, "output": "x"}, {"instruction": "x", "extra": "y"}])
def test_a_type_change_after_the_first_batch_gets_the_loaders_verdict_and_its_line(tmp_path, later):
    path = big_then(tmp_path / "big.jsonl", later)
    assert real_load([path], None, tmp_path / "cache") is None
    with pytest.raises(LoadError) as caught:
        list(stream_tables([path], progress=False))
    assert caught.value.line == path.read_bytes().count(b"\n")  # the last line, the one that differs
    assert caught.value.file == path


def test_a_malformed_line_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": "x"}\n\n{"a": "y"}\n{"a": }\n{"a": "z"}\n')
    with pytest.raises(LoadError) as caught:
        list(stream_tables([path], progress=False))
    assert (caught.value.file, caught.value.line) == (path, 4)


def test_a_broken_json_array_is_named_by_its_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n  {"a": "x"},\n  {"a": }\n]\n')
    with pytest.raises(LoadError) as caught:
        list(stream_tables([path], progress=False))
    assert caught.value.line == 3


def test_rows_know_their_lines(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": "x"}\n\n{"a": "y"}\n{"a": "z"}\n')
    (batch,) = stream_tables([path], progress=False)
    assert batch.row_lines() == [1, 3, 4]
    array = tmp_path / "rows.json"
    array.write_text(json.dumps([{"a": "x"}, {"a": "y"}], indent=2))
    (batch,) = stream_tables([array], progress=False)
    assert batch.row_lines() == [2, 5]


FOLDERS = {
    "same types": [('{"a": "x"}\n', "1.jsonl"), ('{"a": "y"}\n', "2.jsonl")],
    "a number where the first file has text": [('{"a": "x"}\n', "1.jsonl"), ('{"a": 3}\n', "2.jsonl")],
    "a column the first file lacks": [('{"a": "x"}\n', "1.jsonl"), ('{"a": "y", "b": 1}\n', "2.jsonl")],
    "a 0-byte file first": [("", "0.jsonl"), ('{"a": "x"}\n', "1.jsonl"), ('{"a": "y"}\n', "2.jsonl")],
    "a 0-byte file between": [('{"a": "x"}\n', "1.jsonl"), ("", "2.jsonl"), ('{"a": 3}\n', "3.jsonl")],
    "arrays of dates and strings": [
        (json.dumps([{"a": "2024-01-01"}]), "1.json"),
        (json.dumps([{"a": "hello"}]), "2.json"),
    ],
    "whole decimals then decimals": [(json.dumps([{"a": 1.0}]), "1.json"), (json.dumps([{"a": 1.5}]), "2.json")],
}


@pytest.mark.parametrize("num_proc", [None, 2, 3])
@pytest.mark.parametrize("case", sorted(FOLDERS))
def test_a_folder_gets_the_loaders_own_verdict_in_any_number_of_processes(tmp_path, case, num_proc):
    files = []
    for text, name in FOLDERS[case]:
        (tmp_path / name).write_text(text)
        files.append(tmp_path / name)
    assert ours(files, num_proc) == real_load(files, num_proc, tmp_path / "cache")


def test_no_arrow_cache_is_left_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    path = jsonl(tmp_path / "d.jsonl", [{"a": "x"}] * 10)
    assert ours([path], None) == 10
    assert not list((tmp_path / "tmp").iterdir())
    assert not (tmp_path / "hf").exists() or not list((tmp_path / "hf").rglob("*.arrow"))


def test_a_progress_bar_counts_the_bytes_when_asked(tmp_path, capsys):
    path = jsonl(tmp_path / "d.jsonl", [{"a": "x"}] * 1000)
    list(stream_tables([path], progress=True))
    assert "checking" in capsys.readouterr().err
    list(stream_tables([path]))  # small and not a terminal: no bar
    assert "checking" not in capsys.readouterr().err
