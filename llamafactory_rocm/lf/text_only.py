"""Import LLaMA-Factory where torchaudio cannot be imported (the README's install has none).

LLaMA-Factory 0.9.5 imports torchaudio unconditionally in ``llamafactory/data/mm_plugin.py``, for audio
inputs only. While that module loads, a stand-in is visible; it raises a clear error only when
audio is really used (docs/rocm-facts.md#l2).
"""

from __future__ import annotations

import importlib.machinery
import sys
from types import ModuleType

from ..errors import one_line


class MissingTorchaudio(ModuleType):
    """Stands in for a torchaudio that cannot be imported; fails only when audio is touched."""

    def __init__(self, reason: str) -> None:
        super().__init__("torchaudio")
        self.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
        self._reason = reason

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        raise ImportError(
            f"this dataset has audio inputs, which need torchaudio, but it cannot be imported "
            f"({self._reason}). Text-only training does not need it; for audio, install the "
            "torchaudio wheel built for your torch (ROCm: from the same ROCm wheel index as torch)."
        )


_ABSENT = object()


class text_only_llamafactory:  # lower case: used like a function, `with text_only_llamafactory():`
    """Import LLaMA-Factory modules here even when torchaudio cannot be imported."""

    def __enter__(self) -> None:
        self._stand_in: MissingTorchaudio | None = None
        if sys.modules.get("torchaudio") is not None:
            return
        self._previous = sys.modules.get("torchaudio", _ABSENT)
        try:
            __import__("torchaudio")
        except Exception as exc:  # ImportError, or OSError for a CUDA-linked wheel (libc10_cuda.so)
            for name in [n for n in sys.modules if n.startswith("torchaudio.")]:
                del sys.modules[name]
            reason = one_line(exc, first_line=True)
            self._stand_in = MissingTorchaudio(reason)
            sys.modules["torchaudio"] = self._stand_in

    def __exit__(self, *exc_info: object) -> None:
        # Others (transformers' availability checks) must not mistake the stand-in for torchaudio.
        if self._stand_in is not None and sys.modules.get("torchaudio") is self._stand_in:
            if self._previous is _ABSENT:
                del sys.modules["torchaudio"]
            else:
                sys.modules["torchaudio"] = self._previous  # type: ignore[assignment]
