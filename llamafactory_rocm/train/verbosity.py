"""Quiet by default: LLaMA-Factory and transformers log at warning level unless the user chose.

How LLaMA-Factory 0.9.5 decides (``llamafactory/extras/logging.py``, ``hparams/parser.py``):

- its own loggers take ``LLAMAFACTORY_VERBOSITY`` (default INFO), read once, by the first
  ``get_logger()`` call, which runs when the first ``llamafactory`` module is imported;
- ``get_train_args`` switches transformers to INFO (the model config printed at every load) when
  ``LLAMAFACTORY_VERBOSITY`` is unset, ``INFO`` or ``DEBUG``; transformers itself reads
  ``TRANSFORMERS_VERBOSITY`` (default warning) when its logging starts;
- the data loader prints one training example as token ids and text with ``print``, whatever the level.

So ``quiet_by_default()`` sets ``LLAMAFACTORY_VERBOSITY=WARNING`` when the user has not set it (the
environment also reaches torchrun's ranks), lowers loggers already configured, and shortens the
example to one line. Progress bars and the trainer's loss lines are prints, not logs: they stay.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any

LF_ENV = "LLAMAFACTORY_VERBOSITY"
TF_ENV = "TRANSFORMERS_VERBOSITY"
QUIET_LEVEL = "WARNING"
_PROCESSORS = "llamafactory.data.processor"
IGNORE_INDEX = -100  # LLaMA-Factory's label for tokens not trained on (extras/constants.py)


def _level(environ: MutableMapping[str, str]) -> int:
    name = environ.get(LF_ENV, "").strip().upper()
    return logging._nameToLevel.get(name, logging.INFO)  # LLaMA-Factory's own default is INFO


def quiet_by_default(environ: MutableMapping[str, str] | None = None) -> bool:
    """Warning level for LLaMA-Factory and transformers unless the user set a verbosity.

    Safe to call more than once and at any time; returns True when the run is quiet. Call it before
    ``llamafactory`` is first imported where possible (its loggers then start quiet), and again
    just before ``run_exp`` trains (the data processors exist then and get the one-line example).
    """
    environ = os.environ if environ is None else environ
    from .board import under_llamaboard

    if under_llamaboard():  # LlamaBoard shows LLaMA-Factory's log (running_log.txt): keep it whole
        return False
    if not environ.get(LF_ENV, "").strip():
        environ[LF_ENV] = QUIET_LEVEL
    if _level(environ) < logging.WARNING:
        return False  # the user asked for INFO or DEBUG: LLaMA-Factory's own behaviour, untouched
    if "llamafactory.extras.logging" in sys.modules:  # configured already: the variable is read once
        logging.getLogger("llamafactory").setLevel(_level(environ))
    # Its only warnings are "No metric eval_loss to plot" on every run without an eval set.
    logging.getLogger("llamafactory.extras.ploting").setLevel(logging.ERROR)
    if not environ.get(TF_ENV) and "transformers.utils.logging" in sys.modules:
        import transformers.utils.logging as tf_logging

        tf_logging.set_verbosity_warning()
    _shorten_data_examples()
    return True


def _shorten_data_examples() -> None:
    """Each data processor's ``print_data_example`` prints one line instead of the token-id dump."""
    module = sys.modules.get(_PROCESSORS)
    if module is None:
        return
    for obj in vars(module).values():
        method = getattr(obj, "print_data_example", None)
        if isinstance(obj, type) and method is not None and not getattr(method, "_llamafactory_rocm", False):
            obj.print_data_example = _one_line(method)  # type: ignore[attr-defined]


def _one_line(original: Any) -> Any:
    def print_data_example(self: Any, example: dict[str, list[int]]) -> None:
        if _level(os.environ) < logging.WARNING:  # the user turned verbosity up later in the process
            original(self, example)
            return
        ids = example.get("input_ids") or example.get("chosen_input_ids") or []
        labels = example.get("labels") or example.get("chosen_labels") or []
        trained = sum(1 for label in labels if label != IGNORE_INDEX)
        print(f"  {len(ids)} tokens, {trained} trained on ({LF_ENV}=INFO prints the token ids and text)")

    print_data_example._llamafactory_rocm = True  # type: ignore[attr-defined]
    return print_data_example
