"""A table naming mostly absent files (issue 42): its skips are columns from the table to the
index cache, plan's summary and skipped_files.json; what they hold is what the lists of
SkippedFile held. The scale (10 M rows) is benchmarks/bench_parquet.py --plan-absent's."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

import pyarrow
import pyarrow.parquet

from discovery_fixtures import training_config
from simpletuner.configuration import DatasetConfig
from simpletuner.helpers.metadata.backends.base import MetadataBackend
from simpletuner.helpers.metadata.backends.table import TableSource
from simpletuner.helpers.metadata.index_cache import DIGEST_KEY, load_cache
from simpletuner.helpers.metadata.index_file import read_columns, write_columns
from simpletuner.helpers.metadata.index_history import data_digest
from simpletuner.helpers.metadata.skipped import SkippedFile, SkippedFiles
from simpletuner.helpers.metadata.startup import report_skipped_files
from simpletuner.plan_report import skip_summary
from test_parquet import ListedOnly

ROWS = 3000
PRESENT = [f"img_{i:05d}.png" for i in range(0, ROWS, 100)]  # 30 files there, 2970 absent


class AbsentRowsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.tmp = Path(cls._tmp.name)
        names = [f"img_{i:05d}.png" for i in range(ROWS)][::-1]  # not the listing's order
        names += ["../outside.png", None, PRESENT[0], "caf\u00e9 \u00fc.png"]
        table = cls.tmp / "table.parquet"
        pyarrow.parquet.write_table(pyarrow.table({
            "filename": names, "width": [64] * len(names), "height": [64] * len(names)}), table)
        cls.absent = f"{table}: no such image in {ListedOnly.location}"
        cls.backends = [cls.backend(table) for _ in range(2)]
        cls.index = cls.backends[0].refresh_index(show_progress=False)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    @classmethod
    def backend(cls, table: Path) -> MetadataBackend:
        dataset = DatasetConfig(id="absent", instance_data_dir="/unused",
                                metadata_backend="parquet", parquet={"path": str(table)},
                                caption_strategy="filename")
        storage = ListedOnly(PRESENT)
        return MetadataBackend(dataset, training_config(cls.tmp / "out"), storage,
                               cls.tmp / "cache", TableSource(storage, dataset))

    def test_each_skip_is_named_once_in_path_order_and_counted_by_reason(self):
        skipped = list(self.index.skipped)
        self.assertEqual(skipped, sorted(skipped, key=lambda s: (s.path, s.reason)))
        by_reason = {}
        for skip in skipped:
            by_reason.setdefault(skip.reason, []).append(skip.path)
        self.assertEqual(sorted(by_reason[self.absent]),
                         sorted({f"img_{i:05d}.png" for i in range(ROWS)} - set(PRESENT)
                                | {"caf\u00e9 \u00fc.png"}))
        others = {path: reason for reason, paths in by_reason.items() if reason != self.absent
                  for path in paths}
        self.assertIn("reaches outside", others["../outside.png"])
        self.assertIn("is empty, missing or not text", others[f"<row {ROWS + 1}>"])
        self.assertIn(f"row {ROWS + 2}: a second row for this file", others[PRESENT[0]])
        self.assertEqual(len(others), 3)
        self.assertEqual(self.index.sample_count, len(PRESENT))
        self.assertEqual(self.index.skipped.counts(),
                         {reason: len(paths) for reason, paths in by_reason.items()})
        # plan: a line per reason, however many rows give it
        summary = skip_summary(self.index).splitlines()
        self.assertEqual(summary[:2], [f"skipped: {ROWS - len(PRESENT) + 4}",
                                       f"  {ROWS - len(PRESENT) + 1:>6}  {self.absent}"])
        self.assertEqual(len(summary), 1 + len(by_reason))

    def test_the_cache_holds_them_as_columns_and_every_rank_reads_the_same(self):
        path = self.backends[0].cache_path
        meta, columns = read_columns(path)
        self.assertNotIn("skipped", meta)
        self.assertEqual(sorted(meta["skipped_reasons"]), sorted(self.index.skipped.counts()))
        self.assertEqual(len(columns["skipped_codes"]), len(self.index.skipped))
        self.assertEqual(list(self.backends[1].load_index().skipped), list(self.index.skipped))
        # the data digest is the one the [path, reason] pairs of earlier versions gave
        pairs = [[s.path, s.reason] for s in self.index.skipped]
        loaded = load_cache(path)
        self.assertEqual(data_digest(loaded.columns, loaded.file_table(),
                                     loaded.change_view()["index"]["buckets"], pairs),
                         meta[DIGEST_KEY])

    def test_a_cache_of_the_earlier_version_with_pairs_in_its_header_still_reads(self):
        meta, columns = read_columns(self.backends[0].cache_path)
        pairs = [["gone \udce9.png", "no such image"], ["../x.png", "outside"]]
        older = {key: value for key, value in meta.items() if key != "skipped_reasons"}
        kept = {name: values for name, values in columns.items()
                if not name.startswith("skipped_")}
        write_columns(self.tmp / "older.index", {**older, "version": 3, "skipped": pairs}, kept)
        self.assertEqual(list(load_cache(self.tmp / "older.index").skipped),
                         [SkippedFile(*pair) for pair in pairs])

    def test_skipped_files_json_lists_every_one(self):
        written = report_skipped_files({"absent": self.index}, self.tmp / "report")
        listed = json.loads(written.read_text("utf-8"))
        self.assertEqual(listed, {"absent": [{"path": s.path, "reason": s.reason}
                                             for s in self.index.skipped]})


class SortedAsAListTest(unittest.TestCase):
    def test_sorted_by_bytes_is_the_order_a_list_of_them_sorts_in(self):
        """The index's skips (and so the data digest) keep the order sorting SkippedFile gave:
        by path in code points (lone surrogates of non-UTF-8 names, characters beyond U+FFFF),
        then by reason."""
        paths = ["b", "a", "caf\udce9.png", "caf\u00e9.png", "\U0001f600.png", "\uffff.png",
                 "\ue000.png", "a", "", "A"]
        skips = [SkippedFile(path, reason) for path, reason in
                 zip(paths, ["z", "y", "x", "x", "w", "w", "w", "b", "c", "c"])]
        self.assertEqual(list(SkippedFiles.of(skips).sorted()),
                         sorted(skips, key=lambda s: (s.path, s.reason)))


if __name__ == "__main__":
    unittest.main()
