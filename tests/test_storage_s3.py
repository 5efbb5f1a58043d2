"""S3 storage against a real server (rclone serve s3): listing, ranged reads, discovery,
captions and the latent cache over a bucket with a prefix, nested keys, names with spaces and
non-ASCII characters; re-probing only what changed (requests counted on the wire, whichever
client sent them: obstore lists and reads headers where it is installed, boto3 does the rest
and all of it without obstore); and the clear errors of bad credentials, a missing bucket, an
unreachable endpoint and throttling (a real HTTP server answering SlowDown) that outlast the
retry window."""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from unittest import mock

import pyarrow
import pyarrow.parquet
import torch
import torch.nn.functional as F
from PIL import Image

from discovery_fixtures import encode, image, rotated_jpeg, training_config, write
from s3_request_log import RequestLog
from s3_server import SECRET_KEY, RcloneS3Server, free_port
from simpletuner.configuration import DatasetConfig
from simpletuner.helpers.caching.latents import LatentSettings, cache_latents
from simpletuner.helpers.data_backend.local import LocalStorage
from simpletuner.helpers.data_backend.storage import StorageError
from simpletuner.helpers.metadata.backends.base import MetadataBackend

BUCKET, PREFIX = "datasets", "photos 2026/"
NAMES = {  # sample id -> (width, height, format)
    "a.png": (64, 64, "PNG"), "nested/deeper/b c.jpg": (96, 64, "JPEG"),
    "nested/ünï cödé.webp": (64, 96, "WEBP"), "z/d.jpeg": (80, 48, "JPEG"),
    "odd/50% off #1+2 ~[x].png": (48, 64, "PNG"),  # characters URLs and paths escape
}


