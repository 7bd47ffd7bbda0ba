"""One line on stderr from rank 0: how llamafactory-rocm speaks inside someone else's process."""

from __future__ import annotations

import os
import sys


def say(message: str) -> None:
    """One line on stderr, from rank 0 only."""
    if os.environ.get("RANK", "0") == "0":
        print(f"llamafactory-rocm: {message}", file=sys.stderr, flush=True)


def duration(seconds: float) -> str:
    """A time as every output says it: two significant figures under a second (a small run on a large card),
    hundredths under ten seconds, tenths under two minutes, minutes and seconds under two hours, hours above."""
    if seconds < 1:
        return f"{seconds:.2g} s"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        minutes, rest = divmod(round(seconds), 60)  # rounded first: 179.6 s is 3 min 00 s, not 2 min 60 s
        return f"{minutes} min {rest:02d} s"
    return f"{seconds / 3600:.2f} h"
