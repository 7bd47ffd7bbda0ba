"""``llamafactory-rocm explain``: one entry per code, a one-line refusal for an unknown one."""

from __future__ import annotations

import re

import pytest

from llamafactory_rocm.cli.main import main
from llamafactory_rocm.errors import EXIT_USAGE
from llamafactory_rocm.findings.registry import load_codes


def test_explain_prints_what_why_fix_example_and_the_fact(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "ROCM_ARCH_FEATURE_MISMATCH"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ROCM_ARCH_FEATURE_MISMATCH (error)")
    for label in ("What:", "Why:", "Fix:", "Example:", "Source:  docs/rocm-facts.md#p2"):
        assert label in out


def test_explain_takes_any_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "tf32_dropped"]) == 0
    assert capsys.readouterr().out.startswith("TF32_DROPPED (change)")


@pytest.mark.parametrize("code", sorted(load_codes().codes))
def test_every_code_explains(code: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", code]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{code} (")
    fix_lines = load_codes().codes[code].fix_lines()
    placeholder = re.compile(r"\{\w+(![rsa])?\}")  # a template's name left unfilled (a JSON example's braces are text)
    assert all(line in out.splitlines() and not placeholder.search(line) for line in fix_lines)


def test_an_unknown_code_is_one_line_exit_2_with_the_nearest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "ROCM_ARCH_MISSING_DEVICE"]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and "unknown code 'ROCM_ARCH_MISSING_DEVICE'" in lines[0]
    assert "Nearest: ROCM_ARCH_MISSES_DEVICE" in lines[0]


def test_list_names_every_code_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == sorted(load_codes().codes)


def test_markdown_is_the_docs_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--markdown"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == load_codes().markdown_table()
