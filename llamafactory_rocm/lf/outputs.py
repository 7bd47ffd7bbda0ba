"""What already lies in output_dir: the checkpoints and weights a run could clobber or resume from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _weight_files() -> tuple[str, ...]:
    """The names LLaMA-Factory treats as final weights in output_dir (its own CHECKPOINT_NAMES)."""
    from .text_only import text_only_llamafactory

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


def resume_checkpoint(output_dir: str | Path) -> str | None:
    """The name of the checkpoint LLaMA-Factory would resume from: transformers' own choice
    (``get_last_checkpoint``); whether it loads is the dry run's verdict (CHECKPOINT_NOT_LOADABLE)."""
    if not Path(output_dir).is_dir():
        return None
    from transformers.trainer_utils import get_last_checkpoint

    last = get_last_checkpoint(str(output_dir))
    return None if last is None else Path(last).name


def experiment_of(checkpoint: str | Path) -> tuple[Any, ...] | None:
    """What makes a checkpoint one experiment's: the base model and the adapter's shape as peft wrote them
    (adapter_config.json), or the model's shape (config.json) for full and freeze tuning; None when the
    folder has neither (an interrupted save, DeepSpeed's shards alone)."""
    folder = Path(checkpoint)
    adapter = _json(folder / "adapter_config.json")  # peft's CONFIG_NAME
    if adapter is not None:
        targets = adapter.get("target_modules")
        targets = tuple(sorted(map(str, targets))) if isinstance(targets, list) else targets
        return ("adapter", adapter.get("base_model_name_or_path"), adapter.get("peft_type"), adapter.get("r"), targets)
    model = _json(folder / "config.json")  # transformers' CONFIG_NAME
    if model is not None:
        shape = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")
        return ("model", tuple(model.get("architectures") or ()), *(model.get(key) for key in shape))
    return None


def other_experiments(output_dir: str | Path, resumed: str | Path) -> list[str]:
    """The checkpoint-* folders in output_dir (in transformers' own order, ``sort_checkpoints``, oldest first)
    that are another experiment's than ``resumed``: the ones a rotation must not delete."""
    mine = experiment_of(resumed)
    if mine is None or not Path(output_dir).is_dir():
        return []
    try:
        from transformers.trainer_utils import sort_checkpoints
    except ImportError:  # transformers before 5: Trainer._sorted_checkpoints, the same order by step
        found = sorted(Path(output_dir).glob("checkpoint-*"), key=lambda p: (len(p.name), p.name))
    else:
        found = [Path(path) for path in sort_checkpoints(str(output_dir))]
    return [path.name for path in found if (theirs := experiment_of(path)) is not None and theirs != mine]


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
