"""One JSON type per column: the rule agrees with LLaMA-Factory's real loader, case by case, and
every way of checking a file (the line-by-line scan, the fast path, worker processes, a folder of
files) reports the same rows."""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from llamafactory_rocm import dataset_check, dataset_fast, dataset_parallel, dataset_types
from llamafactory_rocm.dataset_check import validate_dataset
from llamafactory_rocm.dataset_entry import resolve_mapping
from llamafactory_rocm.dataset_fast import prove_clean
from llamafactory_rocm.dataset_types import ColumnTypes, loader_runs

ALPACA = resolve_mapping({"file_name": "x"})
CHANGED = "changed from"  # every type finding quotes pyarrow's words


def qa(i: int, **extra: object) -> dict:
    return {"instruction": f"question {i}", "input": "", "output": f"answer {i}", **extra}


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()


def type_findings(report) -> list[tuple[int, str]]:
    return [(b.line, b.reason) for b in report.bad_rows if CHANGED in b.reason]


# -- the rule -------------------------------------------------------------------------------------


def test_null_fits_a_column_of_any_type_before_or_after():
    types = ColumnTypes()
    assert types.conflict({"id": None}, 1) is None
    assert types.conflict({"id": "a"}, 2) is None
    assert types.conflict({"id": None}, 3) is None
    column = types.columns[("id",)]
    assert (column.kind, column.appeared, column.typed) == ("string", (0, 1), (0, 2))


def test_integers_and_decimals_are_both_numbers():
    types = ColumnTypes()
    assert types.conflict({"score": 1}, 1) is None
    assert types.conflict({"score": 0.5}, 2) is None


def test_objects_may_differ_in_their_keys():
    types = ColumnTypes()
    assert types.conflict({"meta": {"a": 1}}, 1) is None
    assert types.conflict({"meta": {"b": "x"}}, 2) is None
    assert types.conflict({"meta": {}}, 3) is None


def test_a_clash_names_the_column_both_types_and_the_first_row():
    types = ColumnTypes()
    types.conflict({"id": 1}, 4)
    reason = types.conflict({"id": "x"}, 9)
    assert reason is not None
    assert reason.startswith("column /id is a string here but a number on line 4")
    assert "Column(/id) changed from number to string" in reason


def test_a_clash_deep_in_a_list_of_objects_names_its_path():
    types = ColumnTypes()
    types.conflict({"turns": [{"role": "user"}]}, 1)
    reason = types.conflict({"turns": [{"role": "user"}, {"role": 2}]}, 2)
    assert reason is not None and "Column(/turns/[]/role) changed from string to number" in reason


def test_a_list_of_mixed_types_clashes_within_its_own_row():
    reason = ColumnTypes().conflict({"tags": [1, "x"]}, 7)
    assert reason is not None and "a number earlier in this row" in reason


def test_a_row_that_clashes_records_nothing():
    types = ColumnTypes()
    types.conflict({"id": 1}, 1)
    assert types.conflict({"new": "x", "id": "x"}, 2) is not None
    assert ("new",) not in types.columns
    assert types.conflict({"new": 5}, 3) is None  # its column's type comes from the first good row


def test_types_of_later_rows_are_taken_in_with_their_lines_shifted():
    first, later = ColumnTypes(), ColumnTypes()
    first.conflict({"id": None}, 1, "a.jsonl")
    later.conflict({"id": "x", "src": "web"}, 3)
    assert first.disagreement(later, line_offset=100) is None
    first.absorb(later, line_offset=100, file="b.jsonl")
    assert first.columns[("id",)].appeared == (0, 1)
    assert first.columns[("id",)].typed == (1, 103)
    assert first.columns[("src",)].appeared == (1, 103)
    clash = ColumnTypes()
    clash.conflict({"src": 1}, 2)
    reason = first.disagreement(clash, line_offset=200)
    assert reason is not None
    assert reason.startswith("line 202: column /src is a number here but a string on b.jsonl:103")


FRACTION = "a decimal or an integer past int64"  # what int64 cannot hold


def test_the_first_batch_fixes_the_columns_for_the_rows_after_it():
    types = ColumnTypes()
    rows = [
        {"id": 1, "tag": None, "tags": [], "meta": {"a": 1}},
        {"id": 2, "tag": None, "tags": [], "meta": {"a": 2}},  # line 2: the last of the first batch
        {"id": 2.0, "tag": None, "tags": [], "meta": {"a": 3}},  # a whole decimal casts to int64: fine
        {"id": 3, "tag": "x", "tags": [], "meta": {"a": 4}},  # a value in a column null so far
        {"id": 4, "tag": "x", "tags": ["y"], "meta": {"a": 5, "b": 1}},  # list elements; a new key
        {"id": 4.5, "tag": "x", "tags": ["y"], "meta": {"a": 6}, "src": None},  # a fraction; a new column
    ]
    for line, row in enumerate(rows, start=1):
        assert types.conflict(row, line) is None
    late = types.late_rows(first_batch_lines=2)
    assert [(where, reason.split(" here")[0]) for where, reason in late] == [
        ((0, 4), "column /tag is null in every row of the loader's first batch (the first 2 lines) and a string"),
        ((0, 5), "column /meta/b first appears"),  # one reason a row: /meta/b sorts before /tags/[]
        ((0, 6), f"column /id holds whole numbers only in the loader's first batch (the first 2 lines) and {FRACTION}"),
    ]
    assert types.late_rows(first_batch_lines=None) == []  # one batch: nothing comes after it
    lists = ColumnTypes()
    for line, numbers in enumerate([[1, 2], [3], [2.5]], start=1):
        lists.conflict({"scores": numbers}, line)
    assert [(where, reason.split(" here")[0]) for where, reason in lists.late_rows(first_batch_lines=2)] == [
        (
            (0, 3),
            f"column /scores/[] holds whole numbers only in the loader's first batch (the first 2 lines) "
            f"and {FRACTION}",
        )
    ]
    assert [reason.split(" here")[0] for _, reason in types.late_rows(first_batch_lines=5)] == [
        "column /src first appears"  # the decimal 2.0 on line 3 made /id a column of decimals
    ]


# -- agreement with the real loader ---------------------------------------------------------------

# (first value, second value): each in its own row, with a column of the same name.
LOADER_CASES = {
    "int then decimal": (1, 2.5),
    "number then string": (1, "x"),
    "string then number": ("x", 1),
    "boolean then number": (True, 1),
    "string then boolean": ("x", True),
    "null then string": (None, "x"),
    "object then string": ({"a": 1}, "x"),
    "object then null": ({"a": 1}, None),
    "list then string": ([1], "x"),
    "list of numbers then of strings": ([1], ["x"]),
    "empty list then list of strings": ([], ["x"]),
    "object field number then string": ({"a": 1}, {"a": "x"}),
    "objects with other keys": ({"a": 1}, {"b": "x"}),
    "list of objects, field changes": ([{"r": "u"}], [{"r": 1}]),
    "date string then string": ("2024-01-01", "hello"),
}


