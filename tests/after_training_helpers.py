"""Shared by the after-training tests: a machine snapshot read as this machine, and a real PEFT adapter."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from llamafactory_rocm.rules import Context
from tests.conftest import load_snapshot, make_ctx


def here_ctx(name: str, installed: frozenset[str] | None = None, **snapshot: Any) -> Context:
    """``make_ctx(name)`` as if probed on this machine (``ctx.planned`` False), with snapshot fields replaced."""
    snap = load_snapshot(name).model_copy(update={"source": "probe", **snapshot})
    return dataclasses.replace(make_ctx(name), snapshot=snap, installed=installed)


def planned_ctx(name: str, installed: frozenset[str] | None = None) -> Context:
    return dataclasses.replace(make_ctx(name), installed=installed)


def peft_adapter_config(folder: Path, base: str, r: int = 8) -> Path:
    """An adapter_config.json written by PEFT itself (what LLaMA-Factory's training saves)."""
    from peft import LoraConfig

    LoraConfig(
        r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"], base_model_name_or_path=base
    ).save_pretrained(str(folder))
    return folder


def peft_adapter(model_dir: Path, folder: Path, r: int = 8) -> Path:
    """A LoRA adapter with weights on ``model_dir``, saved by PEFT (untrained: B is zero, as PEFT initialises)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"]))
    peft_model.save_pretrained(str(folder))
    return folder


# LLaMA-Factory alone after training, as `llamafactory-cli export` (export_model) and `llamafactory-cli chat`
# (a ChatModel, then one answer: what the first message of a chat does) run a config, many cases in one child
# process with the hook off (tests/stock_runner.hook_off_env). The error kept is the whole exception.
AFTER_RUNNER = r"""
import contextlib, io, json, sys
manifest, results_file = sys.argv[1], sys.argv[2]
results = {}
for case in json.load(open(manifest)):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            if case["command"] == "export":
                from llamafactory.train.tuner import export_model
                export_model(dict(case["config"]))
            else:
                from llamafactory.chat import ChatModel
                ChatModel(dict(case["config"])).chat([{"role": "user", "content": case["message"]}])
        code, last = 0, ""
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
        last = f"SystemExit: {stop.code} " + err.getvalue()[-1500:]
    except BaseException as exc:
        code, last = 1, f"{type(exc).__name__}: {exc}"
    sys.__stderr__.write(f"== {case['id']}\n" + err.getvalue()[-2000:] + "\n" + last[:2000] + "\n")
    results[case["id"]] = {"exit": code, "error": " ".join(last.split())[:2000]}
    with open(results_file, "w") as f:
        json.dump(results, f)
"""


def run_after_alone(
    cases: list[dict[str, Any]], work: Path, env: dict[str, str], *, timeout: float = 300
) -> tuple[dict[str, dict[str, Any]], str]:
    """Run ``cases`` (each ``id``, ``command``, ``config``, ``message``) in one child process; id -> {"exit",
    "error"} for each case it finished, and its log."""
    import json
    import subprocess
    import sys

    manifest, results_file = work / "after-cases.json", work / "after-results.json"
    manifest.write_text(json.dumps(cases))
    proc = subprocess.run(
        [sys.executable, "-c", AFTER_RUNNER, str(manifest), str(results_file)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    results = json.loads(results_file.read_text()) if results_file.is_file() else {}
    return results, proc.stdout + proc.stderr


# A folder on PYTHONPATH whose sitecustomize hides the packages named in HIDE_PACKAGES from the import system
# (importlib's PathFinder finds no spec for them): a machine where they are not installed, for the stock run
# and the check alike.
HIDE_SITECUSTOMIZE = """
import importlib.machinery, os
_HIDDEN = frozenset(filter(None, os.environ.get("HIDE_PACKAGES", "").split(",")))
_find = importlib.machinery.PathFinder.find_spec.__func__
def _find_spec(cls, fullname, path=None, target=None):
    if fullname.partition(".")[0] in _HIDDEN:
        return None
    return _find(cls, fullname, path, target)
importlib.machinery.PathFinder.find_spec = classmethod(_find_spec)
"""
