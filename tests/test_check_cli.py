"""``llamafactory-rocm check`` on good and bad input: one line, the documented exit code, nothing written."""

import argparse
import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.conftest import SNAPSHOTS


def check_process(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """``llamafactory-rocm check ARGS`` in its own process, as a user runs it."""
    full_env = {**os.environ, **env}
    full_env.pop("PYTORCH_ROCM_ARCH", None) if "PYTORCH_ROCM_ARCH" not in env else None
    return subprocess.run(
        [sys.executable, "-m", "llamafactory_rocm.cli.main", "check", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def check(capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """The same command through the CLI's ``main`` in this process (what the console script calls): its exit
    code and everything written to file descriptors 1 and 2, a library's log lines included. A process each
    paid ~7 s of imports (LLaMA-Factory's parser reads the file); test_missing_file, test_malformed_yaml and
    the signal tests still run one, where the process's own exit status and stderr are the oracle."""
    from llamafactory_rocm.cli.main import main

    def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
        with monkeypatch.context() as patched:
            patched.chdir(cwd)
            # pytest's log capture off: a library's stray log line reaches stderr, as in a process of its own
            patched.setattr(logging.getLogger(), "handlers", [])
            if "PYTORCH_ROCM_ARCH" not in env:
                patched.delenv("PYTORCH_ROCM_ARCH", raising=False)
            for key, value in env.items():
                patched.setenv(key, value)
            capfd.readouterr()
            with warnings.catch_warnings():  # and a warning is printed, as Python's default filter prints it
                warnings.simplefilter("default")
                patched.setattr(warnings, "_showwarnmsg_impl", lambda m: sys.stderr.write(warnings._formatwarnmsg(m)))
                try:
                    code = main(["check", *args])
                except SystemExit as stop:  # argparse's own usage errors
                    code = stop.code if isinstance(stop.code, int) else 1
            out, err = capfd.readouterr()
        return subprocess.CompletedProcess(["check", *args], code, out, err)

    return run


def files_in(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "good.yaml").write_text(GOOD_YAML)
    return tmp_path


GOOD_YAML = """\
stage: sft
do_train: true
model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct
dataset: amd_finetune_qa
dataset_dir: datasets
template: llama3
finetuning_type: lora
fp16: true
output_dir: out
"""
GOOD_FLAGS = [
    "--stage", "sft", "--do_train", "--model_name_or_path", "meta-llama/Meta-Llama-3-8B-Instruct",
    "--dataset", "amd_finetune_qa", "--dataset_dir", "datasets", "--template", "llama3",
    "--finetuning_type", "lora", "--fp16", "--output_dir", "out",
]  # fmt: skip


def assert_one_line_usage_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_missing_file(workdir):
    before = files_in(workdir)
    assert_one_line_usage_error(check_process(["nope.yaml"], workdir), "nope.yaml", "no such file")
    assert files_in(workdir) == before


def test_malformed_yaml(workdir):
    (workdir / "bad.yaml").write_text("stage: sft\n  fp16: [true\n")
    before = files_in(workdir)
    assert_one_line_usage_error(check_process(["bad.yaml"], workdir), "cannot parse", "bad.yaml")
    assert files_in(workdir) == before


def test_yaml_that_is_not_a_mapping(workdir, check):
    (workdir / "list.yaml").write_text("- fp16\n- bf16\n")
    assert_one_line_usage_error(check(["list.yaml"], workdir), "must be a mapping")


def test_unknown_gpu_name_lists_the_nearest(workdir, check):
    assert_one_line_usage_error(check(["good.yaml", "--gpu", "mi300"], workdir), "mi300x")


def test_bad_override_syntax(workdir, check):
    assert_one_line_usage_error(check(["good.yaml", "fp16"], workdir), "key=value")


def test_unknown_key_is_an_error_finding_with_exit_1(workdir, check):
    (workdir / "typo.yaml").write_text("stage: sft\nlearning_rat: 1.0e-4\n")
    before = files_in(workdir)
    result = check(["typo.yaml", "--json"], workdir)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False
    (error,) = [f for f in report["findings"] if f["level"] == "error"]
    assert error["code"] == "UNKNOWN_KEY" and "learning_rate" in error["fix"]
    assert files_in(workdir) == before


def test_malformed_pytorch_rocm_arch_exit_1(workdir, check):
    result = check(["good.yaml", "--gpu", "mi300x", "--json"], workdir, PYTORCH_ROCM_ARCH="gfx94")
    assert result.returncode == 1
    codes = [f["code"] for f in json.loads(result.stdout)["findings"] if f["level"] == "error"]
    assert codes == ["ROCM_ARCH_MALFORMED"]


def test_arch_mismatch_against_a_recorded_machine_exit_1(workdir, check):
    snapshot = str(SNAPSHOTS / "rx7900xtx.json")
    result = check(["good.yaml", "--snapshot", snapshot, "--arch", "gfx942"], workdir)
    assert result.returncode == 1
    assert "TARGET_MISMATCH" in result.stdout and "refused" in result.stdout


def test_preset_style_file_name_for_another_gpu_is_refused_on_that_machine(workdir, check):
    (workdir / "mi300x_llama3_lora.yaml").write_text("stage: sft\nbf16: true\n")
    result = check(["mi300x_llama3_lora.yaml", "--snapshot", str(SNAPSHOTS / "w7900.json")], workdir)
    assert result.returncode == 1 and "TARGET_MISMATCH" in result.stdout


def test_plan_for_mi300x_on_a_laptop_shows_the_rewrites_as_a_diff(workdir, check):
    result = check(["good.yaml", "--gpu", "mi300x"], workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "planned: mi300x" in result.stdout
    assert "- fp16: true" in result.stdout and "+ bf16: true" in result.stdout
    assert "+ env PYTORCH_ROCM_ARCH=gfx942" in result.stdout


def test_json_output_shape(workdir, check):
    result = check(["good.yaml", "--json", "--gpu", "rx7900xtx", "learning_rate=2e-4"], workdir)
    report = json.loads(result.stdout)
    assert set(report) >= {"ok", "findings", "config"}
    shape = {"code", "level", "message", "fix"}
    assert all(shape <= set(f) <= shape | {"key", "remedy"} for f in report["findings"])
    assert any("key" in f for f in report["findings"])  # the key a finding is about, where it is about one
    assert report["config"]["learning_rate"] == 2e-4
    assert report["config"]["bf16"] is True


def test_a_flag_llamafactory_does_not_have_is_an_unknown_key_with_the_closest_one(workdir, check):
    result = check([*GOOD_FLAGS, "--gpus", "8", "--json"], workdir)
    assert result.returncode == 1, result.stderr
    errors = [f for f in json.loads(result.stdout)["findings"] if f["level"] == "error"]
    assert [f["code"] for f in errors] == ["UNKNOWN_KEY"]
    assert "gpus" in errors[0]["message"]


def test_the_flag_form_resolves_exactly_as_the_yaml_form(workdir, check):
    from_yaml = json.loads(check(["good.yaml", "--json", "--gpu", "mi300x"], workdir).stdout)
    from_flags = json.loads(check([*GOOD_FLAGS, "--json", "--gpu", "mi300x"], workdir).stdout)
    assert from_yaml["ok"] and from_flags["ok"]
    assert from_flags["config"] == from_yaml["config"]
    assert [f["code"] for f in from_flags["findings"]] == [f["code"] for f in from_yaml["findings"]]


def test_a_file_then_overrides_puts_the_overrides_on_top(workdir, check):
    report = json.loads(check(["good.yaml", "learning_rate=2e-4", "max_steps=7", "--json"], workdir).stdout)
    assert report["config"]["learning_rate"] == 2e-4 and report["config"]["max_steps"] == 7


def test_a_file_then_flags_is_refused_in_one_line_as_llamafactory_refuses_it(workdir, check):
    # Oracle: tests/test_config_values_stock.py runs stock llamafactory-cli on the same tokens.
    result = check(["good.yaml", "learning_rate=2e-4", "--max_steps", "7"], workdir)
    assert_one_line_usage_error(result, "'--max_steps', '7' become keys", "Some keys are not used", "max_steps=7")


def test_an_empty_config_is_one_line(workdir, check):
    (workdir / "empty.yaml").write_text("# model_name_or_path: x\n")
    assert_one_line_usage_error(check(["empty.yaml"], workdir), "empty.yaml is empty")


def test_a_bad_flag_value_is_a_finding_naming_key_value_and_type(workdir, check):
    result = check([*GOOD_FLAGS, "--max_steps", "abc", "--bf16", "maybe", "--json"], workdir)
    assert result.returncode == 1
    errors = {f["code"]: f["message"] for f in json.loads(result.stdout)["findings"] if f["level"] == "error"}
    assert list(errors) == ["VALUE_INVALID"] or set(errors) == {"VALUE_INVALID"}
    messages = [f["message"] for f in json.loads(result.stdout)["findings"] if f["code"] == "VALUE_INVALID"]
    assert any("max_steps: 'abc' is not a whole number" in m for m in messages)
    assert any("bf16: 'maybe' is not true or false" in m for m in messages)


def test_a_positional_word_among_flags_is_one_line_exit_2(workdir, check):
    # `llamafactory-rocm train --stage sft` once took `sft` as the config path.
    assert_one_line_usage_error(check(["sft", "--stage", "sft"], workdir), "not a config file")


def test_our_own_options_are_never_llamafactory_keys():
    from llamafactory_rocm.cli._args import OWN_OPTIONS
    from llamafactory_rocm.cli.main import build_parser
    from llamafactory_rocm.lf.schema import load_schema

    keys = load_schema().keys
    assert load_schema().parser is not None
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("check", "train"):
        options = {o.lstrip("-") for a in subs.choices[name]._actions for o in a.option_strings}
        assert set(OWN_OPTIONS) <= options
        assert not (options - {"h", "help"}) & keys, name


def test_a_file_that_cannot_be_read_is_one_line_with_exit_2(workdir, check):
    long_name = "x" * 300 + ".yaml"  # past any file system's name limit: the OS refuses it
    assert_one_line_usage_error(check([long_name], workdir), "cannot use", "File name too long")


def test_an_error_of_our_own_is_one_line_with_exit_4_and_the_traceback_on_request(workdir, monkeypatch, capsys):
    from llamafactory_rocm.cli import check_cmd, main
    from llamafactory_rocm.errors import DEBUG_ENV, EXIT_INTERNAL

    def broken(args: object) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(check_cmd, "run", broken)
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    assert main.main(["check", str(workdir / "good.yaml")]) == EXIT_INTERNAL
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("llamafactory-rocm check: unexpected RuntimeError: a bug. This is a bug")
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(RuntimeError, match="a bug"):
        main.main(["check", str(workdir / "good.yaml")])


def test_once_llamafactory_runs_its_errors_are_shown_as_it_shows_them(workdir, monkeypatch):
    from llamafactory_rocm.cli import check_cmd, main
    from llamafactory_rocm.train import launch

    def trainer_fails(args: object) -> int:
        launch.HANDED_OVER = True  # as hand_over sets it before LLaMA-Factory's launcher runs
        raise OSError("disk full while saving a checkpoint")

    monkeypatch.setattr(check_cmd, "run", trainer_fails)
    monkeypatch.setattr(launch, "HANDED_OVER", False)
    with pytest.raises(OSError, match="disk full"):
        main.main(["check", str(workdir / "good.yaml")])


def test_an_override_that_is_not_yaml_is_one_line(workdir, check):
    assert_one_line_usage_error(check(["good.yaml", "a=[1,2"], workdir), "cannot apply overrides")


def test_a_key_that_is_not_a_name_is_one_line(workdir, check):
    (workdir / "numkey.yaml").write_text("stage: sft\n1: a\n")
    assert_one_line_usage_error(check(["numkey.yaml"], workdir), "a key that is not a name: 1")


def test_a_snapshot_that_is_a_pipe_is_refused_without_reading_it(workdir, check):
    os.mkfifo(workdir / "snap.json")
    assert_one_line_usage_error(check(["good.yaml", "--snapshot", "snap.json"], workdir), "not a regular file")


INTERRUPTED_AT_THE_CONFIG = """
import os, signal, sys
# Ctrl-C as a user's shell delivers it: a process started from a test worker may inherit SIGINT ignored (a
# disposition exec keeps, set by a library earlier in that worker), and Python then installs no handler.
signal.signal(signal.SIGINT, signal.default_int_handler)
config = os.path.abspath(sys.argv[1])
def interrupt(event, args):  # a real SIGINT, as Ctrl-C sends it, the moment the config file is opened
    if event == "open" and args and str(args[0]) == config:
        os.kill(os.getpid(), signal.SIGINT)
sys.addaudithook(interrupt)
from llamafactory_rocm.cli.main import main
sys.exit(main(["check", config]))
"""


def test_ctrl_c_exits_128_plus_sigint_in_one_line(workdir):
    """Oracle: the shell's convention for a command a signal stopped, 128 + the signal's number."""
    import signal

    result = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_AT_THE_CONFIG, "good.yaml"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 128 + signal.SIGINT == 130, result.stderr
    assert result.stderr.strip().splitlines() == ["llamafactory-rocm: interrupted"]


@pytest.mark.parametrize("command", [["explain"], ["check", "good.yaml"]])
def test_output_closed_early_exits_128_plus_sigpipe_quietly(workdir, command):
    """`llamafactory-rocm ... | head`, with the reader gone before anything is written. Oracle: 128 + SIGPIPE,
    as a shell reports a command SIGPIPE stopped; nothing on stderr."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "llamafactory_rocm.cli.main", *command],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # the reader is gone: every write gets EPIPE
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 128 + signal.SIGPIPE == 141, err
    assert err == ""
