"""Reading a workspace file line by line, holding one line at a time.

The tools never read a whole file: a 126 MB log is streamed, and what is kept is only what
they return. A line is read up to `MAX_LINE_BYTES`; the rest of a longer line (minified code,
a data dump) is skipped in chunks and counted, never held. Lines end at b"\\n" (a trailing
"\\r" is dropped), so line numbers agree with grep and editors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Iterator

MAX_LINE_BYTES = 1 << 20
BINARY_SNIFF_BYTES = 8192
_SKIP_CHUNK_BYTES = 1 << 16


@dataclass(frozen=True, slots=True)
class Line:
    number: int
    text: str
    cut_bytes: int = 0  # bytes of the line past MAX_LINE_BYTES, not read into memory


def is_binary(file: BinaryIO) -> bool:
    """Whether the file's first bytes hold a NUL, as in git and grep. Leaves the file at its start."""
    head = file.read(BINARY_SNIFF_BYTES)
    file.seek(0)
    return b"\x00" in head


def text_lines(file: BinaryIO, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[Line]:
    number = 0
    while piece := file.readline(max_line_bytes):
        number += 1
        cut = 0 if piece.endswith(b"\n") else _skip_rest_of_line(file)
        yield Line(number, _decode(piece), cut)


def _skip_rest_of_line(file: BinaryIO) -> int:
    skipped = 0
    while piece := file.readline(_SKIP_CHUNK_BYTES):
        if piece.endswith(b"\n"):
            return skipped + len(piece) - 1
        skipped += len(piece)
    return skipped


def _decode(piece: bytes) -> str:
    return piece.removesuffix(b"\n").removesuffix(b"\r").decode("utf-8", errors="replace")
