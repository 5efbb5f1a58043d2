"""The requests an S3 client really sends, seen on the wire: a loopback forwarder in front of an
RcloneS3Server that records each request's method, key, whether it lists, and its Range. It
counts what reaches the server whichever client library sent it (boto3, obstore)."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from s3_outage import content_length, pump, read_head
from s3_server import RcloneS3Server


@dataclass(frozen=True)
class Request:
    method: str
    key: str            # the object's key, without the bucket ('' for a listing)
    listing: bool       # a ListObjectsV2 request
    range: str | None   # the Range header's value, e.g. 'bytes=0-8191'
    agent: str          # the User-Agent: which client library sent it


def parsed(head: bytes) -> Request:
    lines = head.decode("latin-1").split("\r\n")
    method, target = lines[0].split(" ")[:2]
    url = urlsplit(target)
    key = unquote(url.path).lstrip("/").partition("/")[2]
    headers = {name.strip().lower(): value.strip()
               for name, value in (line.split(":", 1) for line in lines[1:] if ":" in line)}
    return Request(method, key, "list-type=2" in url.query, headers.get("range"),
                   headers.get("user-agent", ""))


class RequestLog:
    """``with RequestLog(server) as log``: point clients at ``log.endpoint``; ``log.requests``
    holds every request forwarded so far, ``log.clear()`` forgets them."""

    def __init__(self, server: RcloneS3Server):
        self.server = server
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> "RequestLog":
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        except OSError:
            pass
        self._listener.close()

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    def gets(self) -> list[Request]:
        """The object GETs (not listings) so far."""
        with self._lock:
            return [r for r in self.requests if r.method == "GET" and not r.listing]

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed: the test ended
            threading.Thread(target=self._forward, args=(client,), daemon=True).start()

    def _forward(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.server.port))
        except OSError:
            client.close()  # the server is down: the client sees its connection dropped
            return
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
        reader = client.makefile("rb")
        try:
            while (head := read_head(reader)) is not None:
                with self._lock:
                    self.requests.append(parsed(head))
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
