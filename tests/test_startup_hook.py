"""The .pth hook: installed with the package, cheap, switchable, and a clear torchaudio stand-in."""

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from llamafactory_rocm import _startup


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )


def test_the_pth_file_is_installed_and_arms_the_finder():
    pth = Path(sysconfig.get_paths()["purelib"]) / "llamafactory_rocm.pth"
    assert pth.is_file(), "reinstall: pip install -e ."
    result = run_python("import sys; print([type(f).__name__ for f in sys.meta_path][0])")
    assert result.stdout.strip() == "LlamafactoryRocmFinder"


def test_the_switch_turns_the_check_off_and_keeps_text_training_importable():
    code = (
        "import sys\n"
        "sys.modules['torchaudio'] = None\n"  # no torchaudio, as in the README's install
        "from llamafactory.train import tuner\n"
        "print('WRAPPED', getattr(tuner.run_exp, '__llamafactory_rocm__', False))\n"
    )
    off = run_python(code, LLAMAFACTORY_ROCM="0")
    assert "WRAPPED False" in off.stdout, off.stderr[-2000:]
    on = run_python(code)
    assert "WRAPPED True" in on.stdout, on.stderr[-2000:]


def test_python_start_up_imports_nothing_heavy():
    heavy = "{'torch', 'pydantic', 'yaml', 'llamafactory', 'transformers', 'llamafactory_rocm', 'typing'}"
    result = run_python(f"import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy}))")
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("value", ["0", "false", "off", "NO"])
def test_enabled_reads_the_switch(value):
    assert not _startup.enabled({"LLAMAFACTORY_ROCM": value})
    assert _startup.enabled({})


def test_missing_torchaudio_fails_only_when_audio_is_used():
    code = (
        "import sys\n"
        "sys.modules['torchaudio'] = None\n"  # makes `import torchaudio` fail, as when it is absent
        "import llamafactory.data.mm_plugin as mm\n"
        "assert sys.modules.get('torchaudio') is None, 'stand-in leaked'\n"
        "try:\n"
        "    mm.torchaudio.load('speech.wav')\n"
        "except ImportError as exc:\n"
        "    print('AUDIO-ERROR', exc)\n"
    )
    result = run_python(code)
    assert "AUDIO-ERROR" in result.stdout, result.stderr[-2000:]
    assert "Text-only training does not need it" in result.stdout


def test_run_exp_is_wrapped_once_and_keeps_its_signature():
    code = (
        "import inspect\n"
        "from llamafactory.train import tuner\n"
        "marked = getattr(tuner.run_exp, '__llamafactory_rocm__', False)\n"
        "print(marked, list(inspect.signature(tuner.run_exp).parameters))\n"
    )
    assert run_python(code).stdout.strip() == "True ['args', 'callbacks']"


def test_an_unexpected_run_exp_makes_the_hook_step_aside_with_one_line(capsys):
    import types

    changed = types.ModuleType("llamafactory.train.tuner")
    changed.run_exp = lambda config: config  # a future LLaMA-Factory with another signature
    original = changed.run_exp
    _startup._patch(changed)
    assert changed.run_exp is original
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pre-launch check is off for this run" in err[0]


def test_a_failing_check_stops_the_rank_in_one_line_and_never_trains_another_config(monkeypatch, capsys):
    """Every rank takes the same decision when the check itself fails: it stops (exit 4) and names the
    off switch; none trains the unchecked config while another trains the resolved one."""
    from llamafactory_rocm.errors import EXIT_INTERNAL
    from llamafactory_rocm.train import hook

    seen = []

    def run_exp(args=None, callbacks=None):
        seen.append((args, callbacks))

    monkeypatch.delenv("LLAMAFACTORY_ROCM_DEBUG", raising=False)
    monkeypatch.setattr(hook, "prepare", lambda args: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(SystemExit) as stop:
        hook.wrap_run_exp(run_exp)({"stage": "sft"}, None)
    assert stop.value.code == EXIT_INTERNAL and seen == []
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "pre-launch check failed (RuntimeError: boom)" in line and "LLAMAFACTORY_ROCM=0" in line


def test_an_untested_llamafactory_release_is_named_in_one_line(monkeypatch, capsys):
    from llamafactory_rocm.lf import keys as lf_keys
    from llamafactory_rocm.train import hook

    monkeypatch.setattr(lf_keys, "installed_llamafactory_version", lambda: "0.9.9")
    hook.wrap_run_exp(lambda args=None, callbacks=None: None)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "0.9.9 is outside the tested range (0.9.5, 0.9.6.dev0)" in line


def test_the_tested_release_is_the_installed_one():
    from llamafactory_rocm.lf.keys import installed_llamafactory_version, live_train_keys, shipped_train_keys
    from llamafactory_rocm.lf.schema import load_schema
    from llamafactory_rocm.train.hook import TESTED_LLAMAFACTORY

    installed = installed_llamafactory_version()
    assert installed in TESTED_LLAMAFACTORY
    assert load_schema().source == f"llamafactory {installed}"  # keys and types from the live parser
    assert load_schema().keys == live_train_keys()
    version, keys = shipped_train_keys()
    if installed == version:  # the fallback list is the real one of the release it names
        assert keys == live_train_keys()


def test_the_switch_turns_off_the_export_and_chat_hooks_too():
    code = (
        "from llamafactory.train import tuner\n"
        "from llamafactory.chat.chat_model import ChatModel\n"
        "print('WRAPPED', getattr(tuner.export_model, '__llamafactory_rocm__', False),\n"
        "      getattr(ChatModel.__init__, '__llamafactory_rocm__', False))\n"
    )
    assert "WRAPPED False False" in run_python(code, LLAMAFACTORY_ROCM="0").stdout
    assert "WRAPPED True True" in run_python(code).stdout


def test_a_module_without_export_model_keeps_only_the_run_exp_hook(capsys):
    import types

    module = types.ModuleType("llamafactory.train.tuner")
    module.run_exp = lambda args=None, callbacks=None: None
    _startup._patch(module)
    assert getattr(module.run_exp, "__llamafactory_rocm__", False) and not hasattr(module, "export_model")
    _startup._patch(types.ModuleType("llamafactory.chat.chat_model"))  # no ChatModel: steps aside


def test_the_server_and_v1_entries_are_wrapped_once_and_keep_their_signatures():
    """webui/webchat/api get the exposure line, v1's launch the not-checked line; LLaMA-Factory's signatures stay."""
    code = (
        "import inspect\n"
        "from llamafactory.webui import interface\n"
        "from llamafactory.api import app\n"
        "from llamafactory.v1 import launcher\n"
        "for f in (interface.run_web_ui, interface.run_web_demo, app.run_api, launcher.launch):\n"
        "    print(getattr(f, '__llamafactory_rocm__', False), list(inspect.signature(f).parameters))\n"
        "from llamafactory_rocm import _startup\n"
        "before = interface.run_web_ui\n"
        "_startup._patch(interface)\n"
        "print('SAME', interface.run_web_ui is before)\n"
    )
    result = run_python(code)
    assert result.stdout.split("\n")[:5] == ["True []"] * 4 + ["SAME True"], result.stderr[-2000:]


def test_a_server_module_without_the_entries_is_left_as_it_is(capsys):
    import types

    module = types.ModuleType("llamafactory.webui.interface")
    _startup._patch(module)
    _startup._patch_v1_launcher(module)
    assert vars(module).keys() == types.ModuleType("x").__dict__.keys() and capsys.readouterr().err == ""
