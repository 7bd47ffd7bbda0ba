"""The hook after training: stock ``llamafactory-cli export`` and LLaMA-Factory's ``ChatModel``, checked.

Subprocesses run stock LLaMA-Factory with the hook armed by the .pth file, as users run it; the model is
the tiny local one (tests/conftest.py), the adapter a real PEFT adapter or the demo's trained one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from llamafactory_rocm.check.record import latest_record
from tests.after_training_helpers import peft_adapter, peft_adapter_config
from tests.conftest import offline_env, tiny_train_config

LLAMAFACTORY_CLI = str(Path(sys.executable).parent / "llamafactory-cli")


@pytest.fixture(scope="module")
def adapter(tiny_model, tmp_path_factory):
    return peft_adapter(tiny_model, tmp_path_factory.mktemp("adapter") / "lora")


def write(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def lf_cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([LLAMAFACTORY_CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def python(code: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def merge_config(model: Path, adapter: Path, out: Path, **extra: object) -> dict:
    return {
        "model_name_or_path": str(model),
        "adapter_name_or_path": str(adapter),
        "template": "llama3",
        "export_dir": str(out),
        **extra,
    }


@pytest.mark.trainer
def test_the_demos_adapter_trains_merges_through_stock_export_and_chats(tiny_model, tmp_path):
    """train -> export -> chat with stock llamafactory-cli and the hook on: the issue's "done means"."""
    env = offline_env(tmp_path)
    saves = tmp_path / "saves"
    train_cfg = write(tmp_path / "train.yaml", tiny_train_config(tiny_model, saves, max_steps=2, logging_steps=1))
    trained = lf_cli(["train", str(train_cfg)], tmp_path, env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert (saves / "adapter_model.safetensors").is_file()

    merged = tmp_path / "models" / "merged"
    export_cfg = write(tmp_path / "export.yaml", merge_config(tiny_model, saves, merged, export_device="cpu"))
    result = lf_cli(["export", str(export_cfg)], tmp_path, env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (merged / "config.json").is_file() and list(merged.glob("*.safetensors"))
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("llamafactory-rocm: merged model")]
    assert str(merged) in line and "on disk" in line and "dtype float32" in line  # infer_dtype auto on the CPU
    assert f"launch record {merged / 'rocm_launch.json'}" in line
    record = latest_record(merged)
    assert record["origin"] == "llamafactory-cli export (hook)" and record["ok"] is True
    assert record["resolved_config"]["adapter_name_or_path"] == str(saves)

    code = (
        "from llamafactory.chat import ChatModel\n"
        f"m = ChatModel({{'model_name_or_path': {str(merged)!r}, 'template': 'llama3'}})\n"
        "print('ENGINE', type(m.engine).__name__)\n"
    )
    chat = python(code, tmp_path, env)
    assert chat.returncode == 0, chat.stderr[-3000:]
    assert "ENGINE HuggingfaceEngine" in chat.stdout
    assert f"llamafactory-rocm: chat engine huggingface on cpu (float32), serving {merged}" in chat.stderr
    assert sorted(p.name for p in merged.glob("rocm_*")) == ["rocm_launch.json", "rocm_resolved.yaml"]  # chat: none


def test_a_quantized_merge_is_refused_by_stock_export_before_loading(tiny_model, adapter, tmp_path):
    merged = tmp_path / "merged"
    cfg = write(tmp_path / "export.yaml", merge_config(tiny_model, adapter, merged, quantization_bit=4))
    result = lf_cli(["export", str(cfg)], tmp_path, offline_env(tmp_path))
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    errors = [x for x in result.stderr.splitlines() if x.strip().startswith("[error]")]
    assert any("MERGE_INTO_QUANTIZED" in x and "quantization_bit" in x for x in errors), result.stderr[-3000:]
    assert "Loading weights" not in result.stderr and not merged.exists()


def test_the_off_switch_leaves_stock_export_alone(tiny_model, adapter, tmp_path):
    merged = tmp_path / "merged"
    cfg = write(tmp_path / "export.yaml", merge_config(tiny_model, adapter, merged))
    result = lf_cli(["export", str(cfg)], tmp_path, offline_env(tmp_path, LLAMAFACTORY_ROCM="0"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (merged / "config.json").is_file() and not list(merged.glob("rocm_*"))
    assert "llamafactory-rocm" not in result.stdout + result.stderr


def test_chat_model_through_the_hook_names_its_engine(tiny_model, adapter, tmp_path):
    config = {"model_name_or_path": str(tiny_model), "adapter_name_or_path": str(adapter), "template": "llama3"}
    code = f"from llamafactory.chat import ChatModel\nChatModel({config!r})\nprint('BUILT')\n"
    result = python(code, tmp_path, offline_env(tmp_path))
    assert result.returncode == 0 and "BUILT" in result.stdout, result.stderr[-3000:]
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("llamafactory-rocm: chat engine")]
    assert f"huggingface on cpu (float32), serving {tiny_model} + adapter {adapter}; no launch record" in line
    assert not list(Path(tiny_model).glob("rocm_*")) and not list(Path(adapter).glob("rocm_*"))


def test_vllm_rank_is_refused_through_the_chat_hook_before_any_engine(tmp_path):
    lora = peft_adapter_config(tmp_path / "lora", "meta-llama/Meta-Llama-3-8B-Instruct", r=64)
    config = {
        "model_name_or_path": "meta-llama/Meta-Llama-3-8B-Instruct",
        "adapter_name_or_path": str(lora),
        "template": "llama3",
        "infer_backend": "vllm",
    }
    cfg = write(tmp_path / "serve.yaml", config)
    code = "import sys\nfrom llamafactory.chat.chat_model import run_chat\nrun_chat()\n"
    result = subprocess.run(
        [sys.executable, "-c", code, str(cfg)],
        cwd=tmp_path,
        env=offline_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    assert "llamafactory-rocm: checked for chat" in result.stderr
    (line,) = [x for x in result.stderr.splitlines() if "VLLM_LORA_RANK_TOO_SMALL" in x]
    assert "r=64" in line and "vllm_max_lora_rank: 64" in line


def test_a_refusal_in_a_web_ui_thread_raises_with_the_lines(monkeypatch):
    """LlamaBoard's chat tab builds the ChatModel in a worker thread: exiting there would not stop it."""
    from llamafactory_rocm.train import after

    monkeypatch.setattr(after, "check_for", lambda *a: after._stop(["[error] X: no."], 1))
    built = []

    class WebChatModel:
        def __init__(self, args=None):
            built.append(args)

    WebChatModel.__init__ = after.wrap_chat_model_init(WebChatModel.__init__)
    caught: list[BaseException] = []

    def worker():
        try:
            WebChatModel({"model_name_or_path": "m"})
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert isinstance(caught[0], after.CheckRefused) and str(caught[0]) == "[error] X: no." and built == []
    with pytest.raises(SystemExit) as stop:  # the main thread (llamafactory-cli chat/api/webchat): exit 1
        WebChatModel({"model_name_or_path": "m"})
    assert stop.value.code == 1


def test_the_hooked_export_model_keeps_llamafactorys_signature_and_is_marked():
    code = (
        "import inspect\n"
        "from llamafactory.train import tuner\n"
        "from llamafactory.chat import chat_model\n"
        "print(tuner.export_model.__llamafactory_rocm__, list(inspect.signature(tuner.export_model).parameters),\n"
        "      chat_model.ChatModel.__init__.__llamafactory_rocm__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True, timeout=300
    )
    assert result.stdout.strip() == "True ['args'] True", result.stderr[-2000:]


def test_export_line_reads_size_and_dtype(tmp_path):
    from llamafactory_rocm.train.after import export_line

    out = tmp_path / "merged"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    (out / "model.safetensors").write_bytes(b"0" * 3 * 2**20)
    (out / "rocm_launch.json").write_text("{}")  # ours: not the model's size
    line = export_line({"export_dir": str(out), "adapter_name_or_path": "a"}, out / "rocm_launch.json")
    assert line.startswith(f"llamafactory-rocm: merged model {out}: 3.00 MiB on disk (2 files), dtype bfloat16")
    assert export_line({"export_dir": str(tmp_path / "none")}, None).endswith("nothing was written in " + str(
        tmp_path / "none"))  # fmt: skip


def test_a_missing_adapter_is_refused_by_stock_export_before_any_weight_is_read(tiny_model, tmp_path):
    """Issue 29: the adapter folder not there (training not run yet, or a typo). LLaMA-Factory alone loads
    the model and then stops in peft (tests/test_after_dry_corpus.py); through the hook it stops before."""
    merged = tmp_path / "merged"
    cfg = write(tmp_path / "export.yaml", merge_config(tiny_model, tmp_path / "saves" / "lora", merged))
    result = lf_cli(["export", str(cfg)], tmp_path, offline_env(tmp_path))
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    errors = [x for x in result.stderr.splitlines() if x.strip().startswith("[error]")]
    assert any("Can't find 'adapter_config.json'" in x for x in errors), result.stderr[-3000:]
    assert "Loading weights" not in result.stderr and not merged.exists()


def test_generating_arguments_transformers_refuses_stop_the_chat_hook_before_the_first_message(
    tiny_model, adapter, tmp_path
):
    config = {"model_name_or_path": str(tiny_model), "adapter_name_or_path": str(adapter), "template": "llama3"}
    cfg = write(tmp_path / "chat.yaml", {**config, "repetition_penalty": 0})
    code = "from llamafactory.chat.chat_model import run_chat\nrun_chat()\n"
    result = subprocess.run([sys.executable, "-c", code, str(cfg)], cwd=tmp_path, env=offline_env(tmp_path),
                            input="", capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    errors = [x for x in result.stderr.splitlines() if x.strip().startswith("[error]")]
    assert any("`penalty` has to be a strictly positive float" in x for x in errors), result.stderr[-3000:]
    assert "User:" not in result.stdout  # the chat loop never started
