"""What a training run says about its data: every skipped file with its reason, in a JSON file
in output_dir, and the first ones in the log."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

from simpletuner.helpers.metadata.index import DatasetIndex, SkippedFile
from simpletuner.helpers.metadata.startup import report_skipped_files

LOGGER = "simpletuner.helpers.metadata.startup"


def index(dataset_id: str, skipped: list[SkippedFile]) -> DatasetIndex:
    return DatasetIndex(dataset_id, {"64x64": ["kept.png"]}, {"kept.png": (64, 64)}, skipped)


class SkippedFilesReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.output = Path(self.tmp.name) / "out"

    def tearDown(self):
        self.tmp.cleanup()

    def test_every_skipped_file_is_written_and_the_first_twenty_are_logged(self):
        many = [SkippedFile(f"bad/{i:02d}.png", "truncated or unreadable header")
                for i in range(25)]
        indexes = {"photos": index("photos", many),
                   "art": index("art", [SkippedFile("tiny.png", "smaller than minimum_image_size")])}
        with self.assertLogs(LOGGER, "WARNING") as logs:
            path = report_skipped_files(indexes, self.output)
        self.assertEqual(path, self.output / "skipped_files.json")
        written = json.loads(path.read_text())
        self.assertEqual(written["art"], [{"path": "tiny.png",
                                           "reason": "smaller than minimum_image_size"}])
        self.assertEqual([e["path"] for e in written["photos"]],
                         [f"bad/{i:02d}.png" for i in range(25)])
        message = logs.records[0].getMessage()
        self.assertIn("26 files were skipped", message)
        self.assertIn("  art: tiny.png: smaller than minimum_image_size", message)
        self.assertIn("  photos: bad/18.png: truncated or unreadable header", message)
        self.assertNotIn("bad/19.png", message)  # art's one file and photos' first 19 are named
        self.assertIn("... and 6 more", message)
        self.assertIn(f"the full list: {path}", message)

    def test_no_skipped_file_still_replaces_an_earlier_runs_list(self):
        self.output.mkdir()
        (self.output / "skipped_files.json").write_text('{"old": [{"path": "x", "reason": "y"}]}')
        with self.assertLogs(LOGGER, "INFO") as logs:
            path = report_skipped_files({"photos": index("photos", [])}, self.output)
        self.assertEqual(json.loads(path.read_text()), {"photos": []})
        self.assertIn("no file was skipped", logs.records[0].getMessage())
        self.assertEqual([p.name for p in self.output.iterdir()], ["skipped_files.json"])


if __name__ == "__main__":
    unittest.main()
