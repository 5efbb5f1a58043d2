"""A skipped file named with bytes that are not UTF-8 (b'bad\\xff.png', on disk with that name)
through every writer of text: the skipped-files log and JSON, the report page, the `report`
command and `plan`'s table and JSON. Each writes it, in its printable form where the output is
text, and none fails on it ("surrogates not allowed")."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import unittest
from pathlib import Path

from discovery_fixtures import dataset_config, encode, image, training_config, write
from launching import run_bounded
from simpletuner.helpers.metadata.backends.base import MetadataBackend
from simpletuner.helpers.metadata.startup import report_skipped_files
from simpletuner.training.reporting.report_page import REPORT_FILE, render_report

BAD = "bad\udcff.png"      # what os.scandir gives for b'bad\xff.png'
PRINTED = "bad\\xff.png"   # its printable form


class NonUtf8SkippedFileTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        self.data = self.root / "images"
        write(self.data, "good.png", encode(image(64, 64), "PNG"))
        with open(os.path.join(os.fsencode(self.data), b"bad\xff.png"), "wb") as handle:
            handle.write(encode(image(64, 64), "PNG"))  # no caption beside it: skipped
        self.output = self.root / "out"
        self.output.mkdir()

    def write_skipped_files(self) -> Path:
        backend = MetadataBackend.from_config(dataset_config(self.data),
                                              training_config(self.output))
        index = backend.refresh_index(show_progress=False)
        self.assertEqual([s.path for s in index.skipped], [BAD])
        with self.assertLogs("simpletuner.helpers.metadata.startup", "WARNING") as logs:
            path = report_skipped_files({"photos": index}, self.output)
        self.assertIn(f"photos: {PRINTED}: missing caption", "\n".join(logs.output))
        return path

    def test_the_skipped_files_json_holds_the_name(self):
        report = json.loads(self.write_skipped_files().read_bytes().decode("utf-8"))
        self.assertEqual(report["photos"][0]["path"], BAD)

    def test_the_report_page_is_written_and_names_it(self):
        self.write_skipped_files()
        page = render_report(self.output).read_bytes().decode("utf-8")
        self.assertIn(PRINTED, page)

    def test_the_report_command_exits_0_and_writes_the_page(self):
        self.write_skipped_files()
        result = run_bounded([sys.executable, "-m", "simpletuner", "report", str(self.output)],
                             tmpdir=self.root, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertNotIn("Traceback", result.stderr)
        page = (self.output / REPORT_FILE).read_bytes().decode("utf-8")
        self.assertIn(PRINTED, page)

    def test_plan_prints_its_table_and_json(self):
        config = self.root / "config.json"
        config.write_text(json.dumps({
            "model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
            "output_dir": "out", "data_backend_config": "multidatabackend.json",
            "resolution": 64, "aspect_bucket_alignment": 16}))
        (self.root / "multidatabackend.json").write_text(json.dumps([
            {"id": "photos", "instance_data_dir": "images"}]))
        for as_json in (False, True):
            result = run_bounded([sys.executable, "-m", "simpletuner", "plan", "--config",
                                  str(config), *(["--json"] if as_json else [])],
                                 tmpdir=self.root, cwd=self.root, timeout=120)
            self.assertEqual(result.returncode, 0, result.stderr[-3000:])
            self.assertNotIn("Traceback", result.stderr)
            if as_json:
                skipped = json.loads(result.stdout)["datasets"]["photos"]["skipped"]
                self.assertEqual(skipped[0]["path"], BAD)
            else:
                self.assertIn("skipped: 1", result.stdout)


if __name__ == "__main__":
    unittest.main()
