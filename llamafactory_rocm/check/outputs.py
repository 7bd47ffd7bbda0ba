"""What already lies in output_dir: the checkpoints and weights a run could clobber or resume from."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _weight_files() -> tuple[str, ...]:
    """The names LLaMA-Factory treats as final weights in output_dir (its own CHECKPOINT_NAMES)."""
    from ..lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.extras.constants import CHECKPOINT_NAMES

    return tuple(sorted(CHECKPOINT_NAMES))


def existing_outputs(output_dir: str | Path) -> tuple[str, ...]:
    """checkpoint-* folders and final weight files already in output_dir (what a run could clobber)."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return ()
    names = sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name.startswith("checkpoint-"))
    names += [n for n in _weight_files() if (folder / n).is_file()]
    return tuple(names)


def resume_checkpoint(output_dir: str | Path, config: Mapping[str, Any] | None = None) -> tuple[str, bool] | None:
    """(name, loadable) of the checkpoint LLaMA-Factory would resume from: transformers' own choice
    (``get_last_checkpoint``), loadable as transformers' or DeepSpeed's loader needs it (lf/dry_run.py)."""
    if not Path(output_dir).is_dir():
        return None
    from transformers.trainer_utils import get_last_checkpoint

    from ..lf.dry_run import checkpoint_loadable

    last = get_last_checkpoint(str(output_dir))
    if last is None:
        return None
    deepspeed = bool((config or {}).get("deepspeed")) if config is not None else None
    return Path(last).name, checkpoint_loadable(last, deepspeed=deepspeed)
