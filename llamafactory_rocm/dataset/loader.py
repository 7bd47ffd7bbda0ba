"""The loader's verdict on local data files, from the loader itself.

``stream_tables`` runs the packaged ``json`` builder of the installed ``datasets`` (its
``_generate_tables``, the code ``load_dataset("json")`` runs) and hands each table to datasets' own
``ArrowWriter``, as ``_prepare_split_single`` does, but into a sink that keeps nothing: the same
type inference, batches and casts, with bounded memory and no Arrow cache. A folder loaded with
``preprocessing_num_workers`` is split into datasets' own jobs (``_split_gen_kwargs``); when more than
one job's output has to be merged, the real ``load_dataset`` runs once in a throw-away cache to say
whether the merge holds. A failure names the file and line: the failing batch's byte offset, replayed
the way the builder reads the file, plus the row pyarrow names.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..lf.patching import Patches, progress_bars_off

PROGRESS_MIN_BYTES = 50 << 20


class LoadError(Exception):
    """The loader stops on this data: ``file``, ``line`` (None: not known) and its message."""

    def __init__(self, file: Path | None, line: int | None, message: str) -> None:
        self.file, self.line, self.message = file, line, message
        where = f"{file}:{line}" if file and line else str(file) if file else "the data"
        super().__init__(f"{where}: {message}")


@dataclass
class Batch:
    """One table as the builder yields it, with where its rows lie in the file."""

    file: Path
    table: Any  # pyarrow.Table
    offset: int | None  # byte offset of a JSON-lines batch; None: the whole file (a JSON array, pandas)

    def row_lines(self) -> list[int]:
        """The line each row starts on (read again only when a row has to be named)."""
        return _lines_of_rows(self.file, self.offset, self.table.num_rows)


def loader_jobs(files: list[Path], num_proc: int | None, cache_dir: str) -> tuple[Any, list[dict[str, Any]]]:
    """The json builder and the gen_kwargs of each process, as ``load_dataset(num_proc=...)`` splits them."""
    from datasets.builder import _number_of_shards_in_gen_kwargs, _split_gen_kwargs

    import datasets

    builder = datasets.load_dataset_builder("json", data_files=[str(f) for f in files], cache_dir=cache_dir)
    manager = datasets.DownloadManager(  # no checksums: load_dataset records none either (hashing every byte)
        dataset_name="json", download_config=datasets.DownloadConfig(cache_dir=cache_dir), record_checksums=False
    )
    gen_kwargs = builder._split_generators(manager)[0].gen_kwargs
    shards = _number_of_shards_in_gen_kwargs(gen_kwargs)
    jobs = min(num_proc or 1, shards) if shards > 1 else 1  # as ArrowBasedBuilder._prepare_split caps it
    return builder, _split_gen_kwargs(gen_kwargs, max_num_jobs=jobs) if jobs > 1 else [gen_kwargs]


def stream_tables(files: list[Path], num_proc: int | None = None, progress: bool | None = None) -> Iterator[Batch]:
    """Every table the loader builds from ``files``, in load order; ``LoadError`` where it would stop."""
    from datasets.arrow_writer import ArrowWriter, SchemaInferenceError

    with tempfile.TemporaryDirectory(prefix="lfr-load-") as cache, _quiet_datasets():
        builder, jobs = loader_jobs(files, num_proc, cache)
        chunk = builder.config.chunksize
        bar = _Progress(files, progress)
        rows = 0
        try:
            for gen_kwargs in jobs:
                job_files = [Path(p) for it in gen_kwargs["files"] for p in it]
                writer = ArrowWriter(features=builder.info.features, stream=_null_stream())
                cursor = _Cursor(gen_kwargs, chunk)
                try:
                    for key, table in builder._generate_tables(**cursor.gen_kwargs):
                        batch = cursor.advance(key, table)
                        _write(writer, batch)
                        bar.update(batch)
                        rows += batch.table.num_rows
                        yield batch
                    writer.finalize()
                except SchemaInferenceError:  # no table at all: the job's files are empty
                    names = ", ".join(f.name for f in job_files)
                    raise LoadError(job_files[0], None, f"no rows in {names}: the loader stops here") from None
                except LoadError:
                    raise
                except Exception as err:  # pyarrow, pandas and datasets raise many kinds
                    raise cursor.locate(err) from None
                finally:
                    cursor._close()
            if len(jobs) > 1 or not rows:  # merged, or read back with no rows: datasets' own reader decides
                _merge(files, len(jobs), cache)
        finally:
            bar.bar.close()


def _write(writer: Any, batch: Batch) -> None:
    from datasets.table import CastError

    try:
        writer.write_table(batch.table)
    except CastError as err:  # a later batch whose types do not cast to the first batch's
        raise LoadError(batch.file, _first_row_not_casting(batch, writer), _one_line(err)) from None


def _null_stream() -> Any:
    import pyarrow as pa

    return pa.MockOutputStream()  # counts the bytes, keeps none


def _merge(files: list[Path], jobs: int, cache: str) -> None:
    """The jobs' outputs merged by datasets itself (Arrow files in the throw-away cache)."""
    import datasets

    try:
        with _quiet_datasets():
            datasets.load_dataset(
                "json", data_files=[str(f) for f in files], num_proc=jobs, cache_dir=cache, split="train"
            )
    except Exception as err:
        where = f"the files load in {jobs} processes and their tables do not merge: " if jobs > 1 else ""
        raise LoadError(files[0] if len(files) == 1 else files[0].parent, None, where + _one_line(err)) from None


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """datasets' own error log and progress bars stay off: the one line we print says it."""
    import datasets

    with Patches() as patches:
        patches.callback(datasets.logging.set_verbosity, datasets.logging.get_verbosity())
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)
        progress_bars_off(patches)
        yield


