"""Where the bundled presets and datasets are: inside the wheel, or at the root of a checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def bundled_dir(kind: str) -> Path:
    """``presets`` or ``datasets``. A wheel carries them under ``_bundled/``; an editable install
    or a source checkout reads the repository's top-level folder, which stays the source."""
    for candidate in (_PACKAGE / "_bundled" / kind, _PACKAGE.parent / kind):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"bundled {kind} folder not found; reinstall llamafactory-rocm")


def datasets_dir() -> Path:
    return bundled_dir("datasets")


def presets_dir() -> Path:
    return bundled_dir("presets")
