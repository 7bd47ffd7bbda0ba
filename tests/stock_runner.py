"""LLaMA-Factory alone, the oracle of the verdict tests: configs run as stock ``llamafactory-cli train ARGS``
runs them (``run_exp`` with that ``sys.argv``), with this package's hook off (``LLAMAFACTORY_ROCM=0``).

Shared by ``tests/test_verdict_corpus.py`` and ``tests/property_oracle.py``. Many configs run in one
child process, so the imports are paid once. The error kept is the whole exception, or for a
SystemExit what was written to stderr before it, so that a recorded phrase can be looked for in it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
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
    cases: Sequence[Mapping[str, Any]], work: Path, env: Mapping[str, str], *, name: str, timeout: float
) -> tuple[dict[str, dict[str, Any]], subprocess.CompletedProcess[str]]:
    """Run ``cases`` (each ``id``, ``dir``, ``args`` and optionally ``env``: pairs, None to unset; ``flops``:
    true to count the run's FLOPs with torch's FlopCounterMode, in the answer's ``flops``) in one
    child process; id -> {"exit", "error"} for each case it finished, and the process (its log is
    ``work/<name>.log``). A case missing from the answer is one the child died before."""
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
