"""An S3-compatible bucket (AWS S3, Cloudflare R2, Backblaze B2, MinIO, rclone) as storage.

Keys under ``aws_data_prefix`` are the dataset; a sample id is a key without that prefix.
boto3 makes the requests, except discovery's listing and header reads, which obstore makes where
it is installed (s3_obstore.py: a tenth of the CPU per request); both give the same answers.
A request that fails for a reason that passes (the server down or restarting, a dropped
connection, throttling, a 5xx) is retried with backoff for ``aws_retry_window_seconds``
(retries.py; each client itself tries once); what still fails becomes a StorageError that says what
is wrong, which key and what to do. No message, log line or cache entry ever holds a
credential: only the bucket, the prefix and the endpoint are named.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from simpletuner.helpers.data_backend import s3_obstore
from simpletuner.helpers.data_backend.retries import RetriesSpent, RetryWindow
from simpletuner.helpers.data_backend.storage import (
    CAPTION_EXTENSION, IMAGE_EXTENSIONS, FileVersion, Listing, StorageError, extension_of,
)

RETRY_SETTING = "aws_retry_window_seconds"
_REFUSED = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken",
            "ExpiredToken", "AuthorizationHeaderMalformed", "InvalidClientTokenId"}
_THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
              "TooManyRequests", "ServiceUnavailable", "503"}
_MISSING = {"NoSuchKey", "404", "NotFound"}
_SERVER_FAILED = {"InternalError", "RequestTimeout", "500", "502", "504"}


@dataclass(frozen=True)
class S3Settings:
    """SimpleTuner's ``aws_*`` keys. Credentials left None come from boto3's usual chain
    (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, ~/.aws/credentials, ...)."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    # a settings object must be safe to log: credentials stay out of its repr
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    max_pool_connections: int = 128
    retry_window_s: float = 90.0  # how long a passing failure is retried before the run stops

    @classmethod
    def for_dataset(cls, dataset) -> "S3Settings":
        """From a configuration.DatasetConfig with type 'aws'."""
        return cls(dataset.aws_bucket_name, dataset.aws_data_prefix or "", dataset.aws_endpoint_url,
                   dataset.aws_region_name, dataset.aws_access_key_id,
                   dataset.aws_secret_access_key, dataset.aws_session_token,
                   dataset.aws_max_pool_connections, dataset.aws_retry_window_seconds)


def _normalised_prefix(prefix: str) -> str:
    """'photos' and 'photos/' both mean the folder 'photos/', never also 'photos2/'."""
    prefix = prefix.lstrip("/")
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