class _Cursor:
    """Where the builder is: the file it reads (its file lists are wrapped to tell) and the byte
    offset of the JSON-lines batch it parses next."""

    def __init__(self, gen_kwargs: dict[str, Any], chunk: int) -> None:
        self.chunk = chunk
        self.current: Path | None = None  # the file the builder has opened
        self.file: Path | None = None  # the file of the last table, and the offset after it
        self.offset, self.handle = 0, None
        self.gen_kwargs = {**gen_kwargs, "files": [self._track(it) for it in gen_kwargs["files"]]}

    def _track(self, files: Any) -> Iterator[str]:
        for name in files:
            self.current = Path(name)
            yield name

    def advance(self, key: Any, table: Any) -> Batch:
        assert self.current is not None
        if self.current != self.file:
            self._close()
            self.file, self.offset = self.current, 0
            self.handle = open(self.current, "rb")  # noqa: SIM115 - closed on the next file or the end
        if not isinstance(key, tuple):  # pandas read the whole file (a JSON array)
            return Batch(self.current, table, None)
        start = self.offset
        self.offset = _next_offset(self.handle, self.chunk)
        return Batch(self.current, table, start)

    def _close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None

    def locate(self, err: Exception) -> LoadError:
        """The file and line the error came from: the batch after the last one yielded."""
        self._close()
        file = self.current or Path("?")
        offset = self.offset if file == self.file else 0
        return LoadError(file, _line_of_error(file, offset, self.chunk, err), _one_line(err))


def _next_offset(handle: Any, chunk: int) -> int:
    """Read one batch as the builder does (chunksize bytes, then the rest of the line)."""
    data = handle.read(chunk)
    if data:
        handle.readline()
    return handle.tell()


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    cause = err.__cause__ or err.__context__
    if isinstance(err, ValueError) and "Failed to convert pandas" in text and cause is not None:
        text += f" ({' '.join(str(cause).split())})"
    return f"{type(err).__name__}: {text}" if len(text) < 400 else f"{type(err).__name__}: {text[:400]}..."


def _line_of_error(file: Path, offset: int, chunk: int, err: Exception) -> int | None:
    """Parse the failing batch again, as the builder did, to learn the row pyarrow stops at."""
    import pyarrow as pa
    import pyarrow.json as paj

    try:
        with open(file, "rb") as handle:
            handle.seek(offset)
            data = handle.read(chunk) + handle.readline()
        if data.lstrip()[:1] == b"[":  # a JSON array: Python's parser names the line
            return _json_error_line(file)
        paj.read_json(io.BytesIO(data), read_options=paj.ReadOptions(block_size=max(len(data), 1)))
    except pa.ArrowInvalid as arrow_err:
        row = _row_number(str(arrow_err))
        return None if row is None else _nth_row_line(data, row, _line_at(file, offset))
    except OSError:
        return None
    return None