def _loads(path: Path, cache: Path) -> bool:
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    try:
        datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(cache))
    except Exception:  # any failure to load is what is compared
        return False
    return True


@pytest.mark.parametrize("layout", ["jsonl", "json"])
@pytest.mark.parametrize("first, then", list(LOADER_CASES.values()), ids=list(LOADER_CASES))
def test_validation_fails_exactly_the_files_the_loader_fails_on(tmp_path, layout, first, then):
    """LLaMA-Factory reads a local file with datasets.load_dataset("json") (a JSON array through
    pandas): whatever it cannot load, validation reports, and only that."""
    rows = [qa(0, extra=first), qa(1, extra=first), qa(2, extra=then)]
    path = tmp_path / f"data.{layout}"
    array = "[\n" + ",\n".join(map(json.dumps, rows)) + "\n]\n"  # row n on line n + 1
    path.write_bytes(jsonl(rows) if layout == "jsonl" else array.encode())
    report = validate_dataset(path)
    loads = _loads(path, tmp_path / "cache")
    assert report.ok == loads, report.summary()
    assert [line for line, _ in type_findings(report)] == ([] if loads else [3 if layout == "jsonl" else 4])


# Values that parse but that the loader cannot hold, as written in the file: (JSON text, what the
# finding names in JSON lines (pyarrow), and in a JSON array (pandas)); None: the loader holds it.
# NOT_CHECKED: the loader changes it and validation does not say so (docs/troubleshooting.md);
# MISSED: the loader stops at it and validation does not say so (ditto).
# Stricter(...): a finding although this loader holds it (the same value elsewhere in a row stops it).
NOT_CHECKED, MISSED = "not checked", "missed"


class Stricter(str):
    pass


UNHOLDABLE_CASES = {
    "a decimal beyond a double": ("1e400", "1e400", None),  # pandas reads inf
    "the same, negative": ("-1e400", "-1e400", None),
    "a zero with too big an exponent (pyarrow goes by the exponent; pandas reads null)": ("0e999", MISSED, NOT_CHECKED),
    "the same, after a point": ("0.0e400", MISSED, NOT_CHECKED),
    "an exponent within 308 plus the digits after the point (inf)": ("1.5e309", None, None),
    "past 18 significant digits the point's digits do not count": ("111111111111111111.5e309", "e309", None),
    "up to 18 they do (inf)": ("11111111111111111.5e309", None, None),
    "the largest double": ("1.7e308", None, None),
    "Infinity as a literal": ("Infinity", None, None),
    "a decimal too small to hold (reads as 0)": ("1e-400", None, None),
    "an integer past int64 (a double in JSON lines, uint64 in an array)": (str(2**63), None, Stricter(str(2**63))),
    "the same in an object (an array cannot hold it)": (f'{{"n": {2**63}}}', None, str(2**63)),
    "the same in a list": (f"[1, {2**63}]", None, str(2**63)),
    "an integer past uint64": (str(2**64), None, str(2**64)),
    "an integer below int64": (str(-(2**63) - 1), None, str(-(2**63) - 1)),
    "an integer of 400 digits (inf in JSON lines)": ("1" + "0" * 400, NOT_CHECKED, "(401 digits)"),
    "a lone high surrogate (pandas drops it)": ('"a\\ud800"', "\\ud800", "\\ud800"),
    "a lone low surrogate": ('"\\udc00b"', "\\udc00", "\\udc00"),
    "two high surrogates": ('"\\ud800\\ud800"', "\\ud800", "\\ud800"),
    "a surrogate pair (one emoji)": ('"\\ud83d\\ude00"', None, None),
    "a pair, then a lone low one": ('"\\ud83d\\ude00\\ude00"', "\\ude00", "\\ude00"),
    "an escaped backslash, then a lone low one": ('"\\\\ud83d\\ude00"', "\\ude00", "\\ude00"),
    "a lone surrogate deep in a key (pandas drops it)": ('{"k": [{"\\uDBFF": 1}]}', "\\udbff", "\\udbff"),
}


@pytest.mark.parametrize("layout", ["jsonl", "json"])
@pytest.mark.parametrize("text, in_lines, in_array", list(UNHOLDABLE_CASES.values()), ids=list(UNHOLDABLE_CASES))
def test_values_the_loader_cannot_hold_are_found_where_it_stops(tmp_path, layout, text, in_lines, in_array):
    """Found where the load stops, or where it would lose the text (pandas drops a lone high
    surrogate); passed where the loader keeps the value."""
    rows = [json.dumps(qa(0)), json.dumps(qa(1))[:-1] + f', "extra": {text}}}']
    path = tmp_path / f"data.{layout}"
    path.write_text("\n".join(rows) + "\n" if layout == "jsonl" else "[\n" + ",\n".join(rows) + "\n]\n")
    named = in_lines if layout == "jsonl" else in_array
    report = validate_dataset(path)
    loaded = _loaded_value(path, tmp_path / "cache")
    kept = _same(loaded, json.loads(text))
    if named in (NOT_CHECKED, MISSED):
        assert (report.ok, kept, isinstance(loaded, Exception)) == (True, False, named is MISSED)
        return
    assert (report.ok, kept) == (named is None, named is None or isinstance(named, Stricter)), report.summary()
    if named is not None:
        [bad] = report.bad_rows
        assert (bad.line, named in bad.reason) == (2 if layout == "jsonl" else 3, True), bad.reason


def _near_the_exponent_limit(rng: random.Random) -> str:
    """A nonzero decimal whose exponent lies near 308 plus its digits after the point."""
    integer = (
        "0"
        if rng.random() < 0.3
        else str(rng.randint(1, 9))
        + "".join(rng.choice("0123456789") for _ in range(rng.choice([0, 0, 1, 4, 14, 15, 16, 17, 18, 24])))
    )
    places = rng.choice([0, 1, 2, 5, 15, 16, 17, 18, 19, 22, 30]) or (1 if integer == "0" else 0)
    zeros = rng.random() < 0.3  # leading zeros after the point (0.000...5)
    fraction = "".join("0" if zeros and i < places - 1 else rng.choice("0123456789") for i in range(places))
    fraction = fraction[:-1] + "7" if places else ""  # never all zeros
    sign = "-" if rng.random() < 0.2 else ""
    exponent = rng.randint(places + 283, places + 311)
    return f"{sign}{integer}{'.' + fraction if places else ''}{rng.choice('eE')}{exponent}"


