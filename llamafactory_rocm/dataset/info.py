"""Reading dataset_info.json: a malformed file is said to be malformed, never taken for a missing one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import UsageError, one_line

INFO_FILE = "dataset_info.json"  # llamafactory.extras.constants.DATA_CONFIG


def load_dataset_info(dataset_dir: Path) -> dict[str, Any] | None:
    """The parsed dataset_info.json of a folder; None when it has none; UsageError when unreadable."""
    path = Path(dataset_dir) / INFO_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read {path}: {reason(err)}") from None
    except ValueError as err:  # a NUL in dataset_dir: no path can hold one ("embedded null byte")
        raise UsageError(f"cannot read {path!r}: {err}; dataset_dir must be a folder's path") from None
    try:
        info = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(
            f"{path} is malformed: not valid JSON ({err.msg} at line {err.lineno} column {err.colno}). Fix it first."
        ) from None
    except (ValueError, RecursionError) as err:  # nested past Python's limit, or an integer of 4,300+ digits
        raise UsageError(f"{path} is malformed: it cannot be read as JSON here ({type(err).__name__}).") from None
    if not isinstance(info, dict):
        kind = "a list" if isinstance(info, list) else "a single value"
        raise UsageError(f"{path} is malformed: it holds {kind}, not a JSON object of dataset names. Fix it first.")
    return info


def reason(err: BaseException) -> str:
    return getattr(err, "strerror", None) or one_line(err, first_line=True)
