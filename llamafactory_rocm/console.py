"""One line on stderr from rank 0: how llamafactory-rocm speaks inside someone else's process."""

from __future__ import annotations

import os
import sys


def say(message: str) -> None:
    """One line on stderr, from rank 0 only."""
    if os.environ.get("RANK", "0") == "0":
        print(f"llamafactory-rocm: {message}", file=sys.stderr, flush=True)