def _row_number(message: str) -> int | None:
    _, sep, tail = message.rpartition(" in row ")
    return int(tail.strip(". ")) if sep and tail.strip(". ").isdigit() else None


def _json_error_line(file: Path) -> int | None:
    try:
        json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        return err.lineno
    except (UnicodeDecodeError, RecursionError, ValueError):
        return None
    return None


def _line_at(file: Path, offset: int) -> int:
    """The line number at a byte offset (counted a megabyte at a time: memory stays flat)."""
    lines, left = 1, offset
    with open(file, "rb") as handle:
        while left > 0:
            piece = handle.read(min(left, 1 << 20))
            if not piece:
                break
            lines, left = lines + piece.count(b"\n"), left - len(piece)
    return lines


def _nth_row_line(data: bytes, row: int, first_line: int) -> int:
    """The line of the row-th non-blank line of a batch (pyarrow skips blank lines)."""
    seen = -1
    for number, text in enumerate(data.split(b"\n")):
        if text.strip():
            seen += 1
            if seen == row:
                return first_line + number
    return first_line + data.count(b"\n")


def _lines_of_rows(file: Path, offset: int | None, count: int) -> list[int]:
    if offset is None:
        return _array_element_lines(file)[:count]
    with open(file, "rb") as handle:
        handle.seek(offset)
        lines = []
        number = _line_at(file, offset)
        while len(lines) < count:
            text = handle.readline()
            if not text:
                break
            if text.strip():
                lines.append(number)
            number += 1
    return lines


def _array_element_lines(file: Path) -> list[int]:
    """The line each element of a JSON array starts on (a JSON array is read whole by the loader too)."""
    text = file.read_text(encoding="utf-8")
    decoder, pos, lines = json.JSONDecoder(), text.find("[") + 1, []
    while 0 < pos < len(text):
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            break
        lines.append(text.count("\n", 0, pos) + 1)
        _, pos = decoder.raw_decode(text, pos)
    return lines


def _first_row_not_casting(batch: Batch, writer: Any) -> int | None:
    """Halve the batch until the first row that does not cast to the writer's schema is found."""
    from datasets.table import table_cast

    def casts(table: Any) -> bool:
        try:
            table_cast(table, writer._schema)
        except Exception:
            return False
        return True

    table = batch.table
    if table.num_rows == 0 or casts(table):
        return None
    if not casts(table.slice(0, 0)):  # the columns differ: name the first row with a column the first batch lacks
        return _first_row_with(batch, [c for c in table.column_names if c not in writer._schema.names])
    low, high = 0, table.num_rows  # rows [0, low) cast; [0, high) does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if casts(table.slice(0, middle)) else (low, middle)
    return batch.row_lines()[low] if low < table.num_rows else None


def _first_row_with(batch: Batch, columns: list[str]) -> int | None:
    import pyarrow.compute as pc

    rows = [pc.index(pc.is_valid(batch.table[c]), True).as_py() for c in columns]
    found = [r for r in rows if r is not None and r >= 0]
    lines = batch.row_lines()
    return lines[min(found)] if found else (lines[0] if lines else None)


class _Progress:
    """A byte bar on stderr for big files when stderr is a terminal (or when asked)."""

    def __init__(self, files: list[Path], wanted: bool | None) -> None:
        from tqdm import tqdm

        total = sum(f.stat().st_size for f in files if f.is_file())
        show = wanted if wanted is not None else (total >= PROGRESS_MIN_BYTES and sys.stderr.isatty())
        self.bar = tqdm(total=total, unit="B", unit_scale=True, desc="checking", file=sys.stderr, leave=False,
                        disable=not show)  # fmt: skip
        self._done: dict[Path, int] = {}

    def update(self, batch: Batch) -> None:
        size = batch.file.stat().st_size
        done = size if batch.offset is None else min(size, batch.offset + (10 << 20))
        self.bar.update(max(0, done - self._done.get(batch.file, 0)))
        self._done[batch.file] = done