def test_decimals_near_the_exponent_limit_are_found_exactly_where_pyarrow_stops(tmp_path):
    """pyarrow's own verdict on each number alone, against the scan's on a file of them, one a row."""
    pa, paj = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.json")
    rng = random.Random(7)
    numbers = [_near_the_exponent_limit(rng) for _ in range(1500)]

    def stops(number: str) -> bool:
        try:
            paj.read_json(io.BytesIO(f'{{"x": {number}}}'.encode()))
        except pa.ArrowInvalid as err:
            assert "too big" in str(err)
            return True
        return False

    path = tmp_path / "numbers.jsonl"
    path.write_text("".join(json.dumps(qa(i))[:-1] + f', "x": {n}}}\n' for i, n in enumerate(numbers)))
    report = validate_dataset(path, max_errors=len(numbers))
    expected = [line for line, number in enumerate(numbers, start=1) if stops(number)]
    assert 100 < len(expected) < 1400  # both verdicts well represented
    assert [b.line for b in report.bad_rows] == expected


@pytest.mark.parametrize("layout", ["jsonl", "json"])
def test_an_integer_longer_than_python_reads_is_a_finding_not_a_crash(tmp_path, layout):
    rows = [json.dumps(qa(0)), json.dumps(qa(1))[:-1] + f', "extra": {"7" * 5000}}}', json.dumps(qa(2))]
    path = tmp_path / f"data.{layout}"
    path.write_text("\n".join(rows) + "\n" if layout == "jsonl" else "[\n" + ",\n".join(rows) + "\n]\n")
    for fast in (True, False):
        report = validate_dataset(path, fast=fast)
        assert [(b.line, "digits, which Python's json does not read" in b.reason) for b in report.bad_rows] == [
            (2 if layout == "jsonl" else 3, True)
        ]


def _same(loaded: object, written: object) -> bool:
    """Numbers as a double holds them (pandas parses decimals to the last bit or two); the rest exactly."""
    if isinstance(written, int | float) and isinstance(loaded, int | float):
        try:
            return math.isclose(loaded, written, rel_tol=1e-15)
        except OverflowError:  # an integer past any double (read as inf)
            return False
    return loaded == written


def _loaded_value(path: Path, cache: Path) -> object:
    """The extra column of the last row as the loader reads it (features cast back), or the error."""
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(cache))[-1]["extra"]
    except Exception as caught:  # any failure to load is what is compared
        return caught


# -- the loader's first batch, with files big enough to have a second one ------------------------

PAD = "x" * 250
BIG_ROWS, LATE_FROM = 45_000, 40_000  # ~13 MB: the first 10 MB batch ends near row 35,000


def padded(i: int, **extra: object) -> dict:
    return {"instruction": f"q{i:06d}", "input": "", "output": PAD, **extra}


BATCH_CASES = {  # what the rows from LATE_FROM on have that the first batch lacked
    "a column first seen after the first batch": lambda i, late: padded(i, **({"src": "web"} if late else {})),
    "the same, with null": lambda i, late: padded(i, **({"src": None} if late else {})),
    "a value in a column null all through it": lambda i, late: padded(i, src="web" if late else None),
    "a fraction in a column of whole numbers": lambda i, late: padded(i, score=2.5 if late else 1),
    "a whole decimal in a column of whole numbers": lambda i, late: padded(i, score=2.0 if late else 1),
    "a key first seen in an object": lambda i, late: padded(i, meta={"a": 1, "b": "x"} if late else {"a": 1}),
    "elements in lists empty all through it": lambda i, late: padded(i, tags=["x"] if late else []),
    "a fraction in lists of whole numbers": lambda i, late: padded(i, scores=[2.5] if late else [1, 2]),
    "whole decimals, then a fraction": lambda i, late: padded(i, score=2.5 if late else (1.0 if i % 2 else 1)),
    "a column left out later": lambda i, late: padded(i, **({} if late else {"src": "web"})),
    "an integer past int64 in a column of whole numbers": lambda i, late: padded(i, score=2**63 if late else 1),
    "the largest int64 in a column of whole numbers": lambda i, late: padded(i, score=2**63 - 1 if late else 1),
    "a whole decimal past int64 in lists of whole numbers": lambda i, late: padded(i, s=[1e19] if late else [1]),
    "a word in a column of dates": lambda i, late: padded(i, day="n/a" if late else "2024-01-01"),
    "an empty string after date times": lambda i, late: padded(i, at="" if late else "2024-01-01T10:00:00Z"),
    "a word in lists of dates": lambda i, late: padded(i, days=["n/a"] if late else ["2024-02-29"]),
    "dates in a column of words (loads)": lambda i, late: padded(i, day="2024-01-01" if late else "n/a"),
}


@pytest.mark.parametrize("make", list(BATCH_CASES.values()), ids=list(BATCH_CASES))
def test_validation_fails_the_big_files_the_loader_fails_on(tmp_path, make):
    path = tmp_path / "big.jsonl"
    path.write_bytes(jsonl([make(i, i >= LATE_FROM) for i in range(BIG_ROWS)]))
    report = validate_dataset(path)
    loads = _loads(path, tmp_path / "cache")
    assert report.ok == loads, report.summary()
    assert [b.line for b in report.bad_rows] == ([] if loads else [LATE_FROM + 1])


@pytest.mark.parametrize("first, later", [(1, "x"), ("x", 1)], ids=["number, then string", "string, then number"])
def test_a_type_change_in_a_big_file_stops_the_load_within_its_batch(tmp_path, first, later):
    """The change falls inside one of the loader's 10 MB batches (unless it is exactly on a batch
    edge, where datasets casts instead), and the reason says both."""
    path = tmp_path / "big.jsonl"
    path.write_bytes(jsonl([padded(i, id=later if i >= LATE_FROM else first) for i in range(BIG_ROWS)]))
    report = validate_dataset(path, max_errors=3)
    assert not _loads(path, tmp_path / "cache")
    assert report.bad_row_count == BIG_ROWS - LATE_FROM
    assert [b.line for b in report.bad_rows] == [LATE_FROM + 1, LATE_FROM + 2, LATE_FROM + 3]
    kind = "number" if first == 1 else "string"
    assert "if both share a 10 MB batch" in report.bad_rows[0].reason
    assert report.bad_rows[0].reason.endswith(f"keeps it only if it casts to a {kind}. Give it one type in every row")


def test_files_loaded_in_parallel_must_agree_where_one_process_would_cast(tmp_path):
    """Strings in the first file, numbers in the next: one process casts the numbers to strings,
    several processes (preprocessing_num_workers, 4 to 16 in the presets) cannot merge the files.
    Validation asks for one type, and says both."""
    folder, load_order = _folder_of_two(tmp_path)
    load_order[0].write_bytes(jsonl([qa(i, id=f"x{i}") for i in range(3)]))
    load_order[1].write_bytes(jsonl([qa(i, id=i) for i in range(3)]))
    assert _loads_files(load_order, tmp_path / "one")
    assert not _loads_files(load_order, tmp_path / "two", num_proc=2)
    report = dataset_check.validate_entry("two", {"file_name": folder.name}, tmp_path)
    assert [(b.file, b.line) for b in report.bad_rows] == [(load_order[1].name, line) for line in (1, 2, 3)]
    assert "or the files load in parallel (preprocessing_num_workers)" in report.bad_rows[0].reason


