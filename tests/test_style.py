"""The project stays ruff clean (pyproject's [tool.ruff]): lint and format, as CI runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_is_clean(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "llamafactory_rocm", "tests", "bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]
