"""The set of keys LLaMA-Factory's train parser accepts.

Importing ``llamafactory.hparams`` costs seconds (it imports transformers), so the key set of each
tested LLaMA-Factory release ships as data (``data/train_keys.json``) and the live dataclasses are
read only when the installed release is another one. ``tests/test_lf_keys.py`` keeps the shipped list
equal to the live one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from functools import lru_cache
from importlib import metadata, resources

_DATA_FILE = "train_keys.json"


def installed_llamafactory_version() -> str | None:
    try:
        return metadata.version("llamafactory")
    except metadata.PackageNotFoundError:
        return None


def live_train_keys() -> frozenset[str]:
    """Field names of the dataclasses ``get_train_args`` parses, read from the installed release."""
    from ._startup import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.hparams import parser

    names: set[str] = set()
    for cls in parser._TRAIN_ARGS:
        names |= {f.name for f in dataclasses.fields(cls) if f.init}
    return frozenset(names)


def shipped_train_keys() -> tuple[str, frozenset[str]]:
    raw = json.loads(resources.files("llamafactory_rocm.data").joinpath(_DATA_FILE).read_text("utf-8"))
    return raw["llamafactory_version"], frozenset(raw["keys"])


@lru_cache(maxsize=1)
def train_keys() -> frozenset[str]:
    version, keys = shipped_train_keys()
    installed = installed_llamafactory_version()
    if installed is None or installed == version:
        return keys
    return live_train_keys()


def _write_shipped() -> None:
    from . import fsutil

    target = resources.files("llamafactory_rocm.data").joinpath(_DATA_FILE)
    payload = {
        "llamafactory_version": installed_llamafactory_version(),
        "generated_by": "python -m llamafactory_rocm.lf_keys --write",
        "keys": sorted(live_train_keys()),
    }
    fsutil.atomic_write_text(target, json.dumps(payload, indent=0) + "\n")  # type: ignore[arg-type]


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description="Regenerate the shipped LLaMA-Factory key list.")
    cli.add_argument("--write", action="store_true")
    if cli.parse_args().write:
        _write_shipped()
