"""A tokenizer for the dry run where the model's own cannot be had: Qwen3's own (shipped), or Llama 3's stand-in.

``standin_family`` says which family fits a model, ``write_tokenizer`` writes it into a model folder and says
what it is and its measured count error (docs/standin-tokenizer.md).
"""

from __future__ import annotations

from .family import standin_family
from .tokenizer import FAMILIES, StandinInfo, recorded_error, write_tokenizer

__all__ = ["FAMILIES", "StandinInfo", "recorded_error", "standin_family", "write_tokenizer"]
