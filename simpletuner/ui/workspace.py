"""The workspace folder: runs/<id>/ (each run's two files and its output_dir), queue.sqlite,
workspace.json (the dataset roots) and .token (the secret state-changing requests carry).
Every path the UI reads or writes is confined here: resolved (symlinks too) and refused unless
it lies inside the workspace or a listed dataset root."""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
from pathlib import Path
from typing import IO

from simpletuner.common.atomic import atomic_write_json

SETTINGS_NAME = "workspace.json"
SECRET_NAME = ".token"
QUEUE_NAME = "queue.sqlite"
SERVER_LOCK_NAME = "server.lock"
RUN_ID = re.compile(r"^[0-9a-f]{12}$")


class WorkspaceInUse(RuntimeError):
    """Another server holds the workspace."""


class PathRefused(ValueError):
    """A path outside the workspace and its dataset roots."""


class Workspace:
    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.runs = self.root / "runs"
        self.queue_path = self.root / QUEUE_NAME
        self.settings_path = self.root / SETTINGS_NAME
        self.secret_path = self.root / SECRET_NAME

    def hold(self) -> IO:
        """The workspace for this server alone (two would each start runs on their own slot
        count): an flock on DIR/server.lock, which the kernel releases however the server
        ends, so a server restarted after kill -9 takes it at once. Keep the file open."""
        self.root.mkdir(parents=True, exist_ok=True)
        lock = open(self.root / SERVER_LOCK_NAME, "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise WorkspaceInUse(f"workspace {self.root} is served by another server; stop it "
                                 "or choose another --workspace") from None
        return lock

    def prepare(self) -> str:
        """Create what a first start needs; return the secret."""
        self.runs.mkdir(parents=True, exist_ok=True)
        if not self.settings_path.exists():
            atomic_write_json(self.settings_path, {"dataset_roots": []}, indent=1)
        return self._secret()

    def _secret(self) -> str:
        """Created once with mode 0600 (O_EXCL: two servers starting together agree on it)."""
        try:
            fd = os.open(self.secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            os.chmod(self.secret_path, 0o600)  # a copy made readable by others is made private
            secret = self.secret_path.read_text().strip()
            if secret:
                return secret
            raise ValueError(f"{self.secret_path} is empty; delete it to make a new secret")
        secret = secrets.token_urlsafe(32)
        with os.fdopen(fd, "w") as out:
            out.write(secret + "\n")
        return secret

    def dataset_roots(self) -> list[Path]:
        """Read at each use, so an edit of workspace.json applies without a restart."""
        try:
            roots = json.loads(self.settings_path.read_text()).get("dataset_roots", [])
        except (OSError, ValueError, AttributeError):
            return []
        return [(self.root / str(root)).resolve() for root in roots if isinstance(root, str)]

    def allowed_roots(self) -> list[Path]:
        return [self.root, *self.dataset_roots()]

    def confine(self, path: str | os.PathLike) -> Path:
        """``path`` (relative ones from the workspace) resolved, symlinks included; PathRefused
        unless it lies inside the workspace or a dataset root."""
        resolved = (self.root / Path(path).expanduser()).resolve()
        if any(resolved.is_relative_to(root) for root in self.allowed_roots()):
            return resolved
        raise PathRefused(f"{path} is outside the workspace and its dataset roots "
                          f"(add a root to {self.settings_path})")

    def run_folder(self, run_id: str) -> Path:
        if not RUN_ID.match(run_id):
            raise PathRefused(f"{run_id!r} is not a run id")
        return self.runs / run_id

    def new_run_id(self) -> str:
        return secrets.token_hex(6)
