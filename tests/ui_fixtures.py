"""A real `python -m simpletuner serve` for the UI tests: started through tests/launching.py on
a free port (--port 0, read back from its first line), talked to with http.client, so a test
can send any Host, Origin or Authorization header."""

from __future__ import annotations

import http.client
import json
import signal
import sys
import time
from pathlib import Path

from launching import Launch
from training_fixtures import environment

START_TIMEOUT_S = 60
TINY_CONFIG = {"model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
               "seed": 7, "resolution": 64, "aspect_bucket_alignment": 16,
               "train_batch_size": 2, "max_train_steps": 3, "learning_rate": 1e-3}


def dataset(folder: str | Path, dataset_id: str = "shapes") -> dict:
    return {"id": dataset_id, "instance_data_dir": str(folder), "caption_strategy": "textfile"}


class Response:
    def __init__(self, status: int, headers: dict, body: bytes):
        self.status, self.headers, self.body = status, headers, body

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self):
        return json.loads(self.body)


class Server:
    """The server on ``workspace`` with ``arguments``; a context manager that kills it (and
    every run it started that still runs) when left."""

    def __init__(self, workspace: Path, tmpdir: str, *arguments: str):
        self.workspace = Path(workspace)
        self.launch = Launch([sys.executable, "-m", "simpletuner", "serve", "--port", "0",
                              "--workspace", str(workspace), *arguments],
                             tmpdir=tmpdir, env=environment(tmpdir))
        self.port = self._wait_for_port()
        self.origin = f"http://127.0.0.1:{self.port}"
        self.secret = (self.workspace / ".token").read_text().strip()

    def _wait_for_port(self) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for line in self.launch.stdout().splitlines():
                if line.startswith("serving workspace") and " on http://" in line:
                    return int(line.rsplit(":", 1)[1])
            if self.launch.process.poll() is not None:
                break
            time.sleep(0.1)
        self.launch.close()
        raise AssertionError(f"the server did not start:\n{self.launch.stderr()[-3000:]}")

    def request(self, method: str, path: str, body=None, headers: dict | None = None,
                timeout: float = 60) -> Response:
        """``headers`` as given (Host defaults to ours); a body that is not bytes is JSON."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        headers = {"Host": f"127.0.0.1:{self.port}", **(headers or {})}
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
        try:
            connection.request(method, path, body=body, headers=headers)
            answer = connection.getresponse()
            return Response(answer.status, dict(answer.getheaders()), answer.read())
        finally:
            connection.close()

    def post(self, path: str, body=None, headers: dict | None = None) -> Response:
        """With the workspace secret, as a script sends it."""
        return self.request("POST", path, body if body is not None else {},
                            {"Authorization": f"Bearer {self.secret}", **(headers or {})})

    def run(self, run_id: str) -> dict:
        answer = self.request("GET", f"/api/runs/{run_id}")
        assert answer.status == 200, answer.text
        return answer.json()

    def wait_for_run(self, run_id: str, done, timeout: float, what: str) -> dict:
        """Poll the run until ``done(run)``; fail naming ``what`` and the run's console."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.run(run_id)
            if done(run):
                return run
            time.sleep(0.5)
        console = self.workspace / "runs" / run_id / "console.log"
        tail = console.read_text(errors="replace")[-3000:] if console.exists() else ""
        raise AssertionError(f"run {run_id} not {what} within {timeout:.0f} s: {run}\n{tail}")

    def kill(self) -> None:
        """SIGKILL to the server alone: its runs are process groups of their own."""
        self.launch.process.send_signal(signal.SIGKILL)
        self.launch.process.wait(10)

    def close(self) -> None:
        self.launch.close()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
