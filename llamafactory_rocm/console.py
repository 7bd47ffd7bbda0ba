"""One line on stderr from rank 0: how llamafactory-rocm speaks inside someone else's process."""

from __future__ import annotations

import math
import os
import sys


def say(message: str) -> None:
    """One line on stderr, from rank 0 only."""
    if os.environ.get("RANK", "0") == "0":
        print(f"llamafactory-rocm: {message}", file=sys.stderr, flush=True)


def duration(seconds: float) -> str:
    """A time as every output says it: two significant figures under a second (a small run on a large card),
    hundredths under ten seconds, tenths under two minutes, minutes and seconds under two hours, hours above
    (three figures from a million hours).
    Each band is chosen on the figure as rounded, so 9.996 s is "10.0 s", not "10.00 s"."""
    if not math.isfinite(seconds) or seconds < 0:
        return "not known"  # a rate file can carry NaN; no run takes negative time
    if seconds < 0.995:
        return f"{seconds:.2g} s"
    if seconds < 9.995:
        return f"{seconds:.2f} s"
    if seconds < 119.95:
        return f"{seconds:.1f} s"
    if round(seconds) < 7200:
        minutes, rest = divmod(round(seconds), 60)  # rounded first: 179.6 s is 3 min 00 s, not 2 min 60 s
        return f"{minutes} min {rest:02d} s"
    hours = seconds / 3600
    if hours >= 1e6:  # a run of a million hours is said in three figures, not twenty-two digits
        return f"{hours:.3g} h"
    return f"{hours:.2f} h"
