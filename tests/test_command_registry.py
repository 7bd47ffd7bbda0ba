"""One registry of LLaMA-Factory commands (lf/commands.py ``REGISTRY``): each command is one entry, and every
reference an entry holds loads on the installed LLaMA-Factory (run on both lines: tests/main_line.sh).

A new command is one entry: ``check --for`` offers it (``COMMANDS``), ``rules_for`` runs the chain it holds,
``command_verdict`` its parser, ``_startup`` wraps what its hooks name, and its record goes where it says.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
import types

import pytest
import yaml

from llamafactory_rocm import _startup
from llamafactory_rocm.cli.main import build_parser
from llamafactory_rocm.lf import commands
from llamafactory_rocm.lf.commands import CHAT, COMMANDS, REGISTRY, Chain, Ref, command_entry, hooked_modules
from llamafactory_rocm.rules import chain_rules
from tests.launcher_branches import cli_commands
from tests.registry_chains import plan_for, rules_for

NEEDS_GRADIO = importlib.util.find_spec("gradio") is None or importlib.util.find_spec("fastapi") is None


def test_every_command_of_the_installed_cli_is_an_entry_and_calls_what_it_says():
    """Read from the installed llamafactory/launcher.py, not guessed: each command's branch imports the
    function its entry names; eval's raises (0.9.5 and main), which its entry records as not run."""
    cli = {name: target for name, target in cli_commands().items() if target is not None}  # env/version/help print
    assert set(cli) == {entry.name for entry in REGISTRY}
    for entry in REGISTRY:
        if entry.cli is None:
            assert cli[entry.name].startswith("raise: NotImplementedError"), cli[entry.name]
            assert "NotImplementedError" in entry.not_run
            assert entry.dry is None and not entry.hooks and entry.record is None
        else:
            assert cli[entry.name] == str(entry.cli)


def test_every_parser_chain_and_builder_an_entry_holds_loads():
    for entry in REGISTRY:
        if entry.parser is None:  # reads no config: not offered by check --for
            assert entry.name not in COMMANDS and entry.rules is None and entry.parser_args is None
            continue
        assert isinstance(entry.parser, Ref) and callable(entry.parser.load()), entry.name
        fields = commands.command_keys(entry.name)
        assert entry.parser_args is not None
        assert fields and all(dataclasses.is_dataclass(cls) for cls in entry.parser_args.load())
        assert isinstance(entry.rules, Chain) and rules_for(entry.name) == chain_rules(entry.rules)
        assert rules_for(entry.name) and all(callable(r) for r in rules_for(entry.name))
        assert plan_for(entry.name) == (chain_rules(entry.plan) if entry.plan else ())
        assert entry.dry in {commands.DRY_LAUNCH, commands.DRY_LOAD, None}
        if entry.dry is not None:
            assert callable(entry.dry.load()), entry.dry
        if entry.judged_through:
            assert callable(entry.judged_through.load())
        if entry.record:
            assert entry.record in fields  # a key of the config the command reads
        if entry.guarded_imports:  # the module the dry load reads the guarded imports of is the command's own
            assert entry.cli is not None and entry.guarded_imports.module == entry.cli.module


@pytest.mark.skipif(NEEDS_GRADIO, reason="the web UI and API modules need the webui extra")
def test_every_hooked_function_and_its_wrapper_resolve():
    for entry in REGISTRY:
        for hook in entry.hooks:
            assert callable(hook.target.load()), hook.target
            assert callable(hook.wrapper.load()), hook.wrapper
        for caller in entry.callers:  # the functions up the stack that name the command
            module = entry.cli.load().__module__ if entry.cli else None
            assert module and hasattr(importlib.import_module(module), caller), (entry.name, caller)


def test_check_for_offers_exactly_the_commands_that_read_a_config():
    parser = build_parser()
    check = parser._subparsers._group_actions[0].choices["check"]
    (action,) = [a for a in check._actions if a.dest == "for_command"]
    assert tuple(action.choices) == COMMANDS == tuple(e.name for e in REGISTRY if e.parser)
    assert COMMANDS == ("train", "export", "chat", "api", "webchat", "eval")
    with pytest.raises(ValueError):
        command_entry("serve")


def test_a_function_shared_by_commands_is_hooked_once_and_train_needs_run_exp():
    hooked = hooked_modules()
    chat = hooked["llamafactory.chat.chat_model"]
    assert [(q, c) for q, _, c, _ in chat] == [("ChatModel.__init__", "chat")]
    assert [(q, c, r) for q, _, c, r in hooked["llamafactory.train.tuner"]] == [
        ("run_exp", "train", True),
        ("export_model", "export", False),
    ]
    assert [(q, c) for q, _, c, _ in hooked["llamafactory.webui.interface"]] == [
        ("run_web_ui", "webui"),
        ("run_web_demo", "webchat"),
    ]
    assert commands.caller_commands() == {
        "run_chat": "chat",
        "run_api": "api",
        "create_web_demo": "webchat",
        "run_web_demo": "webchat",
    }


def test_a_new_command_is_one_entry(monkeypatch, capsys):
    """One more entry, and nothing else: check --for's list, the rule chain, the parser, the hook and the
    record folder all follow."""
    entry = commands.Command(
        "score",
        cli=Ref("llamafactory.chat.chat_model", "run_chat"),
        parser=Ref("llamafactory.hparams.parser", "get_infer_args"),
        parser_args=Ref("llamafactory.hparams.parser", "_INFER_ARGS"),
        rules=CHAT,
        hooks=(
            commands.Hook(Ref("llamafactory.fake.scorer", "run_score"), Ref("tests.test_command_registry", "_wrap")),
        ),
        record="export_dir",
    )
    registry = (*REGISTRY, entry)
    monkeypatch.setattr(commands, "REGISTRY", registry)
    monkeypatch.setattr(commands, "_BY_NAME", {e.name: e for e in registry})
    monkeypatch.setattr(_startup, "_HOOKED", [])
    assert rules_for("score") == rules_for("chat")
    assert commands.command_keys("score") == commands.command_keys("chat")
    assert commands.record_folder({"export_dir": "out/score"}, "score") == "out/score"
    refused = commands.command_verdict({"model_name_or_path": "m", "output_dir": "x"}, "score", load=False)
    assert not refused.accepted and "output_dir" in refused.message  # get_infer_args refuses a training key
    module = types.ModuleType("llamafactory.fake.scorer")
    module.run_score = lambda: "scored"
    assert _startup._patch_for(module.__name__) is not None
    _startup._patch(module)
    assert module.run_score() == "score: scored" and capsys.readouterr().err == ""
    _startup._patch(module)  # once
    assert module.run_score() == "score: scored"


def _wrap(original, command):
    def wrapped():
        return f"{command}: {original()}"

    wrapped.__llamafactory_rocm__ = True
    return wrapped


def test_check_says_eval_is_not_built_dry(tmp_path):
    """eval's entry builds nothing dry (``llamafactory-cli eval`` raises): the report's first line says so."""
    config = {"model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct", "template": "qwen", "task": "mmlu_test"}
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [sys.executable, "-m", "llamafactory_rocm.cli.main", "check", "eval.yaml", "--gpu", "mi300x"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    first = result.stdout.splitlines()[0]
    assert first.startswith("checked for: eval (from its keys"), result.stdout[-2000:] + result.stderr[-2000:]
    assert first.endswith("parsed and ruled on, not built dry (" + command_entry("eval").not_run + ")")
