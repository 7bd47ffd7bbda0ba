"""The terminal transcripts the docs quote are what the commands print today; the exit-code tables are the
codes the CLI defines; no page quotes a test count; each user page says no AMD GPU ran it.

Each quoted block is the output of one command on a recorded snapshot (or a plan for a catalogued GPU),
which needs no GPU: a rule's wording that changes without its docs fails here, naming the command that
regenerates the block.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamafactory_rocm.cli.main import main
from llamafactory_rocm.machine.probe import RELEVANT_ENV_VARS
from llamafactory_rocm.machine.snapshot import WORLD_ENV_VARS

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
    (
        "docs/index.md",
        "`check` on a laptop for a rented MI300X",
        ["check", "presets/mi300x_llama3_lora.yaml", "--gpu", "mi300x"],
    ),
    (
        "docs/index.md",
        "`presets list` (the same test compares it)",
        ["presets", "list"],
    ),
]


def quoted_block(doc: str, marker: str) -> str:
    text = (ROOT / doc).read_text(encoding="utf-8")
    start = text.index("```text\n", text.index(marker)) + len("```text\n")
    return text[start : text.index("```", start)].rstrip("\n")


@pytest.fixture(scope="module")
def laptop_hub() -> Iterator[str]:
    """The Hugging Face Hub as a laptop without a token sees it: Meta's Llama 3 repos gated (401, GatedRepo), no
    other repo (tests/hub_server.py on 127.0.0.1; nothing leaves this machine)."""
    from tests.hub_server import serving

    gated = ("meta-llama/Meta-Llama-3-8B-Instruct",)
    empty = Path(tempfile.mkdtemp(prefix="laptop-hub-"))
    with serving(dict.fromkeys(gated, empty), gated=frozenset(gated)) as hub:
        yield hub.url


def documented_machine(monkeypatch, tmp_path: Path, hub_url: str | None = None) -> None:
    """What a planned check reads of this machine besides the plan, set as on the machine the docs describe:
    none of the variables the rules read (a PYTORCH_ROCM_ARCH or HIP_VISIBLE_DEVICES here would change the
    findings), an empty Hugging Face cache (the quoted dry run says the model is not in it; transformers
    reads ``constants.HF_HUB_CACHE`` at each call, set once at import, so the constant is patched too) and
    ``hub_url``'s Hub (``laptop_hub``: the check asks it for the config and tokenizer of a model not here)."""
    import huggingface_hub.constants

    if hub_url is not None:
        monkeypatch.setenv("HF_ENDPOINT", hub_url)
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub_url)
        monkeypatch.delenv("HF_TOKEN", raising=False)

    for name in (*RELEVANT_ENV_VARS, *WORLD_ENV_VARS):
        monkeypatch.delenv(name, raising=False)
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    # An ordinary laptop: the Hub not switched off by the user (the dry run itself never downloads); under the
    # user's HF_HUB_OFFLINE=1 a planned check adds that the model must be in the target's cache.
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("doc", "marker", "args"), TRANSCRIPTS, ids=[f"{t[0]}:{' '.join(t[2][:2])}" for t in TRANSCRIPTS]
)
def test_the_quoted_output_is_what_the_command_prints(doc, marker, args, monkeypatch, tmp_path, laptop_hub):
    monkeypatch.chdir(ROOT)
    documented_machine(monkeypatch, tmp_path, laptop_hub)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(args)
    printed = out.getvalue().rstrip("\n")
    assert quoted_block(doc, marker) == printed, f"regenerate {doc}'s block: llamafactory-rocm {' '.join(args)}"


def cli_exit_codes() -> set[int]:
    """The exit codes the CLI defines: errors.py's EXIT_* constants and the numbers cli/main.py returns as
    they are (130 for Ctrl-C, 141 for a closed pipe)."""
    import ast

    from llamafactory_rocm import errors

    codes = {value for name, value in vars(errors).items() if name.startswith("EXIT_") and isinstance(value, int)}
    main_py = (ROOT / "llamafactory_rocm" / "cli" / "main.py").read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(main_py)):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int):
            codes.add(node.value.value)
    return codes


def documented_exit_codes(doc: str, heading: str) -> set[int]:
    """The codes of the table under ``heading`` in ``doc`` (its rows ``| 4 | ... |``)."""
    text = (ROOT / doc).read_text(encoding="utf-8").split(heading + "\n", 1)[1]
    table = text.split("\n#", 1)[0]
    return {int(code) for code in re.findall(r"^\| (\d+) \|", table, flags=re.M)}


@pytest.mark.parametrize(("doc", "heading"), [("README.md", "### Exit codes"), ("docs/index.md", "## Exit codes")])
def test_the_exit_code_table_is_the_clis(doc, heading):
    assert cli_exit_codes() >= {0, 1, 2, 3, 4, 5, 130, 141}  # the search finds what it must
    assert documented_exit_codes(doc, heading) == cli_exit_codes(), f"{doc}'s {heading} table"


def test_the_readme_quotes_no_test_count():
    """A count of passed tests goes stale with the next test added: the README says how to run them instead."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert not re.findall(r"\b\d+ (?:passed|tests? pass)", text)


@pytest.mark.parametrize("doc", ["README.md", "docs/index.md", "docs/after-training.md", "docs/llamaboard.md"])
def test_each_page_says_no_amd_gpu_ran_it(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert re.search(r"No AMD GPU was available", text), f"{doc} lacks the notice that no AMD GPU ran this"


def test_the_forecast_pages_block_is_what_check_prints(tiny_model, monkeypatch, tmp_path):
    """docs/forecast.md's first block: the forecast lines of ``check --forecast --gpu mi300x`` on the config it
    names (tests/conftest.py's tiny model and data, cutoff_len 1024, 3 epochs); every figure in it is
    deterministic (the rows' lengths, the FLOP count, the catalogue's peak, fraction and prices)."""
    import yaml

    from tests.conftest import tiny_train_config

    monkeypatch.chdir(tmp_path)
    documented_machine(monkeypatch, tmp_path)
    config = tiny_train_config(tiny_model, tmp_path / "out", cutoff_len=1024, num_train_epochs=3.0, max_steps=-1)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["check", "run.yaml", "--forecast", "--gpu", "mi300x"])
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("forecast: "))
    block = [lines[start], *itertools.takewhile(lambda line: line.startswith("  "), lines[start + 1 :])]
    text = (ROOT / "docs/forecast.md").read_text(encoding="utf-8")
    quoted_start = text.index("```\n") + len("```\n")
    quoted = text[quoted_start : text.index("```", quoted_start)].rstrip("\n")
    assert quoted == "\n".join(block), "regenerate docs/forecast.md's first block: check CONFIG --forecast --gpu mi300x"
