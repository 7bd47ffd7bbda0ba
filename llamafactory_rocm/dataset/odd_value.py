"""The row whose value stops datasets' JSON reader: a text column with a number in one row.

pyarrow builds a column from the rows' values and stops at the first that is not text ("ArrowTypeError:
Expected bytes, got a 'int' object ... Conversion failed for column output with type object"), naming the
column, never the row. LLaMA-Factory's loader (datasets' json builder) stops on the same file with the same
words. The row is found here by reading the file again, so the fix can name its line and the text to write.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_WORDS = re.compile(r"Expected bytes, got an? '(?P<type>\w+)' object.*Conversion failed for column (?P<column>\S+)")
_LARGEST = 256 * 1024 * 1024  # bytes read again to name the row; past it the column is named alone


@dataclass(frozen=True)
class OddValue:
    row: int  # 1-based, in the file
    line: int
    column: str
    value: Any

    def said(self) -> str:
        kind = type(self.value).__name__
        article = "an" if kind[0] in "aeiou" else "a"
        return (
            f"row {self.row} (line {self.line}) holds {self.column}: {json.dumps(self.value)}, {article} {kind} "
            f'where the column holds text: write it as "{self.column}": {json.dumps(str(self.value))}'
        )


def odd_value(message: str, file: Path | None) -> OddValue | None:
    """The first row of ``file`` whose value in the column pyarrow's ``message`` names has the type it names."""
    match = _WORDS.search(message)
    if match is None or file is None or not file.is_file() or file.stat().st_size > _LARGEST:
        return None
    column = match["column"].strip("'\"")
    for index, line, row in _rows(file):
        value = row.get(column) if isinstance(row, dict) else None
        if value is not None and type(value).__name__ == match["type"]:
            return OddValue(index + 1, line, column, value)
    return None


def _rows(file: Path) -> Iterator[tuple[int, int, Any]]:
    """(index, line, row) of a JSON-lines file or a JSON array, as the rows lie in the file."""
    text = file.read_text(encoding="utf-8", errors="replace")
    start = text.lstrip()
    if not start.startswith("["):  # JSON lines
        index = 0
        for number, raw in enumerate(text.splitlines(), 1):
            if raw.strip():
                try:
                    yield index, number, json.loads(raw)
                except ValueError:
                    return
                index += 1
        return
    decoder, position, index = json.JSONDecoder(), text.index("[") + 1, 0
    line, counted = 1, 0
    while True:
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        if position >= len(text) or text[position] == "]":
            return
        try:
            row, end = decoder.raw_decode(text, position)
        except ValueError:
            return
        line += text.count("\n", counted, position)
        counted = position
        yield index, line, row
        position, index = end, index + 1
