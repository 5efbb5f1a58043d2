"""An S3 outage during latent caching, caused for real: the rclone server is stopped in the
middle of caching (tests/s3_outage.py times it from the requests) of a two-process ./train.sh
run. Back within aws_retry_window_seconds: every image is cached and trained on, only the truly
corrupt object is skipped as undecodable. Not back: every rank stops with status 1 and the
storage's message, no image is reported undecodable, and a rerun once the server is back trains
on the whole dataset. Also the backoff's arithmetic, which is pure."""

from __future__ import annotations

import io
import json
import random
import shutil
import tempfile
import unittest
from pathlib import Path

from PIL import Image

from s3_outage import OutageProxy
from s3_server import SECRET_KEY, RcloneS3Server
from simpletuner.helpers.data_backend.retries import MAX_DELAY_S, backoff_delay
from training_fixtures import make_shapes, read_jsonl, run_train_sh, write_config

BUCKET, PREFIX = "training", "sets/outage/"
CORRUPT = "corrupt.png"  # its header is intact (discovery keeps it), its pixel data is cut off
HEADER_READ = 8192       # discovery's first ranged read: a longer object is not checked whole
STOP_BEFORE_READ = 6     # of the 17 whole-image reads caching makes


class BackoffTest(unittest.TestCase):
    def test_delays_double_from_half_a_second_up_to_the_cap(self):
        delays = [backoff_delay(attempt, 1000.0, 1.0) for attempt in range(1, 9)]
        self.assertEqual(delays, [0.5, 1.0, 2.0, 4.0, 8.0, MAX_DELAY_S, MAX_DELAY_S, MAX_DELAY_S])

    def test_jitter_scales_and_the_window_bounds_every_pause(self):
        self.assertEqual(backoff_delay(3, 1000.0, 0.5), 1.0)
        self.assertEqual(backoff_delay(5, 3.0, 1.0), 3.0)  # the last pause ends with the window
        self.assertEqual(backoff_delay(1, 0.0, 1.0), 0.0)
        self.assertEqual(backoff_delay(100_000, 1e9, 1.0), MAX_DELAY_S)  # no overflow


class OutageDuringCachingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="st-s3-outage-"))
        cls.served = cls.tmp / "served"
        data = cls.served / BUCKET / PREFIX
        cls.ids = sorted(make_shapes(data, per_size=8))  # 16 images in two buckets
        noise = Image.frombytes("RGB", (64, 64), random.Random(3).randbytes(64 * 64 * 3))
        encoded = io.BytesIO()
        noise.save(encoded, "PNG")
        (data / CORRUPT).write_bytes(encoded.getvalue()[:HEADER_READ + 1000])
        (data / CORRUPT.replace(".png", ".txt")).write_text("a corrupt image")
        cls.private_tmp = cls.tmp / "tmp"
        cls.private_tmp.mkdir()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_through(self, proxy: OutageProxy, name: str, window_s: float):
        dataset = {"id": "shapes", "caption_strategy": "textfile",
                   **proxy.server.dataset(BUCKET, PREFIX, aws_endpoint_url=proxy.endpoint,
                                          aws_retry_window_seconds=window_s)}
        config = write_config(self.tmp, self.tmp, name, datasets=[dataset], seed=5,
                              num_processes=2, trace_samples=True)
        result = run_train_sh(config, str(self.private_tmp))
        self.assertNotIn(SECRET_KEY, result.stdout + result.stderr)
        return result, self.tmp / f"{name}-out"

    def assert_trained_on_every_image(self, result, out: Path) -> None:
        self.assertEqual(result.returncode, 0, result.stderr[-4000:])
        latents = list((out / "cache" / "vae" / "shapes").rglob("*.safetensors"))
        self.assertEqual(len(latents), len(self.ids))
        self.assertEqual(undecodable(out), [CORRUPT])
        # 4 steps of 2 ranks x batch 2: one epoch of 16, so every image once
        trained = sorted(s for rank in (0, 1)
                         for record in read_jsonl(out / "trace" / f"rank-{rank}.jsonl")
                         for s in record["samples"])
        self.assertEqual(trained, self.ids)

    def test_a_server_back_within_the_window_loses_no_image(self):
        with RcloneS3Server(self.served, self.private_tmp) as server, OutageProxy(
                server, stop_before_read=STOP_BEFORE_READ, down_for_s=3.0) as proxy:
            result, out = self.run_through(proxy, "back", window_s=30)
        self.assertIsNotNone(proxy.stopped_at, "the server was never stopped")
        self.assertGreaterEqual(proxy.restarted_at - proxy.stopped_at, 3.0)
        self.assertGreater(proxy.reads, proxy.reads_at_restart, "caching did not resume")
        self.assertIn("waiting up to 30 s for it to answer again", result.stderr)
        self.assertIn("answers again after", result.stderr)
        self.assert_trained_on_every_image(result, out)

    def test_a_server_that_stays_down_stops_every_rank_and_drops_nothing(self):
        with RcloneS3Server(self.served, self.private_tmp) as server, OutageProxy(
                server, stop_before_read=STOP_BEFORE_READ, down_for_s=None) as proxy:
            result, out = self.run_through(proxy, "down", window_s=2)
            self.assertEqual(result.returncode, 1, result.stderr[-4000:])
            self.assertIsNotNone(proxy.stopped_at, "the server was never stopped")
            for rank in (0, 1):
                stopped = [line for line in result.stderr.splitlines()
                           if f"[rank {rank}] training stopped (exit status 1)" in line]
                self.assertEqual(len(stopped), 1, result.stderr[-4000:])
                self.assertIn("caching latents of dataset 'shapes' failed", stopped[0])
                self.assertIn(f"cannot read s3://{BUCKET}/{PREFIX}", stopped[0])
                self.assertIn("(aws_retry_window_seconds: 2)", stopped[0])
                self.assertIn("then run again", stopped[0])
            self.assertNotIn("removed from training", result.stderr)
            self.assertEqual(undecodable(out), [])
            # The dataset was not shrunk: run again once the server is back, and all of it trains.
            proxy.restart()
            again, _ = self.run_through(proxy, "down", window_s=2)
        self.assert_trained_on_every_image(again, out)


def undecodable(out: Path) -> list[str]:
    """The files skipped_files.json reports as failing to decode (none when it is absent)."""
    report = out / "skipped_files.json"
    if not report.exists():
        return []
    return sorted(entry["path"] for entries in json.loads(report.read_text()).values()
                  for entry in entries if "failed to decode" in entry["reason"])


if __name__ == "__main__":
    unittest.main()