@pytest.mark.parametrize("extra_line", [0, 1], ids=["on the last line of the batch", "on the line after"])
def test_the_first_batch_ends_where_the_loader_ends_it(tmp_path, extra_line):
    """Rows of one length; the first with a new column sits on the batch's last line or just after."""
    rows = [padded(i) for i in range(BIG_ROWS)]
    path = tmp_path / "edge.jsonl"
    path.write_bytes(jsonl(rows))
    last = dataset_check.first_batch_lines(path)
    assert last is not None and 30_000 < last < LATE_FROM
    index = last - 1 + extra_line
    rows[index] = {**padded(index, src="w"), "output": PAD[: -len(', "src": "w"')]}
    path.write_bytes(jsonl(rows))
    assert path.stat().st_size == len(jsonl([padded(i) for i in range(BIG_ROWS)]))  # same bytes, same batch
    report = validate_dataset(path)
    loads = _loads(path, tmp_path / "cache")
    assert loads == (extra_line == 0)
    assert [b.line for b in report.bad_rows] == ([] if loads else [index + 1])


@pytest.mark.parametrize(
    "first, second, loads",
    [
        ({}, {"src": "web"}, False),  # the second file has a column the first lacks
        ({"src": "web"}, {}, True),  # the other way round is fine
        ({"score": 1}, {"score": 2.5}, False),
        ({"src": None}, {"src": "web"}, False),
    ],
)
def test_the_first_file_fixes_the_columns_of_a_folder(tmp_path, first, second, loads):
    """LLaMA-Factory passes a folder's files in os.listdir order; the first one's first batch counts."""
    folder, load_order = _folder_of_two(tmp_path)
    load_order[0].write_bytes(jsonl([qa(i, **first) for i in range(3)]))
    load_order[1].write_bytes(jsonl([qa(i, **second) for i in range(3)]))
    report = dataset_check.validate_entry("two", {"file_name": folder.name}, tmp_path)
    assert _loads_files(load_order, tmp_path / "cache") == loads
    assert [(b.file, b.line) for b in report.bad_rows] == ([] if loads else [(load_order[1].name, 1)])


MERGE_CASES = {  # (the first file's column, the next file's, whether datasets can merge them)
    "strings, then a file of dates": ({"day": "n/a"}, {"day": "2024-01-01"}, False),
    "decimals, then whole numbers": ({"score": 2.5}, {"score": 1}, False),
    "whole numbers, then a whole decimal": ({"score": 1}, {"score": 2.0}, False),
    "lists of strings, then of dates": ({"days": ["n/a"]}, {"days": ["2024-01-01"]}, False),
    "an object's strings, then its dates": ({"meta": {"day": "n/a"}}, {"meta": {"day": "2024-01-01"}}, False),
    "dates in both": ({"day": "2024-01-01"}, {"day": "2024-02-02T10:00"}, True),
    "decimals in both": ({"score": 1.5}, {"score": 2.0}, True),
}


@pytest.mark.parametrize("first, second, merges", list(MERGE_CASES.values()), ids=list(MERGE_CASES))
def test_files_that_load_in_parallel_must_agree_on_their_first_batch(tmp_path, first, second, merges):
    """Each file loaded in its own process takes the types of its own first batch: int64 and double,
    or timestamps and strings, do not merge. One process casts the second file to the first."""
    folder, load_order = _folder_of_two(tmp_path)
    load_order[0].write_bytes(jsonl([qa(i, **first) for i in range(3)]))
    load_order[1].write_bytes(jsonl([qa(i, **second) for i in range(3)]))
    assert _loads_files(load_order, tmp_path / "one")
    assert _loads_files(load_order, tmp_path / "two", num_proc=2) == merges
    report = dataset_check.validate_entry("two", {"file_name": folder.name}, tmp_path)
    assert [(b.file, b.line) for b in report.bad_rows] == ([] if merges else [(load_order[1].name, 1)])
    assert merges or "datasets cannot merge files that load in parallel" in report.bad_rows[0].reason


def test_a_folder_of_json_arrays_has_no_dates(tmp_path):
    """pandas reads a JSON array, and leaves a column called day a string: no rule on dates."""
    folder = tmp_path / "data"
    folder.mkdir()
    for name, day in (("a.json", "2024-01-01"), ("b.json", "n/a")):
        (folder / name).write_text(json.dumps([qa(i, day=day) for i in range(3)]))
    files = [folder / name for name in os.listdir(folder)]
    report = dataset_check.validate_entry("two", {"file_name": folder.name}, tmp_path)
    assert (report.ok, _loads_files(files, tmp_path / "cache")) == (True, True), report.summary()


OWN_BATCH_CASES = {  # a later file's column, in its own first batch and after it (the first file has strings)
    "null in its first batch, then a value": lambda late: {"src": "web" if late else None},
    "absent from its first batch, then there": lambda late: {"src": "web"} if late else {},
}


@pytest.mark.parametrize("later", list(OWN_BATCH_CASES.values()), ids=list(OWN_BATCH_CASES))
def test_a_later_file_loaded_in_a_process_of_its_own_is_fixed_by_its_own_first_batch(tmp_path, later):
    """One process casts the big second file to the first file's strings; in parallel the second
    file's own first batch fixes its column, and its later rows stop the load."""
    folder, load_order = _folder_of_two(tmp_path)
    load_order[0].write_bytes(jsonl([qa(i, src="web") for i in range(3)]))
    load_order[1].write_bytes(jsonl([padded(i, **later(i >= LATE_FROM)) for i in range(BIG_ROWS)]))
    assert _loads_files(load_order, tmp_path / "one")
    assert not _loads_files(load_order, tmp_path / "two", num_proc=2)
    report = dataset_check.validate_entry("two", {"file_name": folder.name}, tmp_path)
    assert [(b.file, b.line) for b in report.bad_rows] == [(load_order[1].name, LATE_FROM + 1)]
    assert "loads in a process of its own (preprocessing_num_workers)" in report.bad_rows[0].reason


def test_the_dates_of_a_json_array_are_strings_that_do_not_merge_with_timestamps(tmp_path):
    """pandas reads a JSON array without dates: one process casts its date strings to the first
    file's timestamps, parallel processes cannot merge strings with timestamps."""
    folder, load_order = _folder_of_two(tmp_path, suffix=".json")
    load_order[0].write_bytes(jsonl([qa(i, day="2024-01-01") for i in range(3)]))  # JSON lines: timestamps
    load_order[1].write_text(json.dumps([qa(i, day="2024-01-02") for i in range(3)]))  # a JSON array: strings
    assert _loads_files(load_order, tmp_path / "one")
    assert not _loads_files(load_order, tmp_path / "two", num_proc=2)
    report = dataset_check.validate_entry("two", {"file_name": folder.name}, tmp_path)
    assert [(b.file, b.line) for b in report.bad_rows] == [(load_order[1].name, 1)]
    assert "datasets cannot merge files that load in parallel" in report.bad_rows[0].reason


