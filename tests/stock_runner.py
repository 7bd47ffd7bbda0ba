"""LLaMA-Factory alone, the oracle of the verdict tests: configs run as stock ``llamafactory-cli train ARGS``
runs them (``run_exp`` with that ``sys.argv``), with this package's hook off (``LLAMAFACTORY_ROCM=0``).

Shared by ``tests/test_verdict_corpus.py`` and ``tests/property_oracle.py``. Many configs run in one
child process, so the imports are paid once. The error kept is the whole exception, or for a
SystemExit what was written to stderr before it, so that a recorded phrase can be looked for in it.

Recorded outcomes (``replay=True``, issue 52 item 7): a stock run's outcome changes only when its inputs or the
installed libraries change, so a caller may take it from its line's record (below), where it is keyed
by everything the run reads (its arguments and environment, every file in its folder and in every folder its
arguments and config files name, this runner's code) and stored with the versions of the libraries it ran
with. It is taken from there only where the versions are the installed ones, and never for the share of
cases whose turn it is today (one in ``SHARES``, by the key and the UTC date): those, and every case without a
record, run for real, and a real run whose exit differs from its record fails the caller. One record a
LLaMA-Factory line (``tests/records/stock_runs-<version>.json``): 0.9.5's and main's (tests/main_line.sh).
``replay_one`` does the same for a run of another shape (torchrun ranks and nodes: tests/test_rank_view.py).
``STOCK_RUNS=all`` runs every case for real; ``STOCK_RUNS=record`` runs every case for real and writes the record.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from tests.conftest import offline_env

RUNNER = r"""
import contextlib, io, json, os, sys
manifest, results_file = sys.argv[1], sys.argv[2]
results = {}
for case in json.load(open(manifest)):
    os.chdir(case["dir"])
    saved = dict(os.environ)
    for key, value in case.get("env", ()):
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    sys.argv = ["llamafactory-cli", *case["args"]]
    code, last, err = 0, "", io.StringIO()
    counted = contextlib.nullcontext()
    if case.get("flops"):  # every FLOP the run makes, as torch counts them (the GPU's formula for the CPU's sdpa)
        from torch.utils.flop_counter import FlopCounterMode
        from llamafactory_rocm.forecast.flops import cpu_attention_formulas
        counted = FlopCounterMode(display=False, custom_mapping=cpu_attention_formulas())
    callbacks = []
    if case.get("micro_batches"):  # every forward + backward the trainer's loop runs, as it signals them
        from transformers import TrainerCallback
        class Passes(TrainerCallback):
            count = 0
            def on_substep_end(self, *args, **kwargs):
                self.count += 1
            def on_step_end(self, *args, **kwargs):
                self.count += 1
        callbacks.append(Passes())
    try:
        with contextlib.redirect_stderr(err), counted:
            from llamafactory.train.tuner import run_exp
            run_exp(callbacks=callbacks or None)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
        last = f"SystemExit: {stop.code} " + err.getvalue()[-1500:]
    except BaseException as exc:
        code, last = 1, f"{type(exc).__name__}: {exc}"
    sys.__stderr__.write(f"== {case['id']}\n" + err.getvalue()[-3000:] + "\n" + last[:3000] + "\n")
    os.environ.clear()
    os.environ.update(saved)
    results[case["id"]] = {"exit": code, "error": " ".join(last.split())[:2000]}
    if case.get("flops"):
        results[case["id"]]["flops"] = counted.get_total_flops()
    if callbacks:
        results[case["id"]]["micro_batches"] = callbacks[0].count
    with open(results_file, "w") as f:
        json.dump(results, f)
"""


def hook_off_env(work: Path, **extra: str) -> dict[str, str]:
    """The child's environment: offline, the hook off, and an empty torchaudio (LLaMA-Factory imports it;
    the hook's stand-in for it is off with the hook)."""
    stub = work / "site" / "torchaudio"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "__init__.py").write_text("")
    return offline_env(work, LLAMAFACTORY_ROCM="0", PYTHONPATH=str(work / "site"), **extra)


