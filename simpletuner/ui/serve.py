"""`python -m simpletuner serve`: check the settings (a non-loopback bind without a token is
refused with exit status 2 before anything listens, and so is a workspace another server
holds), bind the socket (so --port 0 is known before the app is built), print where it serves,
and run uvicorn until a signal."""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from pathlib import Path

from simpletuner.ui.settings import ServerSettings, SettingsError
from simpletuner.ui.workspace import Workspace, WorkspaceInUse

REPO = Path(__file__).resolve().parent.parent.parent
BACKLOG = 128
GRACEFUL_S = 5  # open event streams are cut after this on shutdown


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(BACKLOG)  # connections made once the address is printed wait for the app
    return sock


def run_server(args: argparse.Namespace) -> int:
    import uvicorn

    from simpletuner.ui.app import build_app

    try:
        settings = ServerSettings.from_arguments(args, REPO)
        if not (REPO / "train.sh").is_file():
            raise SettingsError(f"no train.sh in {REPO}: the UI runs from a source checkout")
        workspace_lock = Workspace(settings.workspace).hold()  # held until the process ends
        sock = _bind(settings.host, settings.port)
    except (SettingsError, WorkspaceInUse) as exc:
        print(f"serve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"serve: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    settings = settings.bound_to(sock.getsockname()[1])
    app = build_app(settings)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(f"serving workspace {settings.workspace} on {settings.url}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="info", access_log=False,
                                           timeout_graceful_shutdown=GRACEFUL_S))
    with workspace_lock:
        server.run(sockets=[sock])
    return 0