def test_the_runs_of_files_are_those_datasets_gives_its_processes():
    sharding = pytest.importorskip("datasets.utils.sharding")
    for files in range(1, 13):
        for processes in range(1, 15):
            jobs = min(processes, files)  # datasets lowers num_proc to the files, and one file takes one
            expected = [] if jobs == 1 else sharding._distribute_shards(files, jobs)
            assert loader_runs(files, processes) == expected, (files, processes)
    assert loader_runs(3, None) == [range(0, 1), range(1, 2), range(2, 3)]  # not known: one a file


FOLDER_CASES = {  # four small files' extra column, in load order
    "a null file in a later run": [{"src": "web"}, {"src": "web"}, {"src": None}, {"src": "web"}],
    "a file without it in a later run": [{"src": "web"}, {"src": "web"}, {}, {"src": "web"}],
    "a column only in a later run": [{}, {}, {"src": "web"}, {}],
    "whole numbers start a later run": [{"s": 1.5}, {"s": 1.5}, {"s": 1}, {"s": 2.5}],
    "null, then strings": [{"src": None}, {"src": "web"}, {"src": "web"}, {"src": "web"}],
    "empty lists, then elements": [{"t": []}, {"t": ["x"]}, {"t": ["x"]}, {"t": ["x"]}],
    "an object key first seen later": [{"m": {"a": 1}}, {"m": {"a": 1, "b": "x"}}, {"m": {"a": 1}}, {"m": {"a": 1}}],
    "a column left out later": [{"src": "web"}, {}, {}, {}],
    "dates, then words": [{"d": "2024-01-01"}, {"d": "n/a"}, {"d": "n/a"}, {"d": "n/a"}],
    "words, then dates": [{"d": "n/a"}, {"d": "2024-01-01"}, {"d": "n/a"}, {"d": "n/a"}],
}


@pytest.mark.parametrize("processes", [1, 2, 4])
@pytest.mark.parametrize("columns", list(FOLDER_CASES.values()), ids=list(FOLDER_CASES))
def test_with_the_configs_processes_validation_fails_exactly_the_folders_the_loader_fails_on(
    tmp_path, columns, processes
):
    """preprocessing_num_workers known (check and train read it from the config): each process's run
    of files is fixed by its own first batch, and the runs must merge."""
    folder, load_order = _folder_in_load_order(tmp_path, [f"part{n}.jsonl" for n in range(len(columns))])
    for path, extra in zip(load_order, columns, strict=True):
        path.write_bytes(jsonl([qa(i, **extra) for i in range(3)]))
    _validated_as_loaded(tmp_path, folder, load_order, processes)


EMPTY_FILE_CASES = {  # files in load order: extra columns of three rows, EMPTY (0 bytes) or BLANK (blank lines)
    "a file of 0 bytes starts a later run": [{"s": 1.5}, {"s": 1.5}, "EMPTY", {"s": 1}],
    "the same, the files alike": [{}, {}, "EMPTY", {}],
    "a first file of 0 bytes": ["EMPTY", {"src": "web"}, {"src": "web"}],
    "blank lines start a later run (pyarrow: a batch of no columns)": [{}, {}, "BLANK", {}],
    "an empty JSON array starts a later run (pandas: the same)": [{}, {}, "[]", {}],
    "an empty JSON array later in a run": [{}, "[]", {}, {}],
}


@pytest.mark.parametrize("processes", [1, 2, 4])
@pytest.mark.parametrize("files", list(EMPTY_FILE_CASES.values()), ids=list(EMPTY_FILE_CASES))
def test_the_loader_skips_a_file_of_0_bytes_and_the_next_one_fixes_the_types(tmp_path, files, processes):
    folder, load_order = _folder_in_load_order(tmp_path, [f"part{n}.jsonl" for n in range(len(files))])
    for path, extra in zip(load_order, files, strict=True):
        if extra == "BLANK":
            path.write_text("\n\n")
        elif extra == "[]":
            path.write_text("[]")
        elif extra != "EMPTY":
            path.write_bytes(jsonl([qa(i, **extra) for i in range(3)]))
    report = _validated_as_loaded(tmp_path, folder, load_order, processes)
    for path, extra in zip(load_order, files, strict=True):  # skipped (a warning), or alone and stopping the load
        if extra == "EMPTY":
            [said] = [line for line in report.warnings + report.errors if line.startswith(f"{path.name} is empty")]
            assert (said in report.errors) == ("SchemaInferenceError" in said), said


