"""LLaMA-Factory's verdict on each row: its own converter and its own drop rule, no tokenizer.

Each loaded row goes through the converter class LLaMA-Factory picks for the entry
(``llamafactory.data.converter``), then through the ``preprocess_dataset`` of the processor the stage
uses, whose ``_encode_data_example`` (the only part that needs a tokenizer) is replaced by a probe that
says "kept". What LLaMA-Factory logs for a row ("Invalid role tag", "Dropped invalid example") is
captured and becomes the row's reason, so the verdict and the words follow the installed release.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_ROWS_SHOWN = 20


@dataclass
class RowIssue:
    line: int | None
    reason: str
    file: str | None = None

    def text(self) -> str:
        where = f"{self.file}:{self.line}" if self.file else f"line {self.line}"
        return f"{where}: {self.reason}"


@dataclass
class RowTally:
    """Counts over every row, and the first ``limit`` rows of each kind with their lines."""

    limit: int = DEFAULT_MAX_ROWS_SHOWN
    rows: int = 0
    dropped: int = 0
    empty_responses: int = 0
    failed: int = 0  # rows the converter raised on: LLaMA-Factory stops there
    dropped_rows: list[RowIssue] = field(default_factory=list)
    failed_rows: list[RowIssue] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)  # LLaMA-Factory's words -> rows

    @property
    def kept(self) -> int:
        return self.rows - self.dropped - self.failed


class _Kept(Exception):
    """Raised by the probe: the processor accepted the row and would now tokenize it."""


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def _captured_llamafactory_log() -> Iterator[_Capture]:
    """LLaMA-Factory's warnings go to a list while rows are checked, not to the terminal."""
    root = logging.getLogger("llamafactory")
    capture = _Capture()
    saved = root.handlers[:], root.propagate, root.level
    root.handlers, root.propagate = [capture], False
    root.setLevel(logging.WARNING)
    try:
        yield capture
    finally:
        root.handlers, root.propagate = saved[0], saved[1]
        root.setLevel(saved[2])


def _processor_class(stage: str) -> type | None:
    """The processor ``_get_dataset_processor`` picks for a stage; None for pre-training (keeps all)."""
    from llamafactory.data import processor

    return {
        "sft": processor.SupervisedDatasetProcessor,
        "rm": processor.PairwiseDatasetProcessor,
        "kto": processor.FeedbackDatasetProcessor,
        "ppo": processor.UnsupervisedDatasetProcessor,
    }.get(stage)


class RowChecker:
    """Runs one dataset's rows through LLaMA-Factory's converter and drop rule."""

    def __init__(self, dataset_attr: Any, data_args: Any, stage: str = "sft", limit: int = DEFAULT_MAX_ROWS_SHOWN):
        from llamafactory.data.converter import get_dataset_converter

        self.converter = get_dataset_converter(dataset_attr.formatting, dataset_attr, data_args)
        cls = _processor_class(stage)
        self.probe = None
        if cls is not None:
            probe_cls = type("Probe", (cls,), {"_encode_data_example": _raise_kept})
            self.probe = probe_cls(template=None, tokenizer=None, processor=None, data_args=data_args)
        self.tally = RowTally(limit=limit)

    def check(self, rows: list[dict[str, Any]], lines: Any, file: str | None = None) -> None:
        """``lines``: a callable giving each row's line, called only when a row has to be named."""
        tally = self.tally
        line_of: list[int] | None = None
        with _captured_llamafactory_log() as log:
            for index, row in enumerate(rows):
                tally.rows += 1
                log.messages.clear()
                try:
                    converted = self.converter(row)
                except Exception as err:  # KeyError for a missing column, TypeError for a bad shape, ...
                    tally.failed += 1
                    if len(tally.failed_rows) < tally.limit:
                        line_of = line_of or lines()
                        tally.failed_rows.append(RowIssue(_at(line_of, index), _converter_error(err), file))
                    continue
                if self._dropped(converted):
                    tally.dropped += 1
                    reason = _reason(log.messages)
                    tally.reasons[reason] = tally.reasons.get(reason, 0) + 1
                    if len(tally.dropped_rows) < tally.limit:
                        line_of = line_of or lines()
                        tally.dropped_rows.append(
                            RowIssue(_at(line_of, index), f"LLaMA-Factory drops it: {reason}", file)
                        )
                elif any(m.get("content") == "" for m in converted["_response"]):
                    tally.empty_responses += 1

    def _dropped(self, converted: dict[str, Any]) -> bool:
        if self.probe is None:
            return False
        batch = {key: [value] for key, value in converted.items()}
        try:
            self.probe.preprocess_dataset(batch)
        except _Kept:
            return False
        return True


def _raise_kept(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise _Kept


def _at(lines: list[int], index: int) -> int | None:
    return lines[index] if index < len(lines) else None


def _reason(messages: list[str]) -> str:
    """LLaMA-Factory's first warning for the row, without the row it prints after it."""
    for message in messages:
        text = message.split(" in [", 1)[0].split(": [", 1)[0].split(": {", 1)[0].rstrip(".")
        if text:
            return text
    return "no warning"


def _converter_error(err: Exception) -> str:
    if isinstance(err, KeyError):
        return f"LLaMA-Factory's converter stops with KeyError: {err} (the row has no such column or tag)"
    text = " ".join(str(err).split())[:200]
    return f"LLaMA-Factory's converter stops with {type(err).__name__}: {text}"
