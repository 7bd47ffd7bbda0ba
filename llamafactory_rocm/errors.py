"""Errors that end a command with one clear line and a documented exit code, never a traceback."""

from __future__ import annotations

# Exit codes of every llamafactory-rocm command (README, "Exit codes").
EXIT_OK = 0
EXIT_FINDINGS = 1  # an error finding: the config would fail or waste the GPU (or doctor: a fail)
EXIT_USAGE = 2  # bad input: missing file, unreadable YAML, unknown name, refused overwrite
EXIT_DIVERGED = 3  # the training guard stopped a run at a non-finite loss or grad norm
EXIT_INTERNAL = 4  # an error inside llamafactory-rocm itself, before the hand-over: a bug (one line)
EXIT_NODES_DISAGREE = 5  # the nodes of a multi-node run disagree (config, versions, arch): stopped before step 1
DEBUG_ENV = "LLAMAFACTORY_ROCM_DEBUG"  # set to 1: such an error shows its traceback


class UsageError(Exception):
    """Bad input. ``str(err)`` is the whole message: what is wrong and how to fix it."""

    exit_code = EXIT_USAGE


class CheckRefused(RuntimeError):
    """The check refused the config in a thread where exiting would not stop the run (a web UI's handler):
    train/after.py raises it, train/board.py shows its lines in the tab's box."""


def one_line(err: BaseException, *, limit: int | None = 600, cause: bool = True, first_line: bool = False) -> str:
    """An exception's words as one line: every run of whitespace one space, its type's name where it has no
    words; ``cause``: the exception it was raised from added in brackets where its words are new; ``limit``:
    at most that many characters, the cut marked with "..."; ``first_line``: only its first line, as written
    (a validator's or a parser's summary line, whose next lines are details)."""
    if first_line:
        text = str(err).strip()
        return text.splitlines()[0] if text else type(err).__name__
    text = " ".join(str(err).split()) or type(err).__name__
    below = err.__cause__
    if cause and below is not None and str(below) and str(below) not in text:
        text += f" ({' '.join(str(below).split())})"
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."
