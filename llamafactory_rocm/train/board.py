"""LlamaBoard sees what the check said: our lines also go through LLaMA-Factory's own logger.

LlamaBoard (``llamafactory-cli webui``) starts ``llamafactory-cli train`` with ``LLAMABOARD_ENABLED=1``
and ``LLAMABOARD_WORKDIR`` (llamafactory/webui/runner.py ``_launch``) and shows the run's log from
``running_log.txt``, which LLaMA-Factory's ``LogCallback`` writes through a ``LoggerHandler`` that it
attaches to its root logger when the callback is built, inside ``run_exp`` (train/callbacks.py
``LogCallback.__init__``). stderr is shown only on failure. So under LlamaBoard:

- the log stays as LLaMA-Factory writes it (``verbosity.quiet_by_default`` steps aside);
- the check's report is logged once that handler exists (``on_init_end``, after ``LogCallback`` was
  built and before step 1), and the closing summary after the run, through ``llamafactory.rocm``. The
  report holds the check's forecast block, as ``check --forecast`` prints it (the hook asks for the forecast:
  train/hook.py ``prepare``), and the summary the forecast beside what the run measured (train/summary.py), so
  the page's Train tab shows both.

In the page's own process (the webui entry's hooks in lf/commands.py REGISTRY):

- the Train tab's final box is built from the running log as it is once the run has ended. LLaMA-Factory's
  ``Runner.monitor`` reads ``running_log.txt``, then waits up to 2 s for the process
  (``communicate(timeout=2)``), and on its exit shows "Finished." above the log of that last read, so
  whatever the run logged in its last seconds (the closing summary, logged after ``run_exp`` returns,
  lands about 1.8 s before the process ends on the 2-core build machine) was missing from the page on
  some runs. ``monitor`` is wrapped to read the log once more for that final box.
- the Export tab's merge and the Chat tab's load run ``export_model`` and ``ChatModel.__init__`` in the
  page's process (webui/components/export.py ``save_model``, webui/chatter.py ``WebChatModel.load_model``),
  not in a child, so no running log: the lines the hook says (``log_lines``) are collected while they run
  and put in the tab's box below LLaMA-Factory's own message; a refusal (``CheckRefused``) shows its
  lines there instead of gradio's bare "Error".
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
from collections.abc import Callable, Generator, Iterable
from typing import Any

BOARD_ENV = "LLAMABOARD_ENABLED"
LOGGER = "llamafactory.rocm"  # a child of LLaMA-Factory's root logger: its handlers see our records
# The lines said while one of the page's own handlers runs (export, chat load), for its box.
_PAGE_LINES: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("llamafactory_rocm_page", default=None)


def under_llamaboard() -> bool:
    """LLaMA-Factory's own reading of the variable (extras/misc.py ``is_env_enabled``)."""
    if BOARD_ENV not in os.environ:  # the common case, without importing LLaMA-Factory for it
        return False
    from ..lf.library import is_env_enabled

    return is_env_enabled(BOARD_ENV)


def log_lines(lines: Iterable[str]) -> None:
    """Each line through LLaMA-Factory's logger (so into running_log.txt), when LlamaBoard runs; into the
    box of the page's tab whose handler is running (``page_handler``), when it runs in the page itself."""
    lines = [line for line in lines if line.strip()]
    collected = _PAGE_LINES.get()
    if collected is not None:
        collected.extend(lines)
    if not under_llamaboard():
        return
    logger = logging.getLogger(LOGGER)
    logger.setLevel(logging.INFO)
    for line in lines:
        logger.info(line)


def board_callback(lines: list[str]) -> Any:
    """A trainer callback that logs ``lines`` once the trainer exists (LogCallback's handler is attached)."""
    from transformers import TrainerCallback

    class BoardReport(TrainerCallback):
        def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.is_world_process_zero:
                log_lines(lines)

    return BoardReport()


# ------------------------------------------------------------------------------------------- the page


def _marked(function: Callable[..., Any]) -> Callable[..., Any]:
    function.__llamafactory_rocm__ = True  # type: ignore[attr-defined]
    return function


def _box(lines: list[str]) -> Any:
    """The tab's box (a one-row gr.Textbox in LLaMA-Factory's page) tall enough for ``lines``."""
    import gradio as gr

    rows = sum(1 + len(line) // 160 for line in lines)  # a long line wraps in a full-width box
    return gr.Textbox(value="\n".join(lines), lines=min(rows, 30), max_lines=30)


def page_handler(
    original: Callable[..., Generator[str, None, None]], command: str = "webui"
) -> Callable[..., Generator[str, None, None]]:
    """A tab's generator handler (its yields fill the tab's box) with the hook's lines below each message,
    and a refusal's lines in the box instead of an exception."""
    from ..errors import CheckRefused

    @functools.wraps(original)
    def handler(*args: Any, **kwargs: Any) -> Generator[Any, None, None]:
        said: list[str] = []
        steps = original(*args, **kwargs)
        while True:
            refusal = None
            token = _PAGE_LINES.set(said)  # set and reset within one step: gradio runs each in its own context
            try:
                message = next(steps)
            except StopIteration:
                return
            except CheckRefused as refused:
                lines = str(refused).splitlines()
                refusal = [line for line in lines if "[error]" in line] or lines
            finally:
                _PAGE_LINES.reset(token)
            if refusal is not None:  # the one-line reasons, each with its fix, and nothing run
                yield _box(refusal)
                return
            yield _box([message, *said]) if said else message

    return _marked(handler)


def final_log_reread(
    monitor: Callable[[Any], Generator[dict, None, None]], command: str = "webui"
) -> Callable[[Any], Generator[dict, None, None]]:
    """``Runner.monitor`` whose last box ("Finished." above the log) holds the log as it is after the run."""
    from ..lf.library import webui_save_dir, webui_trainer_info

    @functools.wraps(monitor)
    def wrapped(self: Any) -> Generator[dict, None, None]:
        def get(elem_id: str) -> Any:  # as monitor reads its inputs
            return self.running_data[self.manager.get_elem_by_id(elem_id)]

        tab = "train" if self.do_train else "eval"
        lang, do_train = get("top.lang"), self.do_train
        output_path = webui_save_dir(get("top.model_name"), get("top.finetuning_type"), get(f"{tab}.output_dir"))
        box = self.manager.get_elem_by_id(f"{tab}.output_box")
        shown = None  # the running log of monitor's last read
        for update in monitor(self):
            value = update.get(box)
            if isinstance(value, str) and not self.running and shown is not None and value.endswith("\n\n" + shown):
                fresh = webui_trainer_info(lang, output_path, do_train)[0]  # the process has ended: all it wrote
                update = {**update, box: value[: len(value) - len(shown)] + fresh}
            elif isinstance(value, str) and self.running:
                shown = value
            yield update

    return _marked(wrapped)