def test_a_file_of_0_bytes_that_loads_in_a_process_of_its_own_stops_the_load(tmp_path):
    """The CLI's default (processes not known) checks for one process a file, among others."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(jsonl([qa(i) for i in range(3)]))
    (folder / "b.jsonl").touch()
    assert not _loads_files([folder / "a.jsonl", folder / "b.jsonl"], tmp_path / "cache", num_proc=2)
    report = dataset_check.validate_entry("d", {"file_name": folder.name}, tmp_path)
    assert report.warnings == []  # the error says it all
    assert report.errors == [
        "b.jsonl is empty (0 bytes): with preprocessing_num_workers 2 or more it loads in a process of its own, "
        "which then stops the load (datasets: SchemaInferenceError: Please pass `features` or at least one "
        "example). Remove the empty files"
    ]


def test_a_folder_of_empty_files_has_no_rows(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (folder / name).touch()
    report = dataset_check.validate_entry("d", {"file_name": folder.name}, tmp_path)
    assert not report.ok and report.errors == [f"every file in {folder} is empty: there are no rows"]


ARRAY_FOLDER_CASES = {  # two files in load order: (JSON array or lines, the score of each of its rows)
    "arrays: whole decimals (int64 to pandas), then a fraction": (("array", [4.0, 5.0]), ("array", [4.5, 3.0])),
    "lines: a fraction, then an array of whole decimals": (("lines", [4.5, 3.0]), ("array", [4.0, 5.0])),
    "lines: whole numbers, then an array of whole decimals": (("lines", [4, 3]), ("array", [4.0, 5.0])),
    "arrays: whole decimals, then whole numbers": (("array", [4.0, 5.0]), ("array", [4, 3])),
    "arrays: whole decimals in lists stay doubles": (("array", [[4.0]]), ("array", [[4.5]])),
}


@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize("files", list(ARRAY_FOLDER_CASES.values()), ids=list(ARRAY_FOLDER_CASES))
def test_pandas_reads_a_column_of_whole_decimals_in_a_json_array_as_int64(tmp_path, files, processes):
    folder, load_order = _folder_of_two(tmp_path, suffix=".json")
    for path, (layout, scores) in zip(load_order, files, strict=True):
        rows = [qa(i, score=score) for i, score in enumerate(scores)]
        path.write_text(json.dumps(rows) if layout == "array" else jsonl(rows).decode())
    _validated_as_loaded(tmp_path, folder, load_order, processes)


ARRAY_DATE_CASES = {  # JSON lines of dates (timestamp[s]), then a JSON array of the same strings (pandas: strings)
    "dates": "2024-01-02",
    "dates with a zone (the cast of the array's strings stops)": "2024-01-02T10:00:00Z",
    "dates with an offset": "2024-01-02 10:00-05:00",
}


@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize("news", [False, True], ids=["rows known", "rows with news"])
@pytest.mark.parametrize("day", list(ARRAY_DATE_CASES.values()), ids=list(ARRAY_DATE_CASES))
def test_a_json_arrays_dates_cast_to_timestamps_only_without_a_zone(tmp_path, day, news, processes):
    """``news``: the array's rows also hold a whole decimal (int64 to pandas), so that each row is
    walked column by column instead of passing as known."""
    folder, load_order = _folder_of_two(tmp_path, suffix=".json")
    load_order[0].write_bytes(jsonl([qa(i, day=day, n=1) for i in range(3)]))
    load_order[1].write_text(json.dumps([qa(i, day=day, n=4.0 if news else 4) for i in range(3)]))
    _validated_as_loaded(tmp_path, folder, load_order, processes)


def _validated_as_loaded(
    tmp_path: Path, folder: Path, load_order: list[Path], processes: int
) -> dataset_check.DatasetReport:
    """The folder's report with the config's processes known, asserted to pass exactly where the
    real loader with as many processes loads it."""
    loads = _loads_files(load_order, tmp_path / "cache", num_proc=processes)
    options = dataset_check._ScanOptions(loader_processes=processes)
    report = dataset_check.validate_entry("d", {"file_name": folder.name}, tmp_path, options=options)
    assert report.ok == loads, report.summary()
    return report


def _folder_of_two(tmp_path: Path, suffix: str = ".jsonl") -> tuple[Path, list[Path]]:
    """A folder with a.jsonl and b.jsonl (or another suffix), and its files in the order os.listdir gives them."""
    return _folder_in_load_order(tmp_path, [f"a{suffix}", f"b{suffix}"])


def _folder_in_load_order(tmp_path: Path, names: list[str]) -> tuple[Path, list[Path]]:
    """A folder of empty files of these names, and its files in the order os.listdir (and so
    LLaMA-Factory) gives them: the caller writes each file's content by its place in that order."""
    folder = tmp_path / "data"
    folder.mkdir()
    for name in names:
        (folder / name).touch()
    return folder, [folder / name for name in os.listdir(folder)]


def _loads_files(files: list[Path], cache: Path, num_proc: int | None = None) -> bool:
    """As LLaMA-Factory loads a folder: its files as one data_files list, num_proc from
    preprocessing_num_workers."""
    datasets = pytest.importorskip("datasets")
    data_files = [str(f) for f in files]
    try:
        datasets.load_dataset("json", data_files=data_files, split="train", cache_dir=str(cache), num_proc=num_proc)
    except Exception:  # any failure to load is what is compared
        return False
    return True


# -- every way of checking reports the same rows --------------------------------------------------


def test_the_fast_path_learns_a_column_that_appears_late(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset_fast, "CHUNK_BYTES", 512)
    rows = [qa(i) for i in range(200)] + [qa(i, source="web", meta={"n": i}) for i in range(200, 300)]
    path = tmp_path / "late.jsonl"
    path.write_bytes(jsonl(rows))
    clean = prove_clean(path, 0, path.stat().st_size, ALPACA)
    assert clean is not None
    assert clean.types.columns[("source",)].typed == (0, 201)
    assert clean.types.columns[("meta", "n")].appeared == (0, 201)


def test_whole_decimals_keep_the_fast_path(tmp_path, monkeypatch):
    """A column of 1.0 and 2.0 is proven at C speed (a decimal that is a whole number types as such);
    the first decimal and the first fraction are still recorded where they are."""
    monkeypatch.setattr(dataset_fast, "CHUNK_BYTES", 512)
    rows = [qa(i, score=1 if i < 3 else float(i)) for i in range(300)]
    rows[250]["score"] = 2.5
    path = tmp_path / "scores.jsonl"
    path.write_bytes(jsonl(rows))
    clean = prove_clean(path, 0, path.stat().st_size, ALPACA)
    assert clean is not None
    column = clean.types.columns[("score",)]
    assert (column.decimal, column.fraction) == ((0, 4), (0, 251))


def _timestamp_candidates() -> list[str]:
    dates = itertools.product(["0000", "1900", "2000", "2023", "2024", "2100", "9999", "024"], range(14), range(33))
    times = itertools.product(
        ["T", " ", "t"],
        ["00", "23", "24", "1"],
        ["", ":00", ":59", ":60", ":5", "00"],
        ["", ":59", ":60"],
        ["", ".5"],
        ["", "Z", "z", "+01", "-0130", "+01:30", "-23:59", "+24:00", "+1", "+01:5", " +01:00"],
    )
    return [
        *(f"{y}-{m:02d}-{d:02d}" for y, m, d in dates),
        *("".join(("2024-02-29", *parts)) for parts in times),
        *("2024-1-1", "20240101", "2024/01/01", "", " 2024-01-01", "2024-01-01 ", "2024-01", "2024-001"),
    ]


def test_dates_are_the_strings_pyarrow_reads_as_timestamps():
    """Every candidate in one row, one column each: pyarrow infers timestamp[s] for exactly those
    that ``is_timestamp`` takes (real dates only: 2024-02-29, not 2023-02-29)."""
    paj = pytest.importorskip("pyarrow.json")
    candidates = _timestamp_candidates()
    row = json.dumps({f"c{i}": text for i, text in enumerate(candidates)}).encode()
    schema = paj.read_json(io.BytesIO(row)).schema
    read_as = {text: str(schema.field(f"c{i}").type) for i, text in enumerate(candidates)}
    assert sum(kind == "timestamp[s]" for kind in read_as.values()) > 1000  # the test sees both kinds
    assert {text for text, kind in read_as.items() if kind == "timestamp[s]"} == {
        text for text in candidates if dataset_types.is_timestamp(text)
    }


def test_the_fast_path_keeps_columns_of_dates_and_learns_the_first_word(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset_fast, "CHUNK_BYTES", 512)
    rows = [qa(i, day=f"2024-01-{i % 28 + 1:02d}") for i in range(300)]
    rows[250]["day"] = "n/a"
    path = tmp_path / "days.jsonl"
    path.write_bytes(jsonl(rows))
    clean = prove_clean(path, 0, path.stat().st_size, ALPACA)
    assert clean is not None
    assert clean.types.columns[("day",)].undated == (0, 251)


