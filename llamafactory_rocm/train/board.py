"""LlamaBoard sees what the check said: our lines also go through LLaMA-Factory's own logger.

LlamaBoard (``llamafactory-cli webui``) starts ``llamafactory-cli train`` with ``LLAMABOARD_ENABLED=1``
and ``LLAMABOARD_WORKDIR`` (llamafactory/webui/runner.py ``_launch``) and shows the run's log from
``running_log.txt``, which LLaMA-Factory's ``LogCallback`` writes through a ``LoggerHandler`` that it
attaches to its root logger when the callback is built, inside ``run_exp`` (train/callbacks.py
``LogCallback.__init__``). stderr is shown only on failure. So under LlamaBoard:

- the log stays as LLaMA-Factory writes it (``verbosity.quiet_by_default`` steps aside);
- the check's report is logged once that handler exists (``on_init_end``, after ``LogCallback`` was
  built and before step 1), and the closing summary after the run, through ``llamafactory.rocm``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

BOARD_ENV = "LLAMABOARD_ENABLED"
LOGGER = "llamafactory.rocm"  # a child of LLaMA-Factory's root logger: its handlers see our records


def under_llamaboard() -> bool:
    """LLaMA-Factory's own reading of the variable (extras/misc.py ``is_env_enabled``)."""
    if BOARD_ENV not in os.environ:  # the common case, without importing LLaMA-Factory for it
        return False
    from ..lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.extras.misc import is_env_enabled

    return is_env_enabled(BOARD_ENV)


def log_lines(lines: Iterable[str]) -> None:
    """Each line through LLaMA-Factory's logger (so into running_log.txt), when LlamaBoard runs."""
    if not under_llamaboard():
        return
    logger = logging.getLogger(LOGGER)
    logger.setLevel(logging.INFO)
    for line in lines:
        if line.strip():
            logger.info(line)


def board_callback(lines: list[str]) -> Any:
    """A trainer callback that logs ``lines`` once the trainer exists (LogCallback's handler is attached)."""
    from transformers import TrainerCallback

    class BoardReport(TrainerCallback):
        def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.is_world_process_zero:
                log_lines(lines)

    return BoardReport()
