"""Every ``llamafactory-rocm ...`` command the README and docs/*.md quote parses with the CLI's own parser
(issue 40 item 5): a flag or subcommand the CLI does not have fails here, naming the doc and its line.

The commands are found in code blocks (a line, or what follows ``&&``/``;``/``$``) and in inline backticks;
each is split as a shell splits it and handed to ``build_parser()`` (``llamafactory_rocm/cli/main.py``, the
parser ``main`` runs), with ``parse_known_args`` as ``main`` calls it. What ``check``/``train`` leave over is
LLaMA-Factory's (a config file with ``key=value`` overrides, or its ``--key value`` flags): the flag form is
read as ``check`` reads it and its keys go through the check's rules, where a key neither LLaMA-Factory nor
the blog-key translation knows is ``UNKNOWN_KEY``. The CLI table's synopses in docs/index.md (``datasets validate
NAME_OR_FILE [--dataset-dir DIR] ...``) are held to the same parser: each flag they name must be an option of
that subcommand.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from llamafactory_rocm.check.config_io import load_launch_args
from llamafactory_rocm.cli.main import build_parser
from llamafactory_rocm.errors import UsageError
from llamafactory_rocm.rules import resolve
from tests.conftest import make_ctx

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROG = "llamafactory-rocm"
# Where a command starts in a shell line: the line's start (after `$ ` and VAR=value prefixes) or after a
# separator; an output line ("llamafactory-rocm check: ...") is not a command (its word ends with ':').
START = re.compile(r"(?:^|&&|;|\|\||\(|\$)\s*(?:[A-Z_][A-Z0-9_]*=\S*\s+)*" + re.escape(PROG) + r"(?=\s|$)")
INLINE = re.compile(r"`((?:[A-Z_][A-Z0-9_]*=\S*\s+)*" + re.escape(PROG) + r"(?:\s[^`]*)?)`")
SHELL_END = re.compile(r"\s(?:&&|\|\|?|;|>|2>&1|#)(?:\s|$).*")


def quoted_commands() -> list[tuple[str, int, str]]:
    """(doc, line number, the command's words after the program name) for each quoted command."""
    found = []
    for doc in DOCS:
        in_block, output, held = False, False, ""
        lines = doc.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            if in_block and line.rstrip().endswith("\\"):  # a shell line continued on the next one
                held += line.rstrip()[:-1] + " "
                continue
            line, held = held + line, ""
            if line.lstrip().startswith("```"):
                in_block, output = not in_block, line.strip() == "```text"
                continue
            if in_block:
                if output and not line.startswith("$ "):  # a transcript: only its `$ ` lines are commands
                    continue
                for match in START.finditer(line):
                    found.append((doc.name, number, SHELL_END.sub("", line[match.end() :]).strip()))
            else:
                for match in INLINE.finditer(line):
                    words = match.group(1).split(PROG, 1)[1]
                    found.append((doc.name, number, SHELL_END.sub("", words).strip()))
    # an empty rest is the package's name in prose
    return [(doc, number, words) for doc, number, words in found if words and not words.startswith(":")]


COMMANDS = quoted_commands()


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def parser_for(words: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The (sub)parser the leading words select, and those words."""
    parser, path = build_parser(), []
    for word in words:
        sub = subparsers(parser).get(word)
        if sub is None:
            break
        parser, path = sub, [*path, word]
    return parser, path


def refusal(words: str) -> str | None:
    """What the CLI's parser says of ``llamafactory-rocm <words>``; None where it takes them."""
    # a synopsis's optional parts (`[--gpu w7900] [--json]`) are parsed as given
    tokens = [t for t in shlex.split(words.replace("[", " ").replace("]", " ")) if t not in ("...", "…")]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args, extra = build_parser().parse_known_args(tokens)
    except SystemExit as exit_:
        return None if exit_.code == 0 else err.getvalue().strip() or "refused"  # 0: --help
    if not getattr(args, "takes_launch_args", False):
        return f"unrecognized arguments: {' '.join(extra)}" if extra else None
    if not extra or not extra[0].startswith("--"):
        return None  # a config file and key=value overrides: LLaMA-Factory's read_args takes any
    try:  # LLaMA-Factory's flag form, read as check reads it, then the check's rules on its keys
        config, _ = load_launch_args(extra)
    except UsageError as err:
        return str(err)
    findings = resolve(config, {}, make_ctx("cpu_only")).findings
    unknown = [f.key for f in findings if f.code == "UNKNOWN_KEY"]  # the blog keys it rewrites are not
    return f"neither the CLI's nor LLaMA-Factory's flags: {', '.join(map(str, unknown))}" if unknown else None


def test_the_docs_quote_commands():
    """The search finds the commands it must, so the test below cannot pass by finding none."""
    assert len(COMMANDS) > 50
    assert any(doc == "README.md" and words == "demo" for doc, _, words in COMMANDS)
    assert any(doc == "index.md" and words.startswith("check my.yaml") for doc, _, words in COMMANDS)


@pytest.mark.parametrize(("doc", "number", "words"), COMMANDS, ids=[f"{c[0]}:{c[1]}" for c in COMMANDS])
def test_each_quoted_command_parses(doc, number, words):
    said = refusal(words)
    assert said is None, f"{doc} line {number}: `{PROG} {words}`: {said}"


def synopses() -> list[tuple[int, str]]:
    """(line, first cell) of each row of docs/index.md's CLI table: `check CONFIG [key=value ...] [...]`."""
    lines = (ROOT / "docs" / "index.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("## CLI")
    rows = []
    for number, line in enumerate(lines[start:], start + 1):
        cell = re.match(r"\| `([a-z][^`]*)` \|", line)
        if cell:
            rows.append((number, cell.group(1)))
        elif rows and not line.startswith("|"):
            break
    return rows


SYNOPSES = synopses()


def test_the_cli_table_is_found():
    assert len(SYNOPSES) >= 10 and any(s.startswith("datasets validate") for _, s in SYNOPSES)


@pytest.mark.parametrize(("number", "synopsis"), SYNOPSES, ids=[s.split(" [")[0] for _, s in SYNOPSES])
def test_each_synopsis_names_the_subcommands_options(number, synopsis):
    parser, path = parser_for(synopsis.split())
    assert path and " ".join(path) == " ".join(synopsis.split()[: len(path)]), f"index.md line {number}: {synopsis}"
    options = {option for action in parser._actions for option in action.option_strings}
    named = re.findall(r"--[a-z][a-z0-9-]*", synopsis)
    missing = [flag for flag in named if flag not in options]
    assert not missing, f"index.md line {number}: `{' '.join(path)}` has no {', '.join(missing)}"
