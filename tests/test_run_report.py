"""What a training run says about its data: every skipped file with its reason, in a JSON file
in output_dir, and the first ones in the log; every rank calls the report, so a failed write
stops them all (real two-process gloo runs)."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import unittest
from pathlib import Path

from launching import run_bounded
from simpletuner.helpers.metadata.index import DatasetIndex, SkippedFile
from simpletuner.helpers.metadata.startup import report_skipped_files
from simpletuner.training.reporting.report_data import read_report_data
from simpletuner.training.reporting.report_sections import skipped_section

LOGGER = "simpletuner.helpers.metadata.startup"
RUNNER = Path(__file__).resolve().parent / "skipped_files_runner.py"
RUN_TIMEOUT = 120  # one run takes a few seconds; past this a rank is taken to hang


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
        # what the report reads: by reason, a count and the first few names (never the list)
        summary = json.loads((self.output / "skipped_summary.json").read_text())
        self.assertEqual(summary, {
            "photos": {"truncated or unreadable header": {
                "count": 25, "first": [f"bad/{i:02d}.png" for i in range(5)]}},
            "art": {"smaller than minimum_image_size": {"count": 1, "first": ["tiny.png"]}}})

    def test_the_report_reads_the_summary_and_an_older_runs_list_alike(self):
        many = [SkippedFile(f"bad/{i:02d}.png", "truncated or unreadable header")
                for i in range(25)]
        report_skipped_files({"photos": index("photos", many)}, self.output)
        from_summary = read_report_data(self.output, verify_hashes=False).skipped
        (self.output / "skipped_summary.json").unlink()  # a run from before the summary
        self.assertEqual(read_report_data(self.output, verify_hashes=False).skipped,
                         from_summary)
        first = ", ".join(f"bad/{i:02d}.png" for i in range(5))
        self.assertIn(f"<td>truncated or unreadable header</td><td>25</td><td>{first}, ...</td>",
                      skipped_section(from_summary))

    def test_no_skipped_file_still_replaces_an_earlier_runs_list(self):
        self.output.mkdir()
        (self.output / "skipped_files.json").write_text('{"old": [{"path": "x", "reason": "y"}]}')
        with self.assertLogs(LOGGER, "INFO") as logs:
            path = report_skipped_files({"photos": index("photos", [])}, self.output)
        self.assertEqual(json.loads(path.read_text()), {"photos": []})
        self.assertIn("no file was skipped", logs.records[0].getMessage())
        self.assertEqual(sorted(p.name for p in self.output.iterdir()),
                         ["skipped_files.json", "skipped_summary.json"])
        self.assertEqual(json.loads((self.output / "skipped_summary.json").read_text()),
                         {"photos": {}})



class SkippedFilesOnEveryRankTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.output = Path(self.tmp.name) / "out"

    def run_ranks(self) -> tuple[int, dict[int, str]]:
        """Two ranks; the status and each rank's line. A hang kills both and fails the test."""
        env = dict(os.environ, TMPDIR=self.tmp.name, PYTHONPATH=os.pathsep.join(
            [str(RUNNER.parents[1]), os.environ.get("PYTHONPATH", "")]))
        result = run_bounded(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
             "2", str(RUNNER), str(self.output)], tmpdir=self.tmp.name, timeout=RUN_TIMEOUT,
            env=env)
        stdout, stderr = result.stdout, result.stderr
        lines = {int(rank): text for rank, text in re.findall(r"^\[rank (\d)\] (.*)$", stdout,
                                                               re.M)}
        self.assertEqual(sorted(lines), [0, 1], stdout + stderr[-3000:])
        return result.returncode, lines

    def test_the_main_rank_writes_the_report_and_every_rank_returns_its_path(self):
        status, lines = self.run_ranks()
        report = self.output / "skipped_files.json"
        self.assertEqual(status, 0, lines)
        self.assertEqual(lines, {0: f"reported {report}", 1: f"reported {report}"})
        self.assertEqual(json.loads(report.read_text()), {
            "art": [], "photos": [{"path": "bad.png", "reason": "truncated or unreadable header"}]})

    def test_a_failed_write_on_the_main_rank_stops_both_ranks_with_one_message(self):
        report = self.output / "skipped_files.json"
        report.mkdir(parents=True)  # a real IsADirectoryError when the file is renamed over it
        status, lines = self.run_ranks()
        self.assertNotEqual(status, 0)
        self.assertEqual(lines[0], lines[1])
        self.assertTrue(lines[0].startswith(f"failed: writing {report} failed on rank 0: "
                                            "IsADirectoryError"), lines[0])


if __name__ == "__main__":
    unittest.main()
