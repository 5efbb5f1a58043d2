"""Discovery's two hot S3 calls through obstore (Rust), when it is installed: listing the
prefix and reading objects' first bytes.

botocore costs about 1.5 ms of CPU per request under the GIL (building, signing and parsing it
in Python), which bounded discovery; obstore makes the same requests with a tenth of that
(benchmarks/PERFORMANCE.md). s3.py keeps boto3 for everything else and retries, classifies and
words the errors of both the same way; this module only says what an obstore error means.

A prefix read is a plain GET sent with a fixed ``Range`` header, by a store per window size,
and cut to the length asked for. obstore's own ranged GET insists on status 206, and rclone
answers a ranged GET with the range's bytes under status 200; a plain GET takes either.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

# The prefix lengths a store is kept for: discovery's header reads (metadata/backends/headers.py
# reads 8 KiB, then 128 KiB when a header goes on).
PREFIX_WINDOWS = (8 * 1024, 128 * 1024)
LIST_PAGE = 1000  # keys per listing request, S3's maximum

_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>\s*([^<\s]+)\s*</Code>")
_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")
_UNREACHABLE = ("error sending request", "connection refused", "dns error", "connect error")
_DROPPED = ("connection closed", "error decoding response body", "connection reset",
            "unexpected eof", "incomplete", "timed out")


def installed() -> bool:
    try:
        import obstore  # noqa: F401 - the 's3' extra brings it; boto3 alone also works
    except ImportError:
        return False
    return True


class ObstoreReads:
    """Listing pages and prefix reads of one bucket; requests are tried once (the caller's
    RetryWindow waits out outages), with boto3's timeouts."""

    def __init__(self, settings, credentials, region: str):
        self._settings, self._credentials, self._region = settings, credentials, region
        self._lister = self._store({})
        self._windows = {window: self._store({"Range": f"bytes=0-{window - 1}"})
                         for window in PREFIX_WINDOWS}

    def _store(self, headers: dict[str, str]):
        from obstore.store import S3Store

        endpoint = self._settings.endpoint_url
        options = {"connect_timeout": timedelta(seconds=10), "timeout": timedelta(seconds=60),
                   "allow_http": bool(endpoint and endpoint.startswith("http://")),
                   "pool_max_idle_per_host": str(self._settings.max_pool_connections)}
        if headers:
            options["default_headers"] = headers
        config = {"region": self._region}
        if endpoint:  # S3-compatible servers: path-style addressing, as boto3 uses there
            config.update(endpoint=endpoint, virtual_hosted_style_request=False)
        return S3Store(self._settings.bucket, config=config, client_options=options,
                       retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=60)},
                       credential_provider=self._credentials)

    def pages(self, prefix: str, after: str | None) -> Iterator[list[tuple[str, int, str]]]:
        """(key, size, ETag) of the keys under ``prefix`` after the key ``after``, a page at a
        time: a listing cut off by an outage resumes after the last key it returned."""
        import obstore

        stream = obstore.list(self._lister, prefix or None, offset=after, chunk_size=LIST_PAGE)
        for chunk in stream:
            yield [(meta["path"], meta["size"],
                    (meta["e_tag"] or "").strip('"') or str(meta["last_modified"]))
                   for meta in chunk]

    def read_prefix(self, key: str, length: int) -> bytes | None:
        """The first ``length`` bytes of ``key`` (fewer if it is shorter); None when no window
        is that long."""
        import obstore

        window = next((w for w in PREFIX_WINDOWS if w >= length), None)
        if window is None:
            return None
        data = obstore.get(self._windows[window], key).bytes()
        return bytes(memoryview(data)[:length])


def is_obstore_error(exc: Exception) -> bool:
    return type(exc).__module__.startswith("obstore") or (
        isinstance(exc, FileNotFoundError) and "Object at location" in str(exc))


def answer(exc: Exception) -> tuple[str, int, str] | None:
    """The S3 error code, HTTP status and message of an error answer, from obstore's message
    (its exceptions carry them only as text); None when no answer came."""
    text = str(exc)
    status = _STATUS.search(text)
    if status is None:
        return None
    code, message = _CODE.search(text), _MESSAGE.search(text)
    return (code.group(1) if code else "", int(status.group(1)),
            message.group(1).strip() if message else "")


def connection_problem(exc: Exception) -> str | None:
    """'unreachable' or 'dropped' when no answer came for a reason that may pass."""
    if answer(exc) is not None:
        return None
    text = str(exc).lower()
    if any(sign in text for sign in _UNREACHABLE):
        return "unreachable"
    if any(sign in text for sign in _DROPPED):
        return "dropped"
    return None