def test_the_fast_path_steps_aside_for_prompts_that_are_all_dates(tmp_path, monkeypatch):
    """The row rules type prompts as text: one that is also a column of dates is left to the scan,
    which reports the first prompt that is not a date after the first batch."""
    monkeypatch.setattr(dataset_fast, "CHUNK_BYTES", 512)
    monkeypatch.setattr(dataset_check, "LOADER_BATCH_BYTES", 2000)
    rows = [{"instruction": "2024-01-01", "input": "", "output": f"answer {i}"} for i in range(100)]
    rows[80]["instruction"] = "what day?"
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(jsonl(rows))
    assert prove_clean(path, 0, path.stat().st_size, ALPACA) is None
    report = validate_dataset(path)
    assert [(b.line, "only dates" in b.reason) for b in report.bad_rows] == [(81, True)]


def test_keys_used_as_ids_keep_memory_bounded_and_say_so(tmp_path, monkeypatch):
    """A new key in every row would make a column path each: past MAX_COLUMN_PATHS they are not
    kept (a warning says from where), and past MAX_TYPED_PATHS the fast path steps aside."""
    monkeypatch.setattr(dataset_types, "MAX_COLUMN_PATHS", 50)
    monkeypatch.setattr(dataset_check, "MAX_COLUMN_PATHS", 50)
    monkeypatch.setattr(dataset_fast, "MAX_TYPED_PATHS", 20)
    monkeypatch.setattr(dataset_fast, "CHUNK_BYTES", 512)
    rows = [qa(i, scores={f"user{i}": i}) for i in range(200)]
    path = tmp_path / "ids.jsonl"
    path.write_bytes(jsonl(rows))
    assert prove_clean(path, 0, path.stat().st_size, ALPACA) is None
    report = validate_dataset(path)
    assert report.as_json() == validate_dataset(path, fast=False).as_json()
    assert report.ok
    assert len(report.warnings) == 1 and report.warnings[0].startswith("more than 50 column paths")
    assert "from line 47 on are not checked" in report.warnings[0]  # 4 paths, then one a row: 51 on row 47


