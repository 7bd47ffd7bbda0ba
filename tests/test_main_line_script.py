"""tests/main_line.sh without LLaMA-Factory main's wheel (issue 40 item 3): in CI it fails with one line before
installing anything, so a CI without the wheel cannot pass having tested one line; elsewhere it says so and
exits 0. ``python3`` and ``pip`` on the script's PATH are stand-ins that record a call: none may happen."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "main_line.sh"


def run_without_wheel(tmp_path: Path, ci: str | None) -> tuple[subprocess.CompletedProcess, Path]:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "llamafactory-0.9.5-py3-none-any.whl").write_bytes(b"")  # 0.9.5 is not the main line
    shims, calls = tmp_path / "bin", tmp_path / "calls"
    shims.mkdir()
    for tool in ("python3", "pip", "python"):
        shim = shims / tool
        shim.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{calls}"\nexit 1\n')
        shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(PATH=f"{shims}:{env['PATH']}", LLAMAFACTORY_ROCM_MAIN_WHEELS=str(wheels))
    if ci is not None:
        env["CI"] = ci
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    return done, calls


@pytest.mark.parametrize("ci", ["true", "1", "True"])
def test_in_ci_a_missing_main_wheel_fails_before_installing_anything(tmp_path, ci):
    done, calls = run_without_wheel(tmp_path, ci)
    assert done.returncode != 0, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "no LLaMA-Factory main wheel" in line and str(tmp_path / "wheels") in line
    assert not calls.exists(), calls.read_text()


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_outside_ci_a_missing_main_wheel_is_said_and_skipped(tmp_path, ci):
    done, calls = run_without_wheel(tmp_path, ci)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "only 0.9.5 was tested" in done.stdout
    assert not calls.exists(), calls.read_text()
