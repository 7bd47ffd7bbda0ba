"""The recorded stock outcomes (tests/stock_runner.py ``replay``, issue 52 item 7): a case is answered from the
record only with the installed versions, unchanged inputs and outside its day's share; a real run that differs
from its record fails. The stock child itself is stood in for here (``_run``): what is tested is which cases
reach it, and what the record makes of their answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import stock_runner


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A record file of its own, a child that 'trains' (exit 0, writes out/w) and counts the cases it ran."""
    monkeypatch.setattr(stock_runner, "RECORD", tmp_path / "records" / "stock_runs.json")
    ran: list[str] = []
    exits = {"default": 0}

    def child(cases, work, env, *, name, timeout):
        results = {}
        for case in cases:
            ran.append(case["id"])
            out = Path(case["dir"]) / "out"
            out.mkdir(exist_ok=True)
            (out / "w").write_text(case["id"])
            results[case["id"]] = {"exit": exits.get(case["id"], exits["default"]), "error": f"at {case['dir']}"}
        return results, stock_runner._NOTHING

    monkeypatch.setattr(stock_runner, "_run", child)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")

    def case(name: str) -> dict:
        folder = tmp_path / "cases" / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.yaml").write_text(f"model_name_or_path: {model}\noutput_dir: {folder / 'out'}\n")
        return {"id": name, "dir": str(folder), "args": [str(folder / "config.yaml")]}

    return {"ran": ran, "case": case, "model": model, "exits": exits, "tmp": tmp_path}


def _go(cases, world):
    """The cases run (or answered) in folders as a fresh session has them: nothing written yet."""
    for case in cases:
        (Path(case["dir"]) / "out" / "w").unlink(missing_ok=True)
    return stock_runner.run_alone(cases, world["tmp"], {}, name="t", timeout=10, replay=True)[0]


def test_recorded_cases_are_answered_from_the_record_but_todays_share(world, monkeypatch):
    monkeypatch.setenv(stock_runner.MODE_ENV, "record")
    cases = [world["case"](f"c{i}") for i in range(12)]
    first = _go(cases, world)
    assert world["ran"] == [c["id"] for c in cases] and all(r["wrote"] == ["out/w"] for r in first.values())
    record = json.loads(stock_runner.RECORD.read_text())
    assert record["versions"] == stock_runner.installed_versions() and len(record["runs"]) == 12
    monkeypatch.setenv(stock_runner.MODE_ENV, "replay")
    world["ran"].clear()
    for case in cases:
        (Path(case["dir"]) / "out" / "w").unlink()
    today = [c["id"] for c in cases if stock_runner.runs_today(stock_runner.case_key(c))]
    again = _go(cases, world)
    assert world["ran"] == today and len(today) < 12
    for case in cases:
        got = again[case["id"]]
        assert got["exit"] == 0 and got["wrote"] == ["out/w"] and got["error"] == f"at {case['dir']}"
        assert got.get("replayed", False) == (case["id"] not in today)


def test_a_changed_input_other_versions_or_all_run_for_real(world, monkeypatch):
    monkeypatch.setenv(stock_runner.MODE_ENV, "record")
    cases = [world["case"](f"c{i}") for i in range(8)]
    _go(cases, world)
    monkeypatch.setenv(stock_runner.MODE_ENV, "replay")
    monkeypatch.setattr(stock_runner, "runs_today", lambda key: False)
    keys = [stock_runner.case_key(c) for c in cases]
    (Path(cases[0]["dir"]) / "config.yaml").write_text("changed: 1\n")  # a file of its own
    assert stock_runner.case_key(cases[0]) != keys[0]
    world["ran"].clear()
    _go(cases, world)
    assert world["ran"] == ["c0"]
    (world["model"] / "config.json").write_text('{"hidden_size": 2}')  # a folder its config names
    assert [stock_runner.case_key(c) for c in cases[1:]] != keys[1:]
    world["ran"].clear()
    _go(cases[1:], world)
    assert world["ran"] == [c["id"] for c in cases[1:]]
    monkeypatch.setattr(stock_runner, "installed_versions", lambda: {"transformers": "another"})
    world["ran"].clear()
    _go(cases, world)
    assert len(world["ran"]) == 8


def test_a_real_run_that_differs_from_its_record_fails(world, monkeypatch):
    monkeypatch.setenv(stock_runner.MODE_ENV, "record")
    case = world["case"]("c0")
    _go([case], world)
    monkeypatch.setenv(stock_runner.MODE_ENV, "replay")
    monkeypatch.setattr(stock_runner, "runs_today", lambda key: True)  # its share's day
    world["exits"]["c0"] = 1
    with pytest.raises(AssertionError, match="recorded exit 0, now 1"):
        _go([case], world)


def test_a_run_of_another_shape_is_answered_by_its_key_and_differing_fails(tmp_path, monkeypatch):
    """``replay_one`` (the node corpus's torchrun runs): recorded under STOCK_RUNS=record, answered from the record
    with the paths of this session's folder, run again on its share's day, and a different answer then fails."""
    monkeypatch.setattr(stock_runner, "RECORD", tmp_path / "records" / "stock_runs.json")
    folder = tmp_path / "case"
    folder.mkdir()
    (folder / "train.yaml").write_text("max_steps: 1\n")
    key = stock_runner.case_key({"id": "c", "dir": str(folder), "args": ["train"], "runner": "torchrun"})
    runs: list[int] = []

    def run(code: int = 0):
        runs.append(code)
        return {"returncode": code, "log": f"ranks ran in {folder}"}

    monkeypatch.setenv(stock_runner.MODE_ENV, "record")
    assert stock_runner.replay_one(key, str(folder), "c", run, agree=("returncode",))["returncode"] == 0
    monkeypatch.setenv(stock_runner.MODE_ENV, "replay")
    monkeypatch.setattr(stock_runner, "runs_today", lambda key: False)
    again = stock_runner.replay_one(key, str(folder), "c", lambda: run(1), agree=("returncode",))
    assert runs == [0] and again == {"returncode": 0, "log": f"ranks ran in {folder}", "replayed": True}
    other = stock_runner.case_key({"id": "c", "dir": str(folder), "args": ["train"], "runner": "torchrun 2"})
    assert other != key  # the runner's code is in the key
    monkeypatch.setattr(stock_runner, "runs_today", lambda key: True)  # its share's day
    with pytest.raises(AssertionError, match="returncode recorded 0, now 1"):
        stock_runner.replay_one(key, str(folder), "c", lambda: run(1), agree=("returncode",))
