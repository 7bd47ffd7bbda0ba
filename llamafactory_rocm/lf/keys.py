"""The shipped key list of LLaMA-Factory's train parser: the fallback when it cannot be imported.

``lf_schema`` reads keys and value types from the installed LLaMA-Factory's own parser; this list
(``data/train_keys.json``) serves only where that import fails. ``tests/test_startup_hook.py`` keeps it
equal to the live parser's keys for the release it names.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from importlib import metadata, resources

_DATA_FILE = "train_keys.json"


def installed_llamafactory_version() -> str | None:
    try:
        return metadata.version("llamafactory")
    except metadata.PackageNotFoundError:
        return None


def live_train_keys() -> frozenset[str]:
    """Field names of the dataclasses ``get_train_args`` parses, read from the installed release."""
    from .text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.hparams import parser

    names: set[str] = set()
    for cls in parser._TRAIN_ARGS:
        names |= {f.name for f in dataclasses.fields(cls) if f.init}
    return frozenset(names)


def shipped_train_keys() -> tuple[str, frozenset[str]]:
    raw = json.loads(resources.files("llamafactory_rocm.data").joinpath(_DATA_FILE).read_text("utf-8"))
    return raw["llamafactory_version"], frozenset(raw["keys"])


def _write_shipped() -> None:
    from .. import fsutil

    target = resources.files("llamafactory_rocm.data").joinpath(_DATA_FILE)
    payload = {
        "llamafactory_version": installed_llamafactory_version(),
        "generated_by": "python -m llamafactory_rocm.lf.keys --write",
        "keys": sorted(live_train_keys()),
    }
    fsutil.atomic_write_text(target, json.dumps(payload, indent=0) + "\n")  # type: ignore[arg-type]


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description="Regenerate the shipped LLaMA-Factory key list.")
    cli.add_argument("--write", action="store_true")
    if cli.parse_args().write:
        _write_shipped()
