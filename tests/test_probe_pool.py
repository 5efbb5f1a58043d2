"""Header reads in worker processes: same answers as in-process, in path order, and a worker
that dies does not lose files."""

from __future__ import annotations

import os
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from discovery_fixtures import encode, image, write
from simpletuner.helpers.metadata.backends import discovery, probe_pool
from simpletuner.helpers.metadata.backends.discovery import Probe


class ProbePoolTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        folder = Path(cls._tmp.name)
        png = encode(image(48, 32), "PNG")
        cls.expected: dict[str, Probe] = {}
        for i in range(40):
            width, height = 16 + 8 * (i % 5), 16 + 8 * (i % 3)
            fmt, ext = [("PNG", ".png"), ("JPEG", ".jpg"), ("WEBP", ".webp")][i % 3]
            path = write(folder, f"img{i:02d}{ext}", encode(image(width, height), fmt), None)
            cls.expected[str(path)] = Probe(width, height)
        broken = {"empty.png": (b"", discovery.ZERO_BYTE),
                  "text.jpg": (b"not a picture\n" * 5, discovery.NOT_AN_IMAGE),
                  "cut.png": (png[:len(png) // 2], discovery.TRUNCATED_DATA)}
        for name, (data, reason) in broken.items():
            cls.expected[str(write(folder, name, data, None))] = Probe(error=reason)
        # A name that is not valid UTF-8 must survive the trip through the worker's JSON.
        odd = os.fsdecode(os.fsencode(str(folder)) + b"/caf\xe9.png")
        Path(odd).write_bytes(png)
        cls.expected[odd] = Probe(48, 32)
        cls.paths = sorted(cls.expected)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def probe(self, workers):
        return probe_pool.probe_images(self.paths, max_pixels=None, workers=workers,
                                       show_progress=False)

    def test_workers_answer_like_this_process_in_path_order(self):
        here = self.probe(1)
        self.assertEqual(here, [self.expected[p] for p in self.paths])
        for workers in (2, 3):
            with self.subTest(workers=workers):
                self.assertEqual(self.probe(workers), here)

    def test_a_worker_that_dies_leaves_its_share_to_this_process(self):
        dies = [sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(3)"]
        with mock.patch.object(probe_pool, "_worker_command", return_value=dies):
            with self.assertLogs(probe_pool.logger, "WARNING") as logs:
                probes = self.probe(2)
        self.assertEqual(probes, [self.expected[p] for p in self.paths])
        self.assertEqual(len(logs.output), 2)  # one per worker
        self.assertIn("exit status 3", logs.output[0])

    def test_small_jobs_stay_in_this_process(self):
        self.assertEqual(probe_pool.default_workers(probe_pool.MIN_FILES_PER_WORKER - 1), 1)
        many = probe_pool.default_workers(10 ** 7)
        self.assertGreaterEqual(many, 1)
        self.assertLessEqual(many, probe_pool.MAX_WORKERS)
        with mock.patch.object(probe_pool.subprocess, "Popen") as popen:
            self.assertEqual(self.probe(None), [self.expected[p] for p in self.paths])
        popen.assert_not_called()


if __name__ == "__main__":
    unittest.main()
