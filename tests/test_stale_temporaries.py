"""Atomic writers killed mid-write: the temporary file they leave (an index cache's is as large
as the cache) is removed by the next run that writes into the folder. Caused for real: a
process writing an index cache file is killed with SIGKILL, then discovery runs again. And a
cache folder that cannot be written stops the audit with one line, not a traceback."""

from __future__ import annotations

import os
import sys
import tempfile
import time
import unittest
from pathlib import Path

from discovery_fixtures import dataset_config, encode, image, training_config, write
from launching import Launch, run_bounded
from training_fixtures import environment, write_config
from simpletuner.common.stale_temporaries import (HOST_TAG, UNOWNED_AFTER_S,
                                                  remove_stale_temporaries)
from simpletuner.helpers.metadata.backends.base import MetadataBackend

WRITER = r"""
import sys, time
import numpy as np
from simpletuner.helpers.metadata.index_file import ColumnFileWriter
with ColumnFileWriter(sys.argv[1]) as writer:
    writer.add({"ids": np.arange(4_000_000, dtype=np.int64)})  # 32 MB, written by its thread
    time.sleep(600)  # killed here, before the commit's rename
"""
LARGE = 32_000_000


def temporaries(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.tmp"))


class KilledIndexWriteTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        self.data = self.root / "data"
        write(self.data, "a.png", encode(image(64, 64), "PNG"))
        self.output = self.root / "out"

    def backend(self) -> MetadataBackend:
        return MetadataBackend.from_config(dataset_config(self.data),
                                           training_config(self.output))

    def kill_a_writer_mid_write(self, cache_path: Path) -> Path:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        with Launch([sys.executable, "-c", WRITER, str(cache_path)], tmpdir=self.root) as run:
            deadline = time.monotonic() + 120
            while not any(p.stat().st_size >= LARGE for p in temporaries(cache_path.parent)):
                self.assertIsNone(run.process.poll(), run.stderr()[-3000:])
                self.assertLess(time.monotonic(), deadline, "the writer never wrote")
                time.sleep(0.05)
        # Leaving the block sent SIGKILL: the file stays, as a killed run's does.
        self.assertEqual(run.process.returncode, -9)
        [left] = temporaries(cache_path.parent)
        return left

    def test_the_next_run_removes_what_a_killed_index_write_left(self):
        backend = self.backend()
        left = self.kill_a_writer_mid_write(backend.cache_path)  # the first run's write
        self.assert_the_next_run_removes(backend, left)

    def test_also_where_a_cache_is_already_there(self):
        backend = self.backend()
        backend.refresh_index(show_progress=False)
        left = self.kill_a_writer_mid_write(backend.cache_path)  # a rebuild's write
        self.assert_the_next_run_removes(backend, left)

    def assert_the_next_run_removes(self, backend: MetadataBackend, left: Path) -> None:
        self.assertIn(f".{HOST_TAG}-", left.name)
        with self.assertLogs("simpletuner.common.stale_temporaries", "INFO") as logs:
            index = backend.refresh_index(show_progress=False)
        self.assertEqual(index.sample_count, 1)
        self.assertFalse(left.exists())
        self.assertEqual(temporaries(backend.cache_path.parent), [])
        self.assertIn(str(left), "\n".join(logs.output))


class StaleRuleTest(unittest.TestCase):
    def test_a_live_or_recent_writer_keeps_its_file_a_gone_or_old_one_does_not(self):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            old = time.time() - UNOWNED_AFTER_S - 60
            names = {
                "live": f".a.index.{HOST_TAG}-{os.getpid()}-0123456789ab.tmp",
                "other host, fresh": ".a.index.00000000-1-0123456789ab.tmp",
                "other host, old": ".b.index.00000000-1-0123456789ab.tmp",
                "unowned, old": ".c.index.0123456789ab.tmp",
                "not ours, old": ".notes.tmp",
            }
            for key, name in names.items():
                (folder / name).write_bytes(b"x")
                if "old" in key:
                    os.utime(folder / name, (old, old))
            removed = {path.name for path in remove_stale_temporaries(folder)}
            self.assertEqual(removed, {names["other host, old"], names["unowned, old"]})


def make_read_only(test: unittest.TestCase, folder: Path) -> None:
    """Really unwritable, also for root (whom mode bits do not stop): the immutable flag."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        test.addCleanup(folder.chmod, 0o755)
        return
    tmp = folder.parent
    if run_bounded(["chattr", "+i", folder], tmpdir=tmp, timeout=30).returncode != 0:
        test.skipTest("root, and chattr +i is refused here: no folder can be made read-only")
    test.addCleanup(lambda: test.assertEqual(
        run_bounded(["chattr", "-i", folder], tmpdir=tmp, timeout=30).returncode, 0))


class ReadOnlyCacheTest(unittest.TestCase):
    def test_the_audit_stops_with_one_line_naming_the_cache_file(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)  # after the folder is writable again (cleanups: LIFO)
        root = Path(tmp.name)
        write(root / "data", "a.png", encode(image(64, 64), "PNG"))
        config = write_config(root, root / "data")
        metadata = root / "config-out" / "cache" / "metadata"
        metadata.mkdir(parents=True)
        make_read_only(self, metadata)
        result = run_bounded([sys.executable, "-m", "simpletuner.audit", "--config",
                              str(config), "--output", str(root / "audit"), "--epochs", "1"],
                             tmpdir=root, timeout=300, env=environment(tmp.name))
        output = (result.stdout + result.stderr).strip()
        self.assertEqual(result.returncode, 1, output[-3000:])
        self.assertNotIn("Traceback", output)
        self.assertEqual(len(output.splitlines()), 1, output[-3000:])
        self.assertIn(str(metadata / "shapes.index"), output)


if __name__ == "__main__":
    unittest.main()
