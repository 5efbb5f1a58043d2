"""Whole runs over an S3 bucket served by rclone: the 2-process audit finds every occurrence
exactly once; bad credentials, a missing bucket and an unreachable endpoint stop every rank
with the message; ./train.sh trains over the bucket on CPU, and the secret key appears in no
file under output_dir and in no log line."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import unittest
from pathlib import Path

import test_distributed
from s3_server import SECRET_KEY, RcloneS3Server, free_port
from training_fixtures import make_shapes, read_jsonl, run_train_sh, write_config

BUCKET, PREFIX = "training", "sets/shapes/"


def files_containing(folder: Path, text: str) -> list[str]:
    needle = text.encode()
    return [str(p) for p in folder.rglob("*") if p.is_file() and needle in p.read_bytes()]


class S3RunsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="st-s3-runs-"))
        data = cls.tmp / "served" / BUCKET / PREFIX
        # 8 per bucket, in nested folders whose names have spaces and non-ASCII characters
        cls.ids = sorted([f"{folder}/{sample_id}" for folder in ("fold one", "ünï")
                          for sample_id in make_shapes(data / folder, per_size=4)])
        cls.private_tmp = cls.tmp / "tmp"
        cls.private_tmp.mkdir()
        cls.server = RcloneS3Server(cls.tmp / "served", cls.private_tmp).__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def config(self, name: str, **dataset_overrides) -> Path:
        dataset = {"id": "shapes", "caption_strategy": "textfile",
                   **self.server.dataset(BUCKET, PREFIX, **dataset_overrides)}
        return write_config(self.tmp, self.tmp, name, datasets=[dataset], seed=11)

    def audit(self, name: str, **dataset_overrides) -> list[tuple[int, str, str]]:
        output = self.tmp / f"{name}-audit"
        return test_distributed.launch(
            ["--config", str(self.config(name, **dataset_overrides)), "--output", str(output),
             "--epochs", "2"], 2, str(self.private_tmp))

    def test_audit_on_two_processes_finds_every_sample_exactly_once(self):
        results = self.audit("audit")
        for rank, (code, out, err) in enumerate(results):
            self.assertEqual(code, 0, f"rank {rank}:\n{out}\n{err[-3000:]}")
        summaries = re.findall(r"epoch (\d): (\d+) assigned, (\d+) unique, (\d+) missing, "
                               r"(\d+) duplicated", results[0][1])
        self.assertEqual(summaries, [("0", "16", "16", "0", "0"), ("1", "16", "16", "0", "0")])
        traces = [read_jsonl(self.tmp / "audit-audit" / f"rank-{r}.jsonl") for r in (0, 1)]
        for epoch in (0, 1):
            seen = sorted(s for trace in traces for m in trace if m["epoch"] == epoch
                          for s in m["samples"])
            self.assertEqual(seen, self.ids, f"epoch {epoch}")

    def assert_every_rank_fails(self, results, *expected: str) -> None:
        for rank, (code, out, err) in enumerate(results):
            self.assertNotEqual(code, 0, f"rank {rank} did not fail")
            for text in expected:
                self.assertIn(text, err, f"rank {rank}:\n{err[-3000:]}")
            self.assertNotIn(SECRET_KEY, out + err)

    def test_bad_credentials_stop_every_rank_with_the_message(self):
        self.assert_every_rank_fails(self.audit("bad-key", aws_secret_access_key="wrong-0000000"),
                                     "refused the credentials")

    def test_a_missing_bucket_stops_every_rank_with_the_message(self):
        self.assert_every_rank_fails(self.audit("no-bucket", aws_bucket_name="absent-bucket"),
                                     "bucket 'absent-bucket' does not exist")

    def test_an_unreachable_endpoint_stops_every_rank_with_the_message(self):
        endpoint = f"http://127.0.0.1:{free_port()}"
        self.assert_every_rank_fails(self.audit("unreachable", aws_endpoint_url=endpoint,
                                                aws_retry_window_seconds=1),
                                     f"cannot reach {endpoint}", "aws_retry_window_seconds: 1")

    def test_train_sh_trains_over_the_bucket_and_never_writes_the_secret(self):
        result = run_train_sh(self.config("train", aws_data_prefix=PREFIX.rstrip("/")),
                              str(self.private_tmp))
        self.assertEqual(result.returncode, 0, result.stderr[-4000:])
        output = self.tmp / "train-out"
        summary = json.loads((output / "training_summary.json").read_text())
        self.assertEqual(summary["steps"], 4, summary)
        latents = list((output / "cache" / "vae" / "shapes").rglob("*.safetensors"))
        self.assertEqual(len(latents), 16, "latents are cached locally under output_dir")
        self.assertEqual(files_containing(output, SECRET_KEY), [])
        self.assertNotIn(SECRET_KEY, result.stdout + result.stderr)


if __name__ == "__main__":
    unittest.main()
