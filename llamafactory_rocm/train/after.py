"""After training: ``export_model`` and ``ChatModel.__init__`` wrapped, checked like ``run_exp``.

``llamafactory-cli export`` runs ``export_model`` (llamafactory/train/tuner.py); ``chat``, ``api`` and
``webchat`` (and LlamaBoard's chat tab) construct ``ChatModel`` (llamafactory/chat/chat_model.py), whose
``__init__`` parses the config and builds the engine (docs/after-training.md#t8). ``_startup`` wraps both
when LLaMA-Factory imports those modules, as their entries in lf/commands.py's ``REGISTRY`` say (``hooks``,
``record``, ``callers``); ``LLAMAFACTORY_ROCM=0`` leaves them stock.

Each wrapper reads the config as LLaMA-Factory does (``read_args``: the YAML in argv, flags or a dict),
runs the same check as ``check --for <command>`` (``run_check`` with ``command``: the command's parser, then
the command built dry with the model on the meta device and the packages it imports, lf/dry_load.py), so a
missing adapter folder or a missing fastapi stops it before any weight is read, and then:

- a refusal prints the report (one line a finding) and stops with exit 1, as the training hook does; in a
  thread that is not the main one (LlamaBoard's web UI), it raises instead, so the UI shows the lines;
- export: the launch record goes in ``export_dir`` (the folder the user named as output), then the merge
  runs on the checked config, then one closing line: the merged model's folder, its size on disk, its dtype;
- chat: no record, because a chat writes no output folder and the model and adapter folders are inputs,
  not ours to write into; the closing line names the engine and its device.

A failure of the check itself stops in one line that names the off switch (exit 4), as for training.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..console import say
from ..errors import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_USAGE, CheckRefused, UsageError
from ..lf.commands import caller_commands, record_folder

# Our own files in an export folder: not part of the merged model's size.
_RECORD_PREFIX = "rocm_"


def _stop(lines: list[str], code: int) -> None:
    if threading.current_thread() is threading.main_thread():
        raise SystemExit(code)
    raise CheckRefused("\n".join(lines))


def _guarded(command: str, what: Callable[[], Any]) -> Any:
    """``what()``, with the training hook's answers to a usage error and to a failing check."""
    try:
        return what()
    except (SystemExit, CheckRefused):
        raise
    except UsageError as err:
        say(str(err))
        _stop([str(err)], EXIT_USAGE)
    except Exception as exc:
        if os.environ.get("LLAMAFACTORY_ROCM_DEBUG"):
            raise
        line = (
            f"the pre-launch check failed ({type(exc).__name__}: {exc}), so nothing was run for {command}. Set "
            "LLAMAFACTORY_ROCM=0 to run without the check, or LLAMAFACTORY_ROCM_DEBUG=1 for the traceback, and "
            "please report it."
        )
        say(line)
        _stop([line], EXIT_INTERNAL)
    return None  # unreachable: _stop raises


def caller_command(default: str = "chat") -> str:
    """chat, api or webchat: the LLaMA-Factory entry point up the stack that builds the ChatModel (the
    ``callers`` of each command's entry in lf/commands.py)."""
    callers = caller_commands()
    frame = sys._getframe(1)
    while frame is not None:
        found = callers.get(frame.f_code.co_name)
        if found and "llamafactory" in frame.f_code.co_filename:
            return found
        frame = frame.f_back  # type: ignore[assignment]
    return default


def check_for(args: dict[str, Any] | list[str] | None, command: str, entry: str) -> Any:
    """The check of ``args`` for ``command``; prints and stops on a refusal; None for ``--help``."""
    from ..check.render import report_text
    from ..check.request import from_run_exp
    from ..check.run import run_check
    from ..machine.probe import take_snapshot
    from .board import log_lines

    request = from_run_exp(args)
    if request is None:
        return None
    origin = f"llamafactory-cli {command} (hook)" if args is None else f"{entry} (hook)"
    report = run_check(replace(request, command=command, origin=origin, snapshot=take_snapshot()))
    os.environ.update(report.resolution.env_changes)
    text = report_text(report)
    if report.findings or not report.ok:
        print(f"llamafactory-rocm: checked for {command}\n{text}", file=sys.stderr, flush=True)
        log_lines(["llamafactory-rocm: pre-launch check", *text.splitlines()])  # LlamaBoard's log, when it runs
    if not report.ok:
        _stop([f.line() for f in report.findings], EXIT_FINDINGS)
    return report


# ---------------------------------------------------------------------------------------------- export


def write_export_record(report: Any, command: str = "export") -> Path | None:
    """The launch record in the folder the entry names (export: ``export_dir``); one that cannot be written is
    a warning (the merge goes on)."""
    from ..check.record import write_launch_files

    folder = Path(record_folder(report.config, command) or ".")
    try:
        _, record = write_launch_files(report, folder, report.origin)
    except OSError as exc:
        say(f"warning: the launch record could not be written in {folder} ({exc}); the export goes on unchanged.")
        return None
    return record


