"""Write a family's stand-in tokenizer into a model folder, and say what it is and how far its counts are off.

Qwen3's own tokenizer is shipped (Apache-2.0, data/NOTICE); Llama 3's is built from it (llama3.py), since Meta's
vocabulary is under the Meta Llama 3 Community License (docs/standin-tokenizer.md). The error each family's
tokenizer makes in token counts is the one bench/bench_standin_tokenizer.py measured, recorded in
data/errors.json with its command and date.
"""

from __future__ import annotations

import json
import lzma
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from . import llama3

DATA = Path(__file__).resolve().parent / "data"
QWEN3_TOKENIZER = DATA / "qwen3_tokenizer.json.xz"
QWEN3_CONFIG = DATA / "qwen3_tokenizer_config.json"
ERRORS = DATA / "errors.json"

FAMILIES = ("llama3", "qwen3")

# What each family's tokenizer is, and whether it is the family's own.
_WHAT = {
    "qwen3": (True, "Qwen3's own tokenizer (Apache-2.0), shipped"),
    "llama3": (False, "Qwen3's byte-level BPE with Llama 3's special tokens, digit split and chat format, a stand-in"),
}


@dataclass(frozen=True)
class StandinInfo:
    family: str
    exact: bool  # True where the tokenizer written is the family's real one
    what: str  # one line: what the tokenizer is
    error: str | None  # its measured token-count error on the bundled data, with command and date; None if unmeasured


def write_tokenizer(family: str, folder: Path) -> StandinInfo:
    """Write ``family``'s tokenizer files into ``folder`` (made if missing): AutoTokenizer.from_pretrained and
    LLaMA-Factory's load_tokenizer read them as they read a model repository's."""
    if family not in FAMILIES:
        raise ValueError(f"no stand-in tokenizer for family {family!r}; the families shipped: {', '.join(FAMILIES)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if family == "qwen3":
        (folder / "tokenizer.json").write_text(_qwen3_tokenizer(), encoding="utf-8")
        config: dict[str, Any] = json.loads(QWEN3_CONFIG.read_text(encoding="utf-8"))
    else:
        (folder / "tokenizer.json").write_text(_llama3_tokenizer(), encoding="utf-8")
        config = llama3.tokenizer_config()
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")
    # For readers that take the special tokens from this file rather than tokenizer_config.json.
    specials = {key: config[key] for key in ("bos_token", "eos_token", "pad_token") if config.get(key)}
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2), encoding="utf-8")
    return standin_info(family)


def standin_info(family: str) -> StandinInfo:
    exact, what = _WHAT[family]
    return StandinInfo(family=family, exact=exact, what=what, error=recorded_error(family))


def recorded_error(family: str) -> str | None:
    """The one line bench/bench_standin_tokenizer.py recorded for ``family``; None where it has not run."""
    entry = recorded_errors().get(family)
    if entry is None:
        return None
    return (
        f"{entry['total_pct']:+.2f}% tokens against {entry['reference']} on the bundled data ({entry['rows']} rows of "
        f"{len(entry['datasets'])} datasets/*.json, per row median {entry['median_row_pct']:+.2f}%, worst "
        f"{entry['worst_row_pct']:+.2f}%; {entry['command']}, {entry['date']})"
    )


def recorded_errors() -> dict[str, dict[str, Any]]:
    if not ERRORS.is_file():
        return {}
    return json.loads(ERRORS.read_text(encoding="utf-8"))


@cache
def _qwen3_tokenizer() -> str:
    # Kept once a process: a check writes one folder, the bench and tests a few.
    return lzma.decompress(QWEN3_TOKENIZER.read_bytes()).decode("utf-8")


@cache
def _llama3_tokenizer() -> str:
    # Built once a process (about 2.4 s): `presets list --forecast` writes it for each Llama 3 preset.
    return json.dumps(llama3.llama3_standin(json.loads(_qwen3_tokenizer())), ensure_ascii=False)