def test_a_worker_that_keeps_no_more_paths_hands_the_file_to_one_pass(tmp_path, monkeypatch):
    """Each worker's table fills on its own: a column the file knows may be new to the second
    range, so its clash would go unseen there (found in review)."""
    if not dataset_parallel.can_fork():
        pytest.skip("no fork on this platform: the scan stays in one process")
    monkeypatch.setattr(dataset_types, "MAX_COLUMN_PATHS", 50)
    monkeypatch.setattr(dataset_check, "MAX_COLUMN_PATHS", 50)
    monkeypatch.setattr(dataset_fast, "MAX_TYPED_PATHS", 20)
    rows = [qa(0, x=1)] + [qa(i, scores={f"u{i}": i}) for i in range(1, 120)] + [qa(120, x="s")]
    path = tmp_path / "ids.jsonl"
    path.write_bytes(jsonl(rows))
    monkeypatch.setattr(dataset_check, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(dataset_parallel, "RANGE_BYTES", path.stat().st_size // 2 + 1)
    many = validate_dataset(path, jobs=2)
    assert many.as_json() == validate_dataset(path, fast=False).as_json()
    assert [line for line, _ in type_findings(many)] == [121]


def test_column_types_travel_between_processes_however_deep(tmp_path):
    """A worker pickles its types back: the tree is as deep as the data, the pickle is not."""
    types = ColumnTypes()
    types.conflict(qa(0, deep=json.loads("[" * 400 + "1" + "]" * 400)), 1)
    back = pickle.loads(pickle.dumps(types))
    assert back.columns == types.columns
    assert back.conflict(qa(1, deep=json.loads("[" * 400 + '"x"' + "]" * 400)), 2) is not None


def test_how_deep_json_may_nest_does_not_depend_on_the_caller(tmp_path):
    """Python's json stops at the recursion limit, which counts the caller's frames too: the scan
    counts from itself, so a script, the CLI and a worker agree (found in review)."""
    path = tmp_path / "deep.jsonl"
    nested = "[" * 980 + "]" * 980
    path.write_text(json.dumps(qa(0))[:-1] + f', "deep": {nested}}}\n' + json.dumps(qa(1)) + "\n")

    def from_deeper(frames: int) -> dict:
        return from_deeper(frames - 1) if frames else validate_dataset(path, fast=False).as_json()

    assert from_deeper(0) == from_deeper(300)
    assert from_deeper(0)["ok"]


def test_a_key_that_is_not_valid_unicode_prints(tmp_path):
    """A lone surrogate (\\ud800) in a key is named in the reason; the CLI prints it escaped, no traceback."""
    path = tmp_path / "sur.jsonl"
    path.write_text(
        json.dumps({**qa(0), "\ud800": 1}) + "\n" + json.dumps({**qa(1), "\ud800": "s"}) + "\n", encoding="ascii"
    )
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}  # strict: what a UTF-8 terminal does
    run = subprocess.run(
        [sys.executable, "-m", "llamafactory_rocm.cli.main", "datasets", "validate", str(path)],
        capture_output=True,
        text=True,
        env=env,
        errors="replace",
    )
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert run.stdout.count("a string here holds \\ud800 without the other half") == 2, run.stdout


@pytest.mark.parametrize("depth", [600, 1200])
def test_deep_nesting_is_a_finding_or_fine_never_a_crash(tmp_path, depth):
    """Python's json stops near 1,000 levels: a bad row then; below that, both ways agree."""
    nested = "[" * depth + "]" * depth
    path = tmp_path / "deep.jsonl"
    path.write_text(json.dumps(qa(0))[:-1] + f', "deep": {nested}}}\n' + json.dumps(qa(1)) + "\n")
    fast = validate_dataset(path)
    assert fast.as_json() == validate_dataset(path, fast=False).as_json()
    if depth < 900:
        assert fast.ok
    else:
        assert [(b.line, b.reason) for b in fast.bad_rows] == [
            (1, "malformed JSON: nested too deeply for Python's json (about 1,000 levels)")
        ]


def test_the_fast_path_steps_aside_for_a_clash_and_the_scan_names_every_row(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset_fast, "CHUNK_BYTES", 512)
    rows = [qa(i, id=i) for i in range(300)]
    rows[120]["id"] = "a-120"
    rows[250]["id"] = "a-250"
    path = tmp_path / "ids.jsonl"
    path.write_bytes(jsonl(rows))
    assert prove_clean(path, 0, path.stat().st_size, ALPACA) is None
    fast = validate_dataset(path)
    assert fast.as_json() == validate_dataset(path, fast=False).as_json()
    assert [line for line, _ in type_findings(fast)] == [121, 251]
    assert fast.bad_row_count == 2 and fast.rows == 300


def test_the_fast_path_gives_up_on_keys_that_never_stop_coming(tmp_path, monkeypatch):
    """Ids used as keys make every chunk new: past MAX_LEARNED_CHUNKS the scan takes over."""
    monkeypatch.setattr(dataset_fast, "CHUNK_BYTES", 256)
    rows = [qa(i, scores={f"k{i}": i}) for i in range(400)]
    path = tmp_path / "keys.jsonl"
    path.write_bytes(jsonl(rows))
    assert prove_clean(path, 0, path.stat().st_size, ALPACA) is None
    assert validate_dataset(path).ok
    monkeypatch.setattr(dataset_fast, "MAX_LEARNED_CHUNKS", 10_000)  # the limit, not the data, said no
    assert prove_clean(path, 0, path.stat().st_size, ALPACA) is not None


def test_ranges_that_disagree_are_checked_again_in_one_pass(tmp_path, monkeypatch):
    """Each worker checks its rows against its own first rows; where a later range's types clash
    with an earlier one's, only one pass can say which rows stray, and it runs."""
    if not dataset_parallel.can_fork():
        pytest.skip("no fork on this platform: the scan stays in one process")
    monkeypatch.setattr(dataset_check, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(dataset_parallel, "RANGE_BYTES", 2048)
    monkeypatch.setattr(dataset_fast, "CHUNK_BYTES", 512)
    rows = [qa(i, id=i) for i in range(400)]
    for i in range(300, 400):  # a whole range of string ids: clean on its own
        rows[i]["id"] = f"a-{i}"
    rows[50]["id"] = "a-50"
    path = tmp_path / "ids.jsonl"
    path.write_bytes(jsonl(rows))
    many = validate_dataset(path, jobs=2, max_errors=1000)
    assert many.as_json() == validate_dataset(path, fast=False, max_errors=1000).as_json()
    assert [line for line, _ in type_findings(many)] == [51, *range(301, 401)]


def test_a_row_that_strays_within_a_later_range_names_the_files_line(tmp_path, monkeypatch):
    """A worker knows only its range's lines: the reason of a clash found there would name the wrong
    first row, so the file is checked again in one pass (found by the property below)."""
    if not dataset_parallel.can_fork():
        pytest.skip("no fork on this platform: the scan stays in one process")
    monkeypatch.setattr(dataset_check, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(dataset_parallel, "RANGE_BYTES", 300)
    path = tmp_path / "late.jsonl"
    path.write_bytes(jsonl([qa(0), qa(1), qa(2), qa(3, src=True), qa(4, src=1)]))
    assert len(dataset_parallel.plan_ranges(path, path.stat().st_size, 2)) == 2  # rows 4 and 5 in the second
    many = validate_dataset(path, jobs=2)
    assert many.as_json() == validate_dataset(path, fast=False).as_json()
    assert [(line, reason.split(":")[0]) for line, reason in type_findings(many)] == [
        (5, "column /src is a number here but a boolean on line 4")
    ]


def test_files_of_a_folder_share_one_type_per_column(tmp_path):
    """A folder loads as one dataset: a column typed one way in one file and another in the next."""
    folder, (first, then) = _folder_of_two(tmp_path)
    first.write_bytes(jsonl([qa(i, id=i) for i in range(3)]))
    then.write_bytes(jsonl([qa(i, id=f"x{i}") for i in range(3)]))
    entry = {"file_name": folder.name}
    report = dataset_check.validate_entry("two", entry, tmp_path)
    reference = dataset_check.validate_entry("two", entry, tmp_path, options=dataset_check._ScanOptions(fast=False))
    assert report.as_json() == reference.as_json()
    assert [(b.file, b.line) for b in report.bad_rows] == [(then.name, 1), (then.name, 2), (then.name, 3)]
    assert f"a number on {first.name}:1" in report.bad_rows[0].reason


def test_the_bundled_datasets_keep_one_type_per_column():
    from llamafactory_rocm.dataset_check import load_dataset_info
    from llamafactory_rocm.resources import datasets_dir

    for name in load_dataset_info(datasets_dir()) or {}:
        report = validate_dataset(name)
        assert not type_findings(report), report.summary()


# -- the property ---------------------------------------------------------------------------------

_values = st.sampled_from(
    [None, 1, 2.0, 2.5, 2**64, 1e19, True, "s", "", "2024-01-01", [], [1], ["s"], ["2024-01-01"], [None], {}, {"k": 1}]
)
_row = st.builds(
    lambda i, extra: qa(i, **extra),
    st.integers(0, 9),
    st.dictionaries(st.sampled_from(["id", "src", "meta"]), _values, max_size=3),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_row, min_size=1, max_size=30), batch=st.integers(1, 2000), chunk=st.integers(40, 600))
def test_every_way_of_checking_gives_the_same_report(tmp_path, monkeypatch, rows, batch, chunk):
    """Any mix of types, a first batch of any size, chunks of any size: the fast path and worker
    processes report what the line-by-line scan reports, row for row."""
    monkeypatch.setattr(dataset_check, "LOADER_BATCH_BYTES", batch)
    monkeypatch.setattr(dataset_fast, "CHUNK_BYTES", chunk)
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(jsonl(rows))
    reference = validate_dataset(path, fast=False, max_errors=100).as_json()
    event("type findings" if CHANGED in str(reference) else "no type findings")
    event("late rows" if "first batch" in str(reference) else "no late rows")
    event("dates" if "only dates" in str(reference) else "no dates")
    assert validate_dataset(path, max_errors=100).as_json() == reference
    if dataset_parallel.can_fork():
        monkeypatch.setattr(dataset_check, "MIN_PARALLEL_BYTES", 0)
        monkeypatch.setattr(dataset_parallel, "RANGE_BYTES", 300)
        assert validate_dataset(path, jobs=2, max_errors=100).as_json() == reference


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=st.lists(st.lists(_row, min_size=1, max_size=12), min_size=2, max_size=3),
    batch=st.integers(1, 1500),
    chunk=st.integers(40, 600),
)
def test_every_way_of_checking_a_folder_gives_the_same_report(tmp_path_factory, monkeypatch, files, batch, chunk):
    """A folder's files, each checked by the fast path, the scan or workers, and compared with the
    first file: the same report every way."""
    monkeypatch.setattr(dataset_check, "LOADER_BATCH_BYTES", batch)
    monkeypatch.setattr(dataset_fast, "CHUNK_BYTES", chunk)
    root = tmp_path_factory.mktemp("folder")
    (root / "data").mkdir()
    for number, rows in enumerate(files):
        (root / "data" / f"part{number}.jsonl").write_bytes(jsonl(rows))

    def report(**options: object) -> dict:
        scan = dataset_check._ScanOptions(max_errors=100, **options)  # type: ignore[arg-type]
        return dataset_check.validate_entry("d", {"file_name": "data"}, root, options=scan).as_json()

    reference = report(fast=False)
    event("merge findings" if "cannot merge" in str(reference) else "no merge findings")
    assert report() == reference
    if dataset_parallel.can_fork():
        monkeypatch.setattr(dataset_check, "MIN_PARALLEL_BYTES", 0)
        monkeypatch.setattr(dataset_parallel, "RANGE_BYTES", 300)
        assert report(jobs=2) == reference
