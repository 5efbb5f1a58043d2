"""Special files in a dataset folder: a named pipe called `pipe.png` (or a caption that is one)
and a link to a device. Opening a pipe waits for a writer forever, so discovery must never
open one: each is skipped and reported with its kind, and `plan` finishes."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import unittest
from pathlib import Path

from discovery_fixtures import encode, image, write
from launching import run_bounded
from simpletuner.helpers.data_backend.local import LocalStorage
from simpletuner.helpers.metadata.backends.discovery import probe_image

PIPE = "not a regular file (a named pipe)"
DEVICE = "not a regular file (a character device)"


class SpecialFilesTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        self.data = self.root / "images"
        png = encode(image(64, 64), "PNG")
        write(self.data, "good.png", png)
        write(self.data, "piped_caption.png", png, caption=None)
        os.mkfifo(self.data / "pipe.png")
        os.mkfifo(self.data / "piped_caption.txt")
        (self.data / "null.png").symlink_to(os.devnull)

    def test_the_listing_reports_them_with_their_kind(self):
        listing = LocalStorage(self.data).list_files()
        self.assertEqual(listing.sample_ids, ["good.png", "piped_caption.png"])
        self.assertEqual(dict(listing.unreadable), {
            "null.png": DEVICE, "pipe.png": PIPE, "piped_caption.txt": PIPE})
        self.assertNotIn("piped_caption.txt", listing.captions)

    def test_a_header_probe_of_a_pipe_returns_at_once(self):
        # A pipe swapped in after the listing: the probe must not wait for a writer.
        found = []
        probing = threading.Thread(target=lambda: found.append(
            probe_image(str(self.data / "pipe.png"), None)), daemon=True)
        probing.start()
        probing.join(timeout=20)
        self.assertEqual([probe.error for probe in found], [PIPE])

    def test_plan_finishes_and_lists_them_as_skipped(self):
        config = self.root / "config.json"
        config.write_text(json.dumps({
            "model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
            "output_dir": "out", "data_backend_config": "multidatabackend.json",
            "resolution": 64, "aspect_bucket_alignment": 16}))
        (self.root / "multidatabackend.json").write_text(json.dumps([
            {"id": "photos", "instance_data_dir": "images"}]))
        result = run_bounded([sys.executable, "-m", "simpletuner", "plan", "--config",
                              str(config), "--json"], tmpdir=self.root, cwd=self.root,
                             timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        plan = json.loads(result.stdout)["datasets"]["photos"]
        self.assertEqual(plan["buckets"], {"64x64": ["good.png"]})
        reasons = {entry["path"]: entry["reason"] for entry in plan["skipped"]}
        self.assertEqual(reasons["pipe.png"], PIPE)
        self.assertEqual(reasons["null.png"], DEVICE)
        self.assertEqual(reasons["piped_caption.txt"], PIPE)
        self.assertTrue(reasons["piped_caption.png"].startswith("missing caption"))


if __name__ == "__main__":
    unittest.main()
