"""Issue 29's corpus: ``check --for export|chat`` and LLaMA-Factory alone give the same verdict, for the same
reason, on configs for the tiny local model and a real PEFT adapter.

Each case is run through stock LLaMA-Factory with the hook off (``export_model`` as ``llamafactory-cli
export`` calls it; a ``ChatModel`` and its answer to one message, as ``llamafactory-cli chat`` does), all in
one child process so the imports are paid once, and through ``check_config(command=...)`` in this process.
Each case records what the stock run does: it ``runs``, or it ``fails`` with which of the library's own
words (``words``), and which of check's codes name it (``codes``). They agree when check is ok exactly when
the stock run finishes, and, both refusing, when one of check's error codes (or the code a refusal of
LLaMA-Factory's own check names, ``old``) is among the case's codes and the library's words are in check's
message (``check_words`` where check says it in its own words: the stock run fails later, on another line).
A case whose stock run does not do what is recorded fails too: the record, or the library, changed.

``api`` and ``webchat`` on a machine without their packages: the packages are hidden from the import
system for the child processes (a sitecustomize on PYTHONPATH), and stock ``llamafactory-cli api|webchat``
(hook off) stops with LLaMA-Factory's NameError, while ``check --for`` and the hook refuse before loading.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from llamafactory_rocm.check.run import check_config
from llamafactory_rocm.findings import Level
from llamafactory_rocm.resources import datasets_dir
from tests.after_training_helpers import HIDE_SITECUSTOMIZE, peft_adapter, run_after_alone
from tests.conftest import offline_env
from tests.stock_runner import hook_off_env

MESSAGE = "Hi"  # the chat's first message, for the stock run


@dataclass(frozen=True)
class Files:
    model: Path  # the tiny Llama
    adapter: Path  # a LoRA adapter trained (saved by PEFT) on it
    other_model: Path  # a tiny Llama of other shapes
    other_adapter: Path  # an adapter on that one
    a_file: Path
    work: Path


Build = Callable[[Files, Path], dict[str, Any]]


@dataclass(frozen=True)
class Case:
    id: str
    command: str  # export or chat
    build: Build
    expect: str = "runs"  # or "fails"
    words: str = ""  # when it fails: in LLaMA-Factory's (or transformers', peft's) own error
    codes: frozenset[str] = frozenset()
    check_words: str = ""  # when check says it in its own words


def fails(words: str, *codes: str, check_words: str = "") -> dict[str, Any]:
    return {"expect": "fails", "words": words, "codes": frozenset(codes), "check_words": check_words}


def export(f: Files, d: Path, **changes: Any) -> dict[str, Any]:
    config = {
        "model_name_or_path": str(f.model),
        "adapter_name_or_path": str(f.adapter),
        "template": "llama3",
        "export_dir": str(d / "merged"),
    }
    return {k: v for k, v in {**config, **changes}.items() if v is not None}


def chat(f: Files, d: Path, **changes: Any) -> dict[str, Any]:
    config = {
        "model_name_or_path": str(f.model),
        "adapter_name_or_path": str(f.adapter),
        "template": "llama3",
        "max_new_tokens": 4,
    }
    return {k: v for k, v in {**config, **changes}.items() if v is not None}


def existing_folder(f: Files, d: Path) -> dict[str, Any]:
    (d / "merged").mkdir(parents=True)
    return export(f, d)


QA_DATA = datasets_dir() / "amd_finetune_qa.json"
ADAPTER_WORDS = "Can't find 'adapter_config.json'"
SHAPES = "size mismatch"
CASES = [
    # export: plain ones stay ready
    Case("export_plain", "export", export),
    Case("export_into_existing_folder", "export", existing_folder),
    Case("export_float16", "export", lambda f, d: export(f, d, infer_dtype="float16")),
    Case("export_like_the_presets", "export", lambda f, d: export(f, d, finetuning_type="lora", export_device="cpu")),
    # export: LLaMA-Factory refuses
    Case(
        "export_adapter_missing",
        "export",
        lambda f, d: export(f, d, adapter_name_or_path=str(d / "saves" / "lora")),
        **fails(ADAPTER_WORDS, "ADAPTER_NOT_LOADABLE"),
    ),
    Case(
        "export_adapter_other_base",
        "export",
        lambda f, d: export(f, d, adapter_name_or_path=str(f.other_adapter)),
        **fails(SHAPES, "ADAPTER_NOT_LOADABLE"),
    ),
    Case(
        "export_model_as_adapter",
        "export",
        lambda f, d: export(f, d, adapter_name_or_path=str(f.model)),
        **fails(ADAPTER_WORDS, "ADAPTER_NOT_LOADABLE", check_words="is a model folder, not an adapter"),
    ),
    Case(
        "export_adapter_as_model",
        "export",
        lambda f, d: export(f, d, model_name_or_path=str(f.adapter), adapter_name_or_path=None),
        **fails("Failed to load tokenizer", "AFTER_TOKENIZER_REFUSED"),
    ),
    Case(
        "export_dir_is_a_file",
        "export",
        lambda f, d: export(f, d, export_dir=str(f.a_file)),
        **fails("Not a directory", "EXPORT_DIR_NOT_A_FOLDER", check_words="is a file"),
    ),
    Case(
        "export_infer_dtype_fp16",
        "export",
        lambda f, d: export(f, d, infer_dtype="fp16"),
        **fails("has no attribute 'fp16'", "AFTER_MODEL_REFUSED"),
    ),
    Case(
        "export_gptq_without_optimum",
        "export",
        lambda f, d: export(
            f, d, adapter_name_or_path=None, export_quantization_bit=4, export_quantization_dataset=str(QA_DATA)
        ),
        **fails("optimum", "AFTER_MODEL_REFUSED"),
    ),
    Case(
        "export_without_export_dir",
        "export",
        lambda f, d: export(f, d, export_dir=None),
        **fails("Please specify `export_dir`", "LLAMAFACTORY_REFUSED"),
    ),
    Case(
        "export_quantize_with_adapter",
        "export",
        lambda f, d: export(f, d, export_quantization_bit=4, export_quantization_dataset=str(QA_DATA)),
        **fails("Please merge adapters before quantizing", "LLAMAFACTORY_REFUSED"),
    ),
    # chat: plain ones stay ready
    Case("chat_plain", "chat", chat),
    Case("chat_temperature_0", "chat", lambda f, d: chat(f, d, temperature=0)),
    Case("chat_greedy", "chat", lambda f, d: chat(f, d, do_sample=False)),
    Case(
        "chat_like_the_presets", "chat", lambda f, d: chat(f, d, adapter_name_or_path=None, infer_backend="huggingface")
    ),
    Case("chat_bfloat16", "chat", lambda f, d: chat(f, d, infer_dtype="bfloat16")),
    Case("chat_max_length_long_enough", "chat", lambda f, d: chat(f, d, max_new_tokens=0, max_length=64)),
    # chat: LLaMA-Factory (or transformers) refuses
    Case(
        "chat_adapter_missing",
        "chat",
        lambda f, d: chat(f, d, adapter_name_or_path=str(d / "saves" / "lora")),
        **fails(ADAPTER_WORDS, "ADAPTER_NOT_LOADABLE"),
    ),
    Case(
        "chat_adapter_other_base",
        "chat",
        lambda f, d: chat(f, d, adapter_name_or_path=str(f.other_adapter)),
        **fails(SHAPES, "ADAPTER_NOT_LOADABLE"),
    ),
    Case(
        "chat_model_as_adapter",
        "chat",
        lambda f, d: chat(f, d, adapter_name_or_path=str(f.model)),
        **fails(ADAPTER_WORDS, "ADAPTER_NOT_LOADABLE"),
    ),
    Case(
        "chat_adapter_as_model",
        "chat",
        lambda f, d: chat(f, d, model_name_or_path=str(f.adapter), adapter_name_or_path=None),
        **fails("Failed to load tokenizer", "AFTER_TOKENIZER_REFUSED"),
    ),
    Case(
        "chat_stage_rm",
        "chat",
        lambda f, d: chat(f, d, stage="rm"),
        **fails("The current model does not support `chat`", "CHAT_ENGINE_REFUSED"),
    ),
    Case(
        "chat_infer_backend_hf",
        "chat",
        lambda f, d: chat(f, d, infer_backend="hf"),
        **fails("Unknown backend: hf", "CHAT_ENGINE_REFUSED"),
    ),
    Case(
        "chat_infer_dtype_bf16",
        "chat",
        lambda f, d: chat(f, d, infer_dtype="bf16"),
        **fails("has no attribute 'bf16'", "AFTER_MODEL_REFUSED"),
    ),
    Case(
        "chat_repetition_penalty_0",
        "chat",
        lambda f, d: chat(f, d, repetition_penalty=0),
        **fails("`penalty` has to be a strictly positive float", "GENERATION_REFUSED"),
    ),
    Case(
        "chat_top_k_negative",
        "chat",
        lambda f, d: chat(f, d, top_k=-1),
        **fails("`top_k` has to be a strictly positive integer", "GENERATION_REFUSED"),
    ),
    Case(
        "chat_max_length_below_prompt",
        "chat",
        lambda f, d: chat(f, d, max_new_tokens=0, max_length=4),
        **fails("but `max_length` is set to 4", "GENERATION_REFUSED"),
    ),
]


@pytest.fixture(scope="module")
def files(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Files:
    from llamafactory_rocm.demo.tiny import build_tiny_model, texts_from_dataset

    work = tmp_path_factory.mktemp("after-corpus")
    other = build_tiny_model(
        work / "wide-llama", texts_from_dataset(datasets_dir() / "amd_finetune_qa.json"), hidden_size=96
    )
    a_file = work / "a-file"
    a_file.write_text("not a folder\n")
    return Files(
        model=tiny_model,
        adapter=peft_adapter(tiny_model, work / "lora"),
        other_model=other,
        other_adapter=peft_adapter(other, work / "lora-wide"),
        a_file=a_file,
        work=work,
    )


@pytest.fixture(scope="module")
def configs(files: Files) -> dict[str, dict[str, Any]]:
    out = {}
    for case in CASES:
        folder = files.work / case.id
        folder.mkdir()
        out[case.id] = case.build(files, folder)
    return out


@pytest.fixture(scope="module")
def checked(configs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """check's verdicts, before any stock run writes anything."""
    from llamafactory_rocm.machine.probe import take_snapshot

    snapshot = take_snapshot()
    by_id = {case.id: case for case in CASES}
    return {cid: check_config(config, snapshot=snapshot, command=by_id[cid].command) for cid, config in configs.items()}