def populate(folder: Path) -> None:
    for i, (name, (w, h, fmt)) in enumerate(NAMES.items()):
        write(folder, name, encode(image(w, h, seed=i), fmt), caption=f"caption {i} of {name}")
    write(folder, "rotated.jpg", rotated_jpeg(96, 64, 6), caption="rotated")  # EXIF: portrait
    write(folder, "broken.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 20, caption="broken")
    write(folder, "uncaptioned.png", encode(image(64, 64), "PNG"), caption=None)
    write(folder, ".hidden/e.png", encode(image(64, 64), "PNG"))
    for name, fmt in (("large/photo.jpg", "JPEG"), ("large/photo.webp", "WEBP")):
        write(folder, name, encode(noise(640, 400), fmt, quality=95), caption="large")


def noise(width: int, height: int) -> Image.Image:
    """Incompressible pixels: files far larger than their header."""
    return Image.frombytes("RGB", (width, height), random.Random(5).randbytes(width * height * 3))


class ThrottlingServer:
    """A real HTTP server that answers every request as S3 does when it sheds load."""

    def __init__(self):
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests += 1
                body = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
                        b"<Message>Please reduce your request rate.</Message></Error>")
                self.send_response(503)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "ThrottlingServer":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class S3DiscoveryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp())
        cls.data = cls.tmp / "served" / BUCKET / PREFIX.rstrip("/")
        populate(cls.data)
        populate(cls.tmp / "served" / BUCKET / "changing")  # changed through the server
        write(cls.tmp / "served" / BUCKET / "photos 2026-other", "x.png",
              encode(image(64, 64), "PNG"))  # shares the prefix's text, not its folder
        cls.server = RcloneS3Server(cls.tmp / "served", cls.tmp).__enter__()
        cls.log = RequestLog(cls.server).__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.log.__exit__()
        cls.server.__exit__()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def dataset(self, **overrides) -> DatasetConfig:
        return DatasetConfig(id="photos", **{**self.server.dataset(BUCKET, PREFIX),
                                             "aws_endpoint_url": self.log.endpoint, **overrides})

    def backend(self, output: str, **overrides) -> MetadataBackend:
        return MetadataBackend.from_config(self.dataset(**overrides),
                                           training_config(self.tmp / output))

    def test_listing_and_reads_match_the_files(self):
        storage = self.backend("out-list").storage
        listing = storage.list_files()
        local = LocalStorage(self.data).list_files()
        self.assertEqual(listing.sample_ids, local.sample_ids)
        self.assertNotIn("x.png", listing.sample_ids)
        self.assertEqual(listing.sizes, local.sizes)
        self.assertEqual(set(listing.captions), set(local.captions))
        self.assertTrue(all(isinstance(k, str) and k for k in listing.change_keys))
        name = "nested/ünï cödé.webp"
        whole = (self.data / name).read_bytes()
        self.assertEqual(storage.read_range(name, 5, 11), whole[5:16])
        self.assertEqual(storage.read_bytes(name), whole)
        storage.write_atomic("written/new file.txt", b"new bytes")
        self.assertEqual((self.data / "written" / "new file.txt").read_bytes(), b"new bytes")
        self.assertTrue(storage.exists("written/new file.txt"))
        self.assertFalse(storage.exists("written/absent.txt"))
        (self.data / "written" / "new file.txt").unlink()

    def test_index_and_captions_equal_local_discovery(self):
        remote = self.backend("out-equal")
        index = remote.refresh_index(show_progress=False)
        local = MetadataBackend.from_config(
            DatasetConfig(id="photos", instance_data_dir=str(self.data)),
            training_config(self.tmp / "out-local"))
        expected = local.refresh_index(show_progress=False)
        self.assertEqual(index.buckets, expected.buckets)
        self.assertEqual(dict(index.original_sizes), dict(expected.original_sizes))
        self.assertEqual(index.skipped, expected.skipped)
        self.assertEqual(index.original_sizes["rotated.jpg"], (64, 96))
        self.assertEqual({s.path for s in index.skipped}, {"broken.png", "uncaptioned.png"})
        other_rank = self.backend("out-equal")
        loaded = other_rank.load_index()  # reads no object: captions come with the index
        self.assertEqual(loaded.digest(), index.digest())
        for ids in index.buckets.values():
            for sample_id in ids:
                self.assertEqual(other_rank.caption_for(sample_id), local.caption_for(sample_id))

    def test_a_parquet_table_over_the_bucket_gives_the_same_index(self):
        discovered = self.backend("out-discovered").refresh_index(show_progress=False)
        rows = [{"filename": s, "width": w, "height": h}
                for s, (w, h) in discovered.original_sizes.items()]
        table = self.tmp / "bucket-table.parquet"
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), table)
        backend = self.backend("out-table", metadata_backend="parquet",
                               parquet={"path": str(table)})
        self.log.clear()
        index = backend.refresh_index(show_progress=False)
        self.assertEqual([r.key for r in self.log.gets() if not r.key.endswith(".txt")], [],
                         "the table backend fetched an image")
        self.assertEqual(index.buckets, discovered.buckets)
        self.assertEqual(dict(index.original_sizes), dict(discovered.original_sizes))
        self.assertEqual({s.path for s in index.skipped},
                         {"broken.png", "uncaptioned.png"})  # no row / no caption file

    def test_a_trusted_table_lists_nothing(self):
        discovered = self.backend("out-discovered-trust").refresh_index(show_progress=False)
        rows = [{"filename": s, "width": w, "height": h}
                for s, (w, h) in discovered.original_sizes.items()]
        rows.append({"filename": "never/uploaded.png", "width": 64, "height": 64})
        table = self.tmp / "trusted-table.parquet"
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), table)
        backend = self.backend("out-trusted", metadata_backend="parquet",
                               caption_strategy="filename",
                               parquet={"path": str(table), "trust_table": True})
        self.log.clear()
        with self.assertLogs("simpletuner", "INFO") as logs:
            index = backend.refresh_index(show_progress=False)
        self.assertIn("is not listed", "\n".join(logs.output))
        self.assertEqual([(r.method, r.listing) for r in self.log.requests], [("GET", False)],
                         "a trusted table's index sends one request")
        self.assertEqual(sorted(s for ids in index.buckets.values() for s in ids),
                         sorted([*discovered.original_sizes, "never/uploaded.png"]))
        settings = LatentSettings("photos", backend.storage, self.tmp / "vae-trusted", "m")
        cached = cache_latents(index, settings, lambda pixels: F.avg_pool2d(pixels, 8),
                               progress=False)
        self.assertEqual(list(cached.failures), ["never/uploaded.png"])
        self.assertFalse(any(r.listing for r in self.log.requests))
        self.assertEqual(cached.encoded, index.sample_count - 1)

    def test_only_new_or_changed_objects_are_read_again(self):
        backend = MetadataBackend.from_config(
            DatasetConfig(id="changing", **self.server.dataset(
                BUCKET, "changing", aws_endpoint_url=self.log.endpoint)),
            training_config(self.tmp / "out-changing"))
        self.log.clear()
        first = backend.refresh_index(show_progress=False)
        self.assertEqual(backend.last_refresh.read, 10)
        # 8 indexed samples; large/photo.jpg and large/photo.webp share large/photo.txt
        self.assertEqual(len({r.key for r in self.log.gets() if r.key.endswith(".txt")}), 7)
        self.log.clear()
        backend.refresh_index(show_progress=False)
        self.assertEqual(self.log.gets(), [], "an unchanged bucket was read again")
        self.assertEqual(backend.last_refresh.read, 0)
        # Same length, other bytes: only the ETag tells. The frame header's height and width
        # are swapped, so the header now says 48 x 80.
        original = backend.storage.read_bytes("z/d.jpeg")
        frame = original.index(b"\xff\xc0") + 5
        swapped = (original[:frame] + original[frame + 2:frame + 4] + original[frame:frame + 2]
                   + original[frame + 4:])
        backend.storage.write_atomic("z/d.jpeg", swapped)
        backend.storage.write_atomic("z/d.txt", b"a new caption")
        self.log.clear()
        second = backend.refresh_index(show_progress=False)
        self.assertEqual(backend.last_refresh.read, 1)
        self.assertEqual(second.original_sizes["z/d.jpeg"], (48, 80))
        self.assertEqual(sorted({r.key for r in self.log.gets()}),
                         ["changing/z/d.jpeg", "changing/z/d.txt"])
        self.assertNotEqual(first.digest(), second.digest())
        self.assertEqual(backend.caption_for("z/d.jpeg"), "a new caption")

    def test_large_objects_are_probed_from_their_first_bytes(self):
        backend = self.backend("out-ranged")
        self.log.clear()
        index = backend.refresh_index(show_progress=False)
        self.assertEqual(index.original_sizes["large/photo.webp"], (640, 400))
        self.assertEqual(index.original_sizes["large/photo.jpg"], (640, 400))
        for name in ("large/photo.jpg", "large/photo.webp"):
            self.assertGreater((self.data / name).stat().st_size, 100_000)
            self.assertEqual([r.range for r in self.log.gets() if r.key == PREFIX + name],
                             ["bytes=0-8191"])

    def test_obstore_lists_and_reads_headers_and_boto3_does_the_rest(self):
        backend = self.backend("out-clients")
        self.log.clear()
        backend.refresh_index(show_progress=False)
        agents = {(r.listing, r.key.endswith(".txt")): r.agent.split("/")[0]
                  for r in self.log.requests}
        self.assertEqual(agents, {(True, False): "object_store", (False, False): "object_store",
                                  (False, True): "Boto3"})  # listing, headers; captions

    def test_without_obstore_boto3_does_all_of_it_alike(self):
        with_obstore = self.backend("out-with-obstore").refresh_index(show_progress=False)
        with mock.patch.dict(sys.modules, {"obstore": None}):  # as if it were not installed
            backend = self.backend("out-boto3-only")
        self.log.clear()
        index = backend.refresh_index(show_progress=False)
        self.assertEqual({r.agent.split("/")[0] for r in self.log.requests}, {"Boto3"})
        self.assertIn("bytes=0-8191", {r.range for r in self.log.gets()})
        self.assertEqual(index.buckets, with_obstore.buckets)
        self.assertEqual(dict(index.original_sizes), dict(with_obstore.original_sizes))
        self.assertEqual(index.skipped, with_obstore.skipped)

    def test_listing_and_header_reads_wait_out_a_restart_of_the_server(self):
        storage = self.backend("out-restart", aws_retry_window_seconds=30).storage
        self.assertIsNotNone(storage.obstore_reads)
        expected = storage.list_files()  # the pools now hold connections the restart drops
        head = storage.read_range("a.png", 0, 8192)
        self.server.kill()
        back = threading.Timer(1.5, self.server.start)
        back.start()
        try:
            with self.assertLogs("simpletuner.helpers.data_backend.retries", "INFO") as logs:
                self.assertEqual(storage.read_range("a.png", 0, 8192), head)
                self.assertEqual(storage.list_files().sample_ids, expected.sample_ids)
        finally:
            back.join()
        self.assertIn("waiting up to 30 s for it to answer again", logs.output[0])
        self.assertIn("answers again after", "\n".join(logs.output))

    def test_latents_are_cached_locally_from_the_bucket(self):
        backend = self.backend("out-latents")
        index = backend.refresh_index(show_progress=False)
        encode_images = lambda pixels: F.avg_pool2d(pixels, 8)  # noqa: E731 - a stand-in VAE
        vae_dir = self.tmp / "vae-s3"
        settings = LatentSettings("photos", backend.storage, vae_dir, "m")
        first = cache_latents(index, settings, encode_images, progress=False)
        self.assertEqual(first.encoded, index.sample_count)
        self.assertEqual(first.failures, {})
        again = cache_latents(index, settings, encode_images, progress=False)
        self.assertEqual(again.encoded, 0)
        local = cache_latents(index, LatentSettings("photos", LocalStorage(self.data),
                                                    self.tmp / "vae-local", "m"),
                              encode_images, progress=False)
        for sample_id in (s for bucket in index.buckets.values() for s in bucket):
            self.assertTrue(torch.equal(first.cache.load([sample_id]).latents,
                                        local.cache.load([sample_id]).latents), sample_id)
        self.assertTrue(all(path.is_relative_to(vae_dir) for path in first.cache.paths.values()))

    def assert_clear_failure(self, backend: MetadataBackend, *expected: str) -> str:
        with self.assertRaises(StorageError) as caught:
            backend.refresh_index(show_progress=False)
        message = str(caught.exception)
        for text in expected:
            self.assertIn(text, message)
        self.assertNotIn(SECRET_KEY, message)
        self.assertFalse(backend.cache_path.exists())
        return message

    def test_wrong_credentials_are_named(self):
        self.assert_clear_failure(self.backend("out-bad-key", aws_secret_access_key="not-it-0000"),
                                  "refused the credentials", "aws_secret_access_key")

    def test_missing_bucket_is_named(self):
        self.assert_clear_failure(self.backend("out-no-bucket", aws_bucket_name="no-such-bucket"),
                                  "bucket 'no-such-bucket' does not exist", "aws_bucket_name")

    def test_a_trusted_table_still_names_a_wrong_key_or_bucket(self):
        table = self.tmp / "trusted-names.parquet"
        pyarrow.parquet.write_table(pyarrow.table({"filename": ["a.png"], "width": [64],
                                                   "height": [64]}), table)
        trusted = {"metadata_backend": "parquet", "caption_strategy": "filename",
                   "parquet": {"path": str(table), "trust_table": True}}
        self.assert_clear_failure(self.backend("out-trusted-key", aws_secret_access_key="not-it-0",
                                               **trusted), "refused the credentials")
        self.assert_clear_failure(self.backend("out-trusted-bucket", aws_bucket_name="no-such",
                                               **trusted), "bucket 'no-such' does not exist")

    def test_throttling_is_retried_with_backoff_for_the_window_then_named(self):
        with ThrottlingServer() as server:
            backend = self.backend("out-throttled", aws_endpoint_url=server.endpoint,
                                   aws_retry_window_seconds=1.5)
            with self.assertLogs("simpletuner.helpers.data_backend.retries", "WARNING") as logs:
                message = self.assert_clear_failure(
                    backend, "throttled by the server (SlowDown)", "aws_max_pool_connections")
        # 0.5 s doubling (jittered down to half) within 1.5 s: 3 to 4 attempts, each one request
        self.assertIn(f"still after {server.requests} attempts over 2 s", message)
        self.assertIn(server.requests, (3, 4))
        self.assertIn("waiting up to 1.5 s", logs.output[0])

    def test_unreachable_endpoint_is_named(self):
        endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        self.assert_clear_failure(self.backend("out-unreachable", aws_endpoint_url=endpoint,
                                               aws_retry_window_seconds=0.5),
                                  f"cannot reach {endpoint}", "aws_endpoint_url",
                                  "aws_retry_window_seconds: 0.5")


if __name__ == "__main__":
    unittest.main()
