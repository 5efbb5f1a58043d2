"""atomic_write_json writes large values a slice at a time: the file must hold exactly what
json.dumps gives, for long lists, lists of dicts, non-ASCII text and non-list sequences."""

from __future__ import annotations

import json
import tempfile
import unittest
from collections.abc import Sequence
from pathlib import Path

from simpletuner.common.atomic import LONG_LIST, atomic_write_json


class Column(Sequence):
    """A sequence that is not a list, whose slices are lists (as an Arrow column view's are)."""

    def __init__(self, values):
        self.values = values

    def __len__(self):
        return len(self.values)

    def __getitem__(self, item):
        return list(self.values[item]) if isinstance(item, slice) else self.values[item]


class StreamedJsonTest(unittest.TestCase):
    def written(self, value) -> str:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "cache.json"
            atomic_write_json(path, value)
            return path.read_text(encoding="utf-8")

    def test_the_file_is_what_json_dumps_gives(self):
        long = LONG_LIST * 2 + 17
        value = {
            "zeta": list(range(long)),
            "alpha": {"ids": [f"ünï/{i} .png" for i in range(long)], "errors": {"b": 1, "a": 2}},
            "rows": [{"y": i, "x": [i, None]} for i in range(long)],
            "short": [1.5, True, None, "ß"],
            "empty": [],
            "numbered": {7: "non-text keys", 3: "are json.dumps' to sort"},
        }
        expected = json.dumps(value, sort_keys=True, ensure_ascii=False)
        self.assertEqual(self.written(value), expected + "\n")
        self.assertEqual(self.written([value]), "[" + expected + "]\n")

    def test_a_sequence_that_is_not_a_list_is_written_as_one(self):
        for length in (0, 3, LONG_LIST + 1):
            texts = [None if i % 3 else f"caption {i}" for i in range(length)]
            with self.subTest(length=length):
                self.assertEqual(json.loads(self.written({"texts": Column(texts)})),
                                 {"texts": texts})


if __name__ == "__main__":
    unittest.main()