def run_alone(
    cases: Sequence[Mapping[str, Any]],
    work: Path,
    env: Mapping[str, str],
    *,
    name: str,
    timeout: float,
    replay: bool = False,
) -> tuple[dict[str, dict[str, Any]], subprocess.CompletedProcess[str]]:
    """Run ``cases`` (each ``id``, ``dir``, ``args`` and optionally ``env``: pairs, None to unset; ``flops``:
    true to count the run's FLOPs with torch's FlopCounterMode, in the answer's ``flops``) in one
    child process; id -> {"exit", "error"} for each case it finished, and the process (its log is
    ``work/<name>.log``). A case missing from the answer is one the child died before.

    ``replay``: each case has a folder of its own (``dir``) that holds every file the run writes; the answer
    also says, relative to it, which files the run ``wrote`` (created or changed) and ``removed``, and a case
    recorded with the installed versions is answered from the record (``"replayed": true``) unless its share
    runs today (the module's docstring)."""
    if not replay:
        return _run(cases, work, env, name=name, timeout=timeout)
    mode = os.environ.get(MODE_ENV, "replay")
    record = _load_record()
    current = installed_versions() == record.get("versions")
    own = {case["id"]: _files(Path(case["dir"])) for case in cases}  # read once: the key and a real run's before
    keys = {case["id"]: case_key(case, own[case["id"]]) for case in cases}
    answers: dict[str, dict[str, Any]] = {}
    real = []
    for case in cases:
        key = keys[case["id"]]
        known = record.get("runs", {}).get(key) if current and mode == "replay" else None
        if known is not None and not runs_today(key):
            answers[case["id"]] = _restored(known, str(case["dir"]))
        else:
            real.append(case)
    results, proc = _run(real, work, env, name=name, timeout=timeout) if real else ({}, _NOTHING)
    stale = []
    for case in real:
        got = results.get(case["id"])
        if got is None:
            continue
        after = _files(Path(case["dir"]))
        old = own[case["id"]]
        got["wrote"] = sorted(path for path, digest in after.items() if old.get(path) != digest)
        got["removed"] = sorted(set(old) - set(after))
        known = record.get("runs", {}).get(keys[case["id"]]) if current else None
        if known is not None and known["exit"] != got["exit"]:
            stale.append(f"{case['id']}: recorded exit {known['exit']}, now {got['exit']} ({got['error'][:200]})")
    if mode == "record":
        _write_record(
            {keys[c["id"]]: {**_normalized(results[c["id"]]), "id": c["id"]} for c in real if c["id"] in results}
        )
    assert not stale, f"stock runs differ from tests/records/{RECORD.name} (rerun with {MODE_ENV}=record): {stale}"
    return {**results, **answers}, proc


def replay_one(
    key: str, folder: str, name: str, run: Callable[[], dict[str, Any]], *, agree: Sequence[str] = ("exit",)
) -> dict[str, Any]:
    """One stock run of another shape than ``run_alone``'s (torchrun ranks, several nodes: tests/test_rank_view.py),
    by the same record. ``key``: ``case_key`` of what the run reads, with a ``runner`` (the code that runs it),
    taken before anything else writes to ``folder``; ``run()``: the real run, whose answer is JSON (paths under
    pytest's folders are recorded as ``<tmp>``). Answered from the record where ``run_alone``'s replay would be (the
    module's docstring); a real run whose ``agree`` fields differ from its record fails."""
    mode = os.environ.get(MODE_ENV, "replay")
    record = _load_record()
    current = installed_versions() == record.get("versions")
    known = record.get("runs", {}).get(key) if current else None
    if known is not None and mode == "replay" and not runs_today(key):
        said = json.dumps(known["answer"]).replace("<tmp>", _prefix(folder)).replace("<repo>", str(REPO))
        return {**json.loads(said), "replayed": True}
    got = run()
    normal = json.loads(_normal(json.dumps(got)))
    if known is not None:
        differ = [f for f in agree if known["answer"].get(f) != normal.get(f)]
        assert not differ, f"stock runs differ from {RECORD.name} (rerun with {MODE_ENV}=record): {name}: " + ", ".join(
            f"{f} recorded {known['answer'].get(f)!r}, now {normal.get(f)!r}" for f in differ
        )
    if mode == "record":
        _write_record({key: {"id": name, "answer": normal}})
    return got


# --- recorded outcomes ------------------------------------------------------------------------------------


def _llamafactory_line() -> str:
    try:
        return importlib.metadata.version("llamafactory")
    except importlib.metadata.PackageNotFoundError:
        return "absent"


# one record a LLaMA-Factory line (0.9.5 in .venv, main in tests/main_line.sh's .venv-main), each with its versions
RECORD = Path(__file__).parent / "records" / f"stock_runs-{_llamafactory_line()}.json"
MODE_ENV = "STOCK_RUNS"  # replay (the default), all, record
SHARES = 4  # each day one case in SHARES of those recorded runs for real as well
VERSIONED = ("llamafactory", "transformers", "torch", "peft", "datasets", "trl", "accelerate", "tokenizers")
REPO = Path(__file__).resolve().parents[1]
# pytest's folders: /tmp/pytest-of-<user>/pytest-<n>[/popen-gw<k>], different in every session
_TMP = re.compile(re.escape(tempfile.gettempdir()) + r"/pytest-of-[^/]+/pytest-\d+(?:/popen-gw\d+)?")
_PATH = re.compile(r"(?:<tmp>|<repo>)/[^\s\"',;:]+")
_NOTHING = subprocess.CompletedProcess(args=[], returncode=0, stdout="", stderr="")