@pytest.fixture(scope="module")
def stock(files: Files, configs: dict[str, dict[str, Any]], checked: dict[str, Any]) -> dict[str, dict[str, Any]]:
    cases = [{"id": c.id, "command": c.command, "config": configs[c.id], "message": MESSAGE} for c in CASES]
    results, log = run_after_alone(cases, files.work, hook_off_env(files.work))
    assert len(results) == len(CASES), log[-4000:]
    return results


def _error_codes(report: Any) -> set[str]:
    errors = [f for f in report.findings if f.level is Level.ERROR]
    return {f.code for f in errors} | {str(f.old) for f in errors if f.code == "LLAMAFACTORY_REFUSED"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_check_and_llamafactory_alone_agree(case: Case, stock, checked):
    ran = stock[case.id]
    report = checked[case.id]
    errors = " ".join(f.message for f in report.findings if f.level is Level.ERROR)
    # the record: what LLaMA-Factory alone does with this config
    if case.expect == "runs":
        assert ran["exit"] == 0, ran["error"]
        assert report.ok, errors
        return
    assert ran["exit"] != 0 and case.words in ran["error"], ran
    # check refuses it, for the same reason
    assert not report.ok, f"check says ready; LLaMA-Factory alone: {ran['error'][:300]}"
    assert _error_codes(report) & case.codes, (_error_codes(report), errors)
    assert (case.check_words or case.words) in errors, errors


# -- api and webchat without their packages ------------------------------------------------------------

HIDDEN = {"api": ("fastapi", "sse_starlette", "uvicorn"), "webchat": ("gradio",)}
NAME_ERRORS = {"api": "NameError: name 'FastAPI' is not defined", "webchat": "NameError: name 'gr' is not defined"}


def _hidden_env(work: Path, env: dict[str, str], command: str) -> dict[str, str]:
    site = work / "hide"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(HIDE_SITECUSTOMIZE)
    path = [str(site), *filter(None, [env.get("PYTHONPATH")])]
    return {**env, "PYTHONPATH": ":".join(path), "HIDE_PACKAGES": ",".join(HIDDEN[command])}


def _cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", ["api", "webchat"])
def test_api_and_webchat_without_their_packages(command: str, files: Files, tmp_path: Path):
    config = chat(files, tmp_path)
    (tmp_path / "chat.yaml").write_text(yaml.safe_dump(config))
    cli = str(Path(sys.executable).parent / "llamafactory-cli")
    # LLaMA-Factory alone: it loads the model, then stops where it first uses the missing package
    alone = _cli([cli, command, "chat.yaml"], tmp_path, _hidden_env(tmp_path, hook_off_env(tmp_path), command))
    assert NAME_ERRORS[command] in alone.stderr, alone.stderr[-3000:]
    # check refuses it, naming each package and the install line
    env = _hidden_env(tmp_path, offline_env(tmp_path), command)
    checked = _cli([sys.executable, "-m", "llamafactory_rocm.cli.main", "check", "chat.yaml", "--for", command],
                   tmp_path, env)  # fmt: skip
    assert checked.returncode == 1, checked.stdout[-3000:] + checked.stderr[-2000:]
    install = 'pip install -e ".[webui]"'
    line = next(line for line in checked.stdout.splitlines() if "[error]" in line and install in line)
    for package in HIDDEN[command]:
        assert package.replace("_", "-") in line
    # and the hook stops the stock command before it loads anything
    hooked = _cli([cli, command, "chat.yaml"], tmp_path, env)
    assert hooked.returncode == 1 and install in hooked.stderr, hooked.stderr[-3000:]
    assert NAME_ERRORS[command] not in hooked.stderr


@pytest.mark.parametrize("command", ["api", "webchat"])
def test_the_package_verdict_is_llamafactorys_availability_functions(command: str, files: Files, tmp_path: Path):
    """On this machine as it is: refused exactly when one of LLaMA-Factory's own functions answers False."""
    from llamafactory_rocm.lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        if command == "api":
            from llamafactory.api import app

            answers = [app.is_fastapi_available(), app.is_starlette_available(), app.is_uvicorn_available()]
        else:
            from llamafactory.webui import interface

            answers = [interface.is_gradio_available()]
    report = check_config(chat(files, tmp_path), command=command)
    missing = "COMMAND_PACKAGES_MISSING" in _error_codes(report)
    assert missing == (not all(answers))
    assert report.ok == all(answers), [f.line() for f in report.findings if f.level is Level.ERROR]


def test_the_install_line_installs_what_llamafactory_asks_for():
    """``pip install -e ".[webui]"`` (pyproject's extra) holds each package LLaMA-Factory's api and webui
    modules ask ``_is_package_available`` for (recorded while their own availability functions run)."""
    import tomllib
    from packaging.requirements import Requirement

    from llamafactory_rocm.lf.dry_load import EXTRA, command_packages

    root = Path(__file__).resolve().parents[1]
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"][EXTRA]
    names = {Requirement(r).name.lower().replace("_", "-") for r in extra}
    asked = {p.distribution for command in ("api", "webchat") for p in command_packages(command)}
    assert asked == {"fastapi", "sse-starlette", "uvicorn", "gradio"}  # LLaMA-Factory 0.9.5 and main
    assert asked <= names


def test_save_pretrained_still_writes_nothing_into_a_file():
    """The line the export_dir check follows (transformers' PreTrainedModel.save_pretrained)."""
    import inspect

    from transformers import PreTrainedModel

    source = inspect.getsource(PreTrainedModel.save_pretrained)
    assert "if os.path.isfile(save_directory):" in source


@pytest.mark.parametrize("case", [c for c in CASES if c.expect == "fails"], ids=lambda c: c.id)
def test_each_refusal_has_a_fix_that_works(case: Case, configs, checked):
    """Issue 37: the first error's fix is more than "read the library's message", deletes nothing, and where it
    is a key change (its remedy), that change applied to the case's config passes that point: check for the same
    command no longer says that refusal."""
    from tests.test_corpus_fixes import DESTROYS, VAGUE
    from tests.test_refusal_fixes import applied

    errors = [f for f in checked[case.id].findings if f.level is Level.ERROR]
    first = errors[0]
    assert not VAGUE.search(first.fix), f"{first.code}'s fix is no fix: {first.fix}"
    assert not DESTROYS.search(first.fix), f"{first.code}'s fix destroys data: {first.fix}"
    if not first.remedy:
        return
    fixed = applied(configs[case.id], first.remedy, configs[case.id])
    again = check_config(fixed, command=case.command)
    assert (first.code, first.message) not in {(f.code, f.message) for f in again.findings if f.level is Level.ERROR}
