"""A real S3 outage at a chosen moment: a loopback forwarder in front of an RcloneS3Server that
kills the server, for real, just before it would forward the n-th whole-object read of an image
(latent caching reads whole objects; header probes send a Range), then starts it again some
seconds later, or never. While the server is down the forwarder does not listen either, so
clients get refused connections as from a dead server, and the connections open at that moment
drop. Timing the stop from the requests themselves makes it land mid-caching on every run."""

from __future__ import annotations

import socket
import threading
import time
from typing import BinaryIO

from s3_server import RcloneS3Server, free_port

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")


def read_head(reader: BinaryIO) -> bytes | None:
    """One HTTP request's line and headers, or None when the client closed the connection."""
    lines = []
    while True:
        line = reader.readline()
        if not line:
            return None
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)


def is_whole_image_read(head: bytes) -> bool:
    method, target = head.split(b" ", 2)[:2]
    path = target.split(b"?", 1)[0].lower()
    return (method == b"GET" and path.endswith(tuple(s.encode() for s in IMAGE_SUFFIXES))
            and b"\nrange:" not in head.lower())


def content_length(head: bytes) -> int:
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def pump(source: socket.socket, target: socket.socket) -> None:
    """Bytes from ``source`` to ``target`` until either side closes; then both are shut."""
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        for side in (source, target):
            try:
                side.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class OutageProxy:
    """``with OutageProxy(server, stop_before_read=5, down_for_s=3) as proxy``: point clients at
    ``proxy.endpoint``. ``down_for_s`` None: the server stays down until ``restart()``."""

    def __init__(self, server: RcloneS3Server, *, stop_before_read: int,
                 down_for_s: float | None):
        self.server = server
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.stop_before_read, self.down_for_s = stop_before_read, down_for_s
        self.reads = 0                       # whole-object image reads seen (forwarded or not)
        self.stopped_at: float | None = None   # time.monotonic() once the server is dead
        self.restarted_at: float | None = None
        self.reads_at_restart: int | None = None
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._restart_timer: threading.Timer | None = None

    def __enter__(self) -> "OutageProxy":
        self._listen()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._restart_timer is not None:  # a restart still due would outlive the server
            self._restart_timer.cancel()
            self._restart_timer.join()
        self._close_listener()

    def restart(self) -> None:
        """Bring the server back, then listen again (clients reconnect from then on)."""
        self.server.start()
        with self._lock:
            self.restarted_at, self.reads_at_restart = time.monotonic(), self.reads
        self._listen()

    def _listen(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
            except OSError:
                pass
            listener.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed: the outage began, or the test ended
            threading.Thread(target=self._forward, args=(client,), daemon=True).start()

    def _forward(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.server.port))
        except OSError:
            client.close()  # the server went down after this connection was accepted
            return
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
        reader = client.makefile("rb")
        try:
            while (head := read_head(reader)) is not None:
                if self._stops_now(head):
                    self._close_listener()  # refused from now on, as by a dead server
                    client.close()  # and the request in flight drops
                    self._kill_server()
                    return
                upstream.sendall(head)
                left = content_length(head)
                while left > 0 and (body := reader.read1(min(left, 65536))):
                    upstream.sendall(body)
                    left -= len(body)
        except OSError:
            pass
        finally:
            reader.close()
            for side in (client, upstream):
                side.close()

    def _stops_now(self, head: bytes) -> bool:
        if not is_whole_image_read(head):
            return False
        with self._lock:
            self.reads += 1
            return self.reads == self.stop_before_read

    def _kill_server(self) -> None:
        self.server.kill()
        self.stopped_at = time.monotonic()
        if self.down_for_s is not None:
            self._restart_timer = threading.Timer(self.down_for_s, self.restart)
            self._restart_timer.start()