def installed_versions() -> dict[str, str]:
    versions = {"python": f"{sys.version_info.major}.{sys.version_info.minor}"}
    for name in VERSIONED:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def runs_today(key: str) -> bool:
    """Whether the recorded case runs for real today as well: its share's turn."""
    day = datetime.datetime.now(datetime.timezone.utc).date().toordinal()
    return int(key[:8], 16) % SHARES == day % SHARES


def _normal(text: str) -> str:
    return _TMP.sub("<tmp>", str(text)).replace(str(REPO), "<repo>")


def _prefix(folder: str) -> str:
    found = _TMP.search(folder)
    return found.group(0) if found else "<tmp>"


def _normalized(result: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _normal(v) if isinstance(v, str) else v for k, v in result.items()}


def _restored(known: Mapping[str, Any], folder: str) -> dict[str, Any]:
    prefix = _prefix(folder)
    back = {k: v.replace("<tmp>", prefix).replace("<repo>", str(REPO)) if isinstance(v, str) else v
            for k, v in known.items() if k != "id"}  # fmt: skip
    return {**back, "replayed": True}


def _files(folder: Path) -> dict[str, str]:
    """Every file under ``folder``, relative path -> its content's digest."""
    if not folder.is_dir():
        return {}
    return {str(p.relative_to(folder)): _digest(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def _digest(path: Path) -> str:
    data = path.read_bytes()
    with contextlib.suppress(UnicodeDecodeError):
        data = _normal(data.decode("utf-8")).encode("utf-8")  # a config names pytest's folder of this session
    return hashlib.sha256(data).hexdigest()[:20]


def _folder_digest(path: str) -> str:
    """A file or folder a run reads that is not its own (the tiny model, the bundled datasets): one digest."""
    target = Path(path)
    files = [target] if target.is_file() else sorted(p for p in target.rglob("*") if p.is_file())
    stats = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _digest_of(path, stats)


@lru_cache(maxsize=256)
def _digest_of(path: str, stats: tuple[tuple[str, int, int], ...]) -> str:
    """Read once a session for as long as no file changed (size, time)."""
    target = Path(path)
    if target.is_file():
        return _digest(target)
    return hashlib.sha256(json.dumps(_files(target), sort_keys=True).encode()).hexdigest()[:20]


def case_key(case: Mapping[str, Any], own: Mapping[str, str] | None = None) -> str:
    """Everything the stock run reads: its arguments and environment, every file in its folder (``own``: those
    files' digests, where the caller read them already), every file or folder outside it that they name (the
    model, the datasets), and this runner's code."""
    folder = Path(case["dir"])
    own = _files(folder) if own is None else own
    texts = [*map(str, case["args"]), *(str(v) for _, v in case.get("env", ()) if v)]
    texts += [(folder / name).read_text(encoding="utf-8", errors="replace") for name in own
              if name.endswith((".yaml", ".yml", ".json")) and (folder / name).stat().st_size < 2**20]  # fmt: skip
    named = {}
    for text in texts:
        for match in _PATH.findall(_normal(text)):
            real = match.replace("<tmp>", _prefix(str(folder))).replace("<repo>", str(REPO))
            if Path(real).exists() and not Path(real).resolve().is_relative_to(folder.resolve()):
                named[match] = _folder_digest(real)
    what = {
        "args": [_normal(a) for a in case["args"]],
        "env": [[k, None if v is None else _normal(v)] for k, v in case.get("env", ())],
        "flags": {k: case[k] for k in ("flops", "micro_batches") if k in case},
        "files": own,
        "named": dict(sorted(named.items())),
        "runner": hashlib.sha256(case.get("runner", RUNNER).encode()).hexdigest()[:20],
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def _load_record() -> dict[str, Any]:
    try:
        return json.loads(RECORD.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    with open(RECORD.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two xdist workers record at once
        yield


def _write_record(runs: Mapping[str, dict[str, Any]]) -> None:
    """Merge ``runs`` into the record (all of it anew where the installed versions differ), atomically."""
    with _locked():
        record = _load_record()
        versions = installed_versions()
        if record.get("versions") != versions:
            record = {"versions": versions, "runs": {}}
        record["about"] = "Stock LLaMA-Factory outcomes by case key: tests/stock_runner.py (STOCK_RUNS=record)"
        record["runs"] = dict(sorted({**record.get("runs", {}), **runs}.items()))
        tmp = RECORD.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, RECORD)


def _run(
    cases: Sequence[Mapping[str, Any]], work: Path, env: Mapping[str, str], *, name: str, timeout: float
) -> tuple[dict[str, dict[str, Any]], subprocess.CompletedProcess[str]]:
    manifest, results_file = work / f"{name}.json", work / f"{name}-results.json"
    manifest.write_text(json.dumps(list(cases)))
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(manifest), str(results_file)],
        cwd=work,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    (work / f"{name}.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    results = json.loads(results_file.read_text()) if results_file.is_file() else {}
    return results, proc
