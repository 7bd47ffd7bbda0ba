"""LLaMA-Factory's verdict on each row: its own converter and its own drop rule, no tokenizer.

Each loaded row goes through the converter class LLaMA-Factory picks for the entry
(``llamafactory.data.converter``), then through the ``preprocess_dataset`` of the processor the stage
uses, whose ``_encode_data_example`` (the only part that needs a tokenizer) is replaced by a probe that
says "kept". What LLaMA-Factory logs for a row ("Invalid role tag", "Dropped invalid example") is
captured and becomes the row's reason, so the verdict and the words follow the installed release.
"""

from __future__ import annotations

import gc
import logging
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..lf.patching import Patches
from .tags import needed_tags

DEFAULT_MAX_ROWS_SHOWN = 20
PROBE_ROWS = 256  # rows per call of the processor: few enough that the garbage collector stays cheap


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
    with Patches() as patches:
        patches.setattr(root, "handlers", [capture])
        patches.setattr(root, "propagate", False)
        patches.callback(root.setLevel, root.level)
        root.setLevel(logging.WARNING)
        yield capture


@contextmanager
def _no_gc() -> Iterator[None]:
    """No cyclic garbage collection while rows are converted: the rows make no cycles, and with a batch
    of them alive every collection walks them all (measured: a third of the check's time)."""
    with Patches() as patches:
        if gc.isenabled():
            gc.disable()
            patches.callback(gc.enable)
        yield


def _processor_class(stage: str, data_args: Any) -> type | None:
    """The processor LLaMA-Factory's own ``_get_dataset_processor`` picks for this data stage and these
    data arguments (packing, neat_packing); None where it has no per-row drop rule (pre-training)."""
    from ..lf.library import dataset_processor

    chosen = type(dataset_processor(data_args, stage))
    return chosen if hasattr(chosen, "_encode_data_example") else None


def _probe(cls: type, data_args: Any) -> Any:
    """The stage's processor whose ``_encode_data_example`` (the tokenizer's part) only notes the rows
    it is given, returning as many empty values as LLaMA-Factory's own signature declares."""
    arity = len(typing.get_args(cls._encode_data_example.__annotations__["return"]))  # tuple[list[int], ...]

    def encode(self: Any, prompt: Any, **kwargs: Any) -> tuple[Any, ...]:
        self.encoded.add(id(prompt))
        return ([],) * arity

    probe = type("Probe", (cls,), {"_encode_data_example": encode})
    return probe(template=None, tokenizer=None, processor=None, data_args=data_args)


class RowChecker:
    """Runs one dataset's rows through LLaMA-Factory's converter, then its drop rule a few rows at a time."""

    def __init__(self, dataset_attr: Any, data_args: Any, stage: str = "sft", limit: int = DEFAULT_MAX_ROWS_SHOWN):
        from ..lf.library import dataset_converter

        self.converter = dataset_converter(dataset_attr.formatting, dataset_attr, data_args)
        cls = _processor_class(stage, data_args)
        self.probe = _probe(cls, data_args) if cls is not None else None
        self.count_empty = not dataset_attr.kto_tag  # a KTO row carries an empty response by design
        self.attr = dataset_attr
        self.tally = RowTally(limit=limit)

    def check(self, table: Any, lines: Callable[[], list[int]], file: str | None = None) -> None:
        """The rows of a pyarrow table, as datasets hands them to the converter. ``lines``: gives each
        row's line, called only when a row has to be named."""
        self.tally.rows += table.num_rows
        named = _Namer(lines, file, self.tally.limit)
        with _captured_llamafactory_log() as log, _no_gc():
            rows = table.to_pylist()
            for start in range(0, len(rows), PROBE_ROWS):
                self._check_some(rows, start, named, log.messages)

    def _check_some(self, rows: list[dict[str, Any]], start: int, named: _Namer, log: list[str]) -> None:
        tally, converter = self.tally, self.converter
        converted: list[tuple[int, dict[str, Any]]] = []
        warned: dict[int, str] = {}  # row -> the converter's first warning for it
        for index in range(start, min(start + PROBE_ROWS, len(rows))):
            seen = len(log)
            try:
                converted.append((index, converter(rows[index])))
            except Exception as err:  # KeyError for a missing column, TypeError for a bad shape, ...
                tally.failed += 1
                tags = needed_tags(rows[index], self.attr) if isinstance(err, KeyError) else None
                named.add(tally.failed_rows, index, _converter_error(err) + (f"; {tags}" if tags else ""))
                continue
            if len(log) > seen:
                warned[index] = log[seen]
        seen = len(log)
        encoded = self._encoded([out for _, out in converted])
        dropping = iter(log[seen:])  # the processor's warning for each row it drops, in order
        for index, out in converted:
            if encoded is None or id(out["_prompt"]) in encoded:
                if self.count_empty and any(m["content"] == "" for m in out["_response"]):
                    tally.empty_responses += 1
                continue
            reason = _reason(warned.get(index) or next(dropping, ""))
            tags = needed_tags(rows[index], self.attr) if reason.startswith("Invalid role tag") else None
            reason += f"; {tags}" if tags else ""  # the one line of the entry that reads the row's roles
            tally.dropped += 1
            tally.reasons[reason] = tally.reasons.get(reason, 0) + 1
            named.add(tally.dropped_rows, index, f"LLaMA-Factory drops it: {reason}")
        log.clear()

    def _encoded(self, converted: list[dict[str, Any]]) -> set[int] | None:
        """The ids of the prompts the processor would tokenize; None when it keeps every row."""
        if self.probe is None or not converted:
            return None
        self.probe.encoded = set()
        self.probe.preprocess_dataset({key: [out[key] for out in converted] for key in converted[0]})
        return self.probe.encoded


class _Namer:
    """Adds a row (with its file and line) to a list of the first ``limit``; reads the lines once, if ever."""

    def __init__(self, lines: Callable[[], list[int]], file: str | None, limit: int) -> None:
        self.lines, self.file, self.limit = lines, file, limit
        self.known: list[int] | None = None

    def add(self, found: list[RowIssue], index: int, reason: str) -> None:
        if len(found) < self.limit:
            self.known = self.known if self.known is not None else self.lines()
            found.append(RowIssue(_at(self.known, index), reason, self.file))


def _at(lines: list[int], index: int) -> int | None:
    return lines[index] if index < len(lines) else None


def _reason(message: str) -> str:
    """LLaMA-Factory's warning for the row, without the row it prints after it."""
    return message.split(" in [", 1)[0].split(": [", 1)[0].split(": {", 1)[0].rstrip(".") or "no warning"


def _converter_error(err: Exception) -> str:
    if isinstance(err, KeyError):
        return f"LLaMA-Factory's converter stops with KeyError: {err} (the row has no such column or tag)"
    text = " ".join(str(err).split())[:200]
    return f"LLaMA-Factory's converter stops with {type(err).__name__}: {text}"