def folder_size(folder: Path) -> tuple[int, int]:
    """(bytes, files) of what is in ``folder``, our own record files aside."""
    total = files = 0
    for path in folder.rglob("*"):
        if path.is_file() and not path.name.startswith(_RECORD_PREFIX):
            total += path.stat().st_size
            files += 1
    return total, files


def saved_dtype(folder: Path) -> str | None:
    """The dtype the merged model was saved in: its config.json's ``torch_dtype`` (``dtype`` in transformers 5)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = config.get("torch_dtype") or config.get("dtype") if isinstance(config, dict) else None
    return None if value is None else str(value)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


def export_line(config: dict[str, Any], record: Path | None) -> str:
    folder = Path(str(config["export_dir"]))
    what = "merged model" if config.get("adapter_name_or_path") else "exported model"
    if not folder.is_dir():
        return f"llamafactory-rocm: {what}: nothing was written in {folder}"
    size, files = folder_size(folder)
    dtype = saved_dtype(folder) or "not recorded in its config.json"
    where = f"; launch record {record}" if record else ""
    return f"llamafactory-rocm: {what} {folder}: {_size(size)} on disk ({files} files), dtype {dtype}{where}"


def wrap_export_model(original: Callable[..., Any], command: str = "export") -> Callable[..., Any]:
    """``export_model`` checked for ``command``, recorded and summed up.

    The check itself runs LLaMA-Factory's unwrapped ``export_model`` (``lf.commands.command_verdict`` up to
    its first load; ``lf.dry_load`` up to ``save_pretrained``, with the module's ``load_tokenizer`` and
    ``load_model`` replaced while it runs): should this wrapper be called then, it is LLaMA-Factory's
    function and nothing else, so a check never checks again, writes a record or merges anything.
    """
    module_globals = getattr(original, "__globals__", {})
    loader = module_globals.get("load_tokenizer")

    @functools.wraps(original)
    def export_model(args: dict[str, Any] | None = None) -> Any:
        if module_globals.get("load_tokenizer") is not loader:  # inside a check: LLaMA-Factory's own, stopped
            return original(args)
        report = _guarded(command, lambda: check_for(args, command, "export_model"))
        if report is None:
            return original(args)
        record = write_export_record(report, command)
        result = original(report.config)
        from .board import log_lines

        line = export_line(report.config, record)
        print(line, flush=True)
        log_lines([line])
        return result

    export_model.__llamafactory_rocm__ = True  # type: ignore[attr-defined]
    return export_model


# ------------------------------------------------------------------------------------------------ chat


def engine_line(chat_model: Any, command: str, config: dict[str, Any]) -> str:
    """The engine LLaMA-Factory built and where its model sits."""
    engine = getattr(chat_model, "engine", None)
    name = getattr(engine, "name", None)  # each engine's own EngineName (chat/hf_engine.py: self.name)
    backend = str(getattr(name, "value", name) or config.get("infer_backend", "huggingface"))
    model = getattr(engine, "model", None)
    device = getattr(model, "device", None)
    dtype = getattr(model, "dtype", None)
    if device is not None:
        place = f"on {device}" + (f" ({str(dtype).removeprefix('torch.')})" if dtype is not None else "")
    else:
        place = f"({type(engine).__name__}: the engine places the model itself)"
    adapter = config.get("adapter_name_or_path")
    served = f"{config.get('model_name_or_path')}" + (f" + adapter {adapter}" if adapter else "")
    return (
        f"llamafactory-rocm: {command} engine {backend} {place}, serving {served}; no launch record "
        f"({command} names no output folder, and the model's folder is not ours to write into)"
    )


def wrap_chat_model_init(original: Callable[..., None], default: str = "chat") -> Callable[..., None]:
    """``ChatModel.__init__`` checked, for the command up the stack (``caller_command``; ``default`` when none
    says: a ChatModel built by a script)."""

    @functools.wraps(original)
    def __init__(self: Any, args: dict[str, Any] | None = None) -> None:
        command = "webchat" if type(self).__name__ == "WebChatModel" else caller_command(default)
        report = _guarded(command, lambda: check_for(args, command, f"{type(self).__name__}(args)"))
        if report is None:
            original(self, args)
            return
        original(self, report.config)
        from .board import log_lines

        line = engine_line(self, command, report.config)
        print(line, file=sys.stderr, flush=True)  # stdout is the conversation (chat) or the API's log
        log_lines([line])

    __init__.__llamafactory_rocm__ = True  # type: ignore[attr-defined]
    return __init__


__all__ = ["CheckRefused", "caller_command", "engine_line", "export_line", "wrap_chat_model_init", "wrap_export_model"]