class S3Storage:
    remote = True

    def __init__(self, settings: S3Settings, extensions: frozenset[str] = IMAGE_EXTENSIONS):
        import boto3  # the 's3' extra; the config loader checks it is installed
        import botocore.session
        from botocore.config import Config

        self.settings = settings
        self.extensions = extensions  # what is listed as a sample: images, or clips
        self.bucket = settings.bucket
        self.prefix = _normalised_prefix(settings.prefix)
        where = f" at {settings.endpoint_url}" if settings.endpoint_url else ""
        self.location = f"s3://{self.bucket}/{self.prefix}{where}"
        self.max_connections = settings.max_pool_connections
        self.retries = RetryWindow(settings.retry_window_s, self.location, RETRY_SETTING)
        session = botocore.session.get_session()
        # Timestamps stay text: parsing each LastModified with dateutil was a large part of a
        # listing's time (benchmarks/PERFORMANCE.md), and a change key only needs to compare equal.
        session.get_component("response_parser_factory").set_parser_defaults(
            timestamp_parser=str)
        self.client = boto3.session.Session(botocore_session=session).client(
            "s3", endpoint_url=settings.endpoint_url, region_name=settings.region,
            aws_access_key_id=settings.access_key_id,
            aws_secret_access_key=settings.secret_access_key,
            aws_session_token=settings.session_token,
            # One attempt each: self.retries waits out outages for a time, not a count.
            config=Config(retries={"total_max_attempts": 1, "mode": "standard"},
                          max_pool_connections=settings.max_pool_connections,
                          connect_timeout=10, read_timeout=60))
        # discovery's listing and header reads; None: boto3 does them too
        self.obstore_reads = self._obstore_client()

    def _obstore_client(self) -> s3_obstore.ObstoreReads | None:
        """obstore for discovery's hot calls when it is installed and boto3's chain finds
        credentials (without them boto3 says what to set)."""
        if not s3_obstore.installed():
            return None
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider

        session = boto3.session.Session(
            aws_access_key_id=self.settings.access_key_id,
            aws_secret_access_key=self.settings.secret_access_key,
            aws_session_token=self.settings.session_token, region_name=self.settings.region)
        if session.get_credentials() is None:
            return None
        # boto3 finds AWS's region for the bucket by itself; obstore must be told it
        region = session.region_name or "us-east-1"
        return s3_obstore.ObstoreReads(self.settings, Boto3CredentialProvider(session), region)

    # -- the storage interface -------------------------------------------------------------

    def list_files(self) -> Listing:
        rows: list[tuple[str, int, str]] = []
        captions: dict[str, str] = {}
        for sample_id, size, change_key in self._objects():
            extension = extension_of(sample_id)
            if extension == CAPTION_EXTENSION:
                captions[sample_id] = f"{size}:{change_key}"
            elif extension in self.extensions:
                rows.append((sample_id, size, change_key))
        rows.sort()
        return Listing([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], captions)

    def versions(self, names: list[str]) -> dict[str, FileVersion]:
        wanted = set(names)  # one paginated listing instead of a HEAD per name
        return {sample_id: FileVersion(size, key) for sample_id, size, key in self._objects()
                if sample_id in wanted}

    def read_range(self, name: str, start: int, length: int) -> bytes:
        if self.obstore_reads is not None and start == 0:
            data = self._call("read", name, lambda: self.obstore_reads.read_prefix(
                self.prefix + name, length))
            if data is not None:
                return data
        return self._get(name, Range=f"bytes={start}-{start + length - 1}")

    def read_bytes(self, name: str) -> bytes:
        return self._get(name)

    def write_atomic(self, name: str, data: bytes) -> None:
        # An S3 PUT replaces the object as a whole: readers never see part of it.
        self._call("write", name, lambda: self.client.put_object(
            Bucket=self.bucket, Key=self.prefix + name, Body=data))

    def exists(self, name: str) -> bool:
        try:
            self._call("look up", name, lambda: self.client.head_object(
                Bucket=self.bucket, Key=self.prefix + name))
        except FileNotFoundError:
            return False
        return True

    def local_path(self, name: str) -> Path | None:
        return None

    def identity(self, name: str) -> str:
        endpoint = self.settings.endpoint_url or "aws"
        return f"s3://{self.bucket}/{self.prefix}{name} ({endpoint})"

    # -- requests and their errors ---------------------------------------------------------

    def _objects(self) -> Iterator[tuple[str, int, str]]:
        """(sample id, size, ETag) of every visible object under the prefix, page by page (each
        page retried on its own, so an outage mid-listing does not start it again)."""
        pages = self._obstore_pages() if self.obstore_reads is not None else self._boto3_pages()
        for page in pages:
            for key, size, etag in page:
                sample_id = key[len(self.prefix):]
                if not sample_id or sample_id.endswith("/") or any(
                        part.startswith(".") for part in sample_id.split("/")):
                    continue  # folder markers and hidden files, as for a local folder
                yield sample_id, size, etag

    def _boto3_pages(self) -> Iterator[list[tuple[str, int, str]]]:
        arguments = {"Bucket": self.bucket, "Prefix": self.prefix}
        while True:
            page = self._call("list", "", lambda: self.client.list_objects_v2(**arguments))
            yield [(item["Key"], item["Size"],
                    item.get("ETag", "").strip('"') or str(item.get("LastModified")))
                   for item in page.get("Contents", ())]
            if not page.get("IsTruncated"):
                return
            arguments["ContinuationToken"] = page["NextContinuationToken"]

    def _obstore_pages(self) -> Iterator[list[tuple[str, int, str]]]:
        after, stream = None, None

        def next_page():
            nonlocal stream
            if stream is None:  # the first page, or the listing again after a failed page
                stream = self.obstore_reads.pages(self.prefix, after)
            try:
                return next(stream, None)
            except Exception:
                stream = None
                raise
        while (page := self._call("list", "", next_page)) is not None:
            if page:
                after = page[-1][0]
            yield page

    def _get(self, name: str, **extra) -> bytes:
        # The body is read inside the request: a connection dropped mid-body is retried too.
        return self._call("read", name, lambda: self.client.get_object(
            Bucket=self.bucket, Key=self.prefix + name, **extra)["Body"].read())

    def _call(self, action: str, name: str, request: Callable[[], object]):
        try:
            return self.retries.run(request, self._transient)
        except RetriesSpent as spent:
            raise self._translated(spent.error, action, name, spent) from spent.error
        except Exception as exc:  # noqa: BLE001 - translated, or re-raised unchanged
            translated = self._translated(exc, action, name, None)
            if translated is exc:
                raise
            raise translated from exc

    def _endpoint(self) -> str:
        return self.settings.endpoint_url or "the AWS endpoint"

    def _transient(self, exc: Exception) -> str | None:
        """Why ``exc`` may pass with time (then the request is retried), or None."""
        problem = _connection_problem(exc)
        if problem == "unreachable":
            return f"cannot reach {self._endpoint()} ({type(exc).__name__})"
        if problem == "dropped":
            return f"the connection to {self._endpoint()} dropped ({type(exc).__name__})"
        answer = _answer(exc)
        if answer is not None:
            code, status, _ = answer
            if code in _THROTTLED or status in (429, 503):
                return f"throttled by the server ({code or status})"
            if code in _SERVER_FAILED or status in (500, 502, 504):
                return f"the server failed ({code or status})"
        return None

    def _translated(self, exc: Exception, action: str, name: str,
                    spent: RetriesSpent | None) -> Exception:
        """A clear error naming the bucket, the key and the setting to check."""
        from botocore.exceptions import NoCredentialsError

        what = f"cannot {action} s3://{self.bucket}/{self.prefix}{name}"
        if spent is not None:
            return StorageError(
                f"{what}: {self._transient(exc)}, still after {spent.attempts} attempts over "
                f"{spent.seconds:.0f} s ({RETRY_SETTING}: {self.settings.retry_window_s:g}); "
                f"{self._advice(exc)}")
        if isinstance(exc, NoCredentialsError):
            return StorageError(f"{what}: no AWS credentials found; set aws_access_key_id and "
                                "aws_secret_access_key in multidatabackend.json, or the "
                                "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY environment variables")
        answer = _answer(exc)
        if answer is None:
            return exc
        code, status, message = answer
        if code == "NoSuchBucket":
            return StorageError(f"{what}: the bucket '{self.bucket}' does not exist at "
                                f"{self.settings.endpoint_url or 'AWS'}; check aws_bucket_name "
                                "and aws_endpoint_url")
        if code in _REFUSED or status == 403:
            return StorageError(f"{what}: the server refused the credentials ({code or status}); "
                                "check aws_access_key_id, aws_secret_access_key and "
                                "aws_session_token (or the AWS_* environment variables) and the "
                                "bucket's permissions")
        if code in _MISSING or status == 404:
            return FileNotFoundError(f"{what}: no such object")
        return StorageError(f"{what}: {code or status}: {message}")

    def _advice(self, exc: Exception) -> str:
        answer = _answer(exc)
        if answer is None:
            return ("check aws_endpoint_url and that the server is up and reachable from this "
                    f"machine, then run again (latents cached so far are kept); raise "
                    f"{RETRY_SETTING} to wait longer through outages")
        code, status, _ = answer
        if code in _THROTTLED or status in (429, 503):
            return "lower aws_max_pool_connections or try again later"
        return "try again later"


def _answer(exc: Exception) -> tuple[str, int | None, str] | None:
    """The error code, HTTP status and message of the server's error answer, from boto3 or
    obstore; None when no answer came."""
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return (str(error.get("Code", "")),
                exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode"),
                error.get("Message", ""))
    return s3_obstore.answer(exc) if s3_obstore.is_obstore_error(exc) else None


def _connection_problem(exc: Exception) -> str | None:
    """'unreachable' or 'dropped' when no answer came for a reason that may pass."""
    from botocore.exceptions import (
        ConnectionError as BotoConnectionError, HTTPClientError, IncompleteReadError,
    )

    if isinstance(exc, BotoConnectionError):
        return "unreachable"
    if isinstance(exc, (HTTPClientError, IncompleteReadError)):
        return "dropped"
    return s3_obstore.connection_problem(exc) if s3_obstore.is_obstore_error(exc) else None
