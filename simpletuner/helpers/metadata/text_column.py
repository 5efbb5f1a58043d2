"""Texts one after the other in one blob (any character, Arrow's layout): a table's captions in
the index cache (index_columns.py), the paths of skipped files (skipped.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ENCODING = ("utf-8", "surrogatepass")  # any str, lone surrogates too, round-trips exactly


class TextColumn:
    """Texts one after the other in one blob, any character allowed (Arrow's layout: a table's
    captions are taken as they are), and the offsets of their starts and of the blob's end."""

    def __init__(self, blob: np.ndarray, starts: np.ndarray):
        self.blob, self.starts = blob, starts

    @classmethod
    def encode(cls, texts: Sequence[str]) -> "TextColumn":
        encoded = [text.encode(*ENCODING) for text in texts]
        lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
        return cls(np.frombuffer(b"".join(encoded), np.uint8),
                   np.concatenate(([0], np.cumsum(lengths))).astype(np.int64))

    def __len__(self) -> int:
        return len(self.starts) - 1

    def at(self, row: int) -> str:
        return self.blob[self.starts[row]:self.starts[row + 1]].tobytes().decode(*ENCODING)

    @classmethod
    def from_arrow(cls, texts) -> "TextColumn":
        """Arrow strings or binaries (a chunked array too), their buffers as they are: no str
        per text."""
        import pyarrow

        array = texts.cast(pyarrow.large_binary())
        if isinstance(array, pyarrow.ChunkedArray):
            array = array.combine_chunks()
        _, offsets, data = array.buffers()
        if offsets is None:  # an empty array may have none
            return cls(np.zeros(0, np.uint8), np.zeros(1, np.int64))
        offsets = np.frombuffer(offsets, np.int64)[array.offset:array.offset + len(array) + 1]
        blob = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
        return cls(blob[offsets[0]:offsets[-1]], offsets - offsets[0] if offsets[0] else offsets)
