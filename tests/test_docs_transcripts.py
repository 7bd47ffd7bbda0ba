"""The terminal transcripts the docs quote are what the commands print today.

Each quoted block is the output of one command on a recorded snapshot (or a plan for a catalogued GPU),
which needs no GPU: a rule's wording that changes without its docs fails here, naming the command that
regenerates the block.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from llamafactory_rocm.cli.main import main

ROOT = Path(__file__).resolve().parents[1]

# (doc, the sentence the block follows, the command's arguments)
TRANSCRIPTS = [
    (
        "docs/mi300x.md",
        "What `doctor` prints on a recorded single-MI300X machine",
        ["doctor", "--snapshot", "tests/snapshots/mi300x.json"],
    ),
    (
        "docs/rx7900.md",
        "`doctor` on the recorded RX 7900 XTX",
        ["doctor", "--snapshot", "tests/snapshots/rx7900xtx.json"],
    ),
]


def quoted_block(doc: str, marker: str) -> str:
    text = (ROOT / doc).read_text(encoding="utf-8")
    start = text.index("```text\n", text.index(marker)) + len("```text\n")
    return text[start : text.index("```", start)].rstrip("\n")


@pytest.mark.parametrize(("doc", "marker", "args"), TRANSCRIPTS, ids=[t[0] for t in TRANSCRIPTS])
def test_the_quoted_output_is_what_the_command_prints(doc, marker, args, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(args)
    printed = out.getvalue().rstrip("\n")
    assert quoted_block(doc, marker) == printed, f"regenerate {doc}'s block: llamafactory-rocm {' '.join(args)}"
