"""An S3-compatible bucket (AWS S3, Cloudflare R2, Backblaze B2, MinIO, rclone) as storage.

Keys under ``aws_data_prefix`` are the dataset; a sample id is a key without that prefix.
Every request goes through boto3's standard retry mode (backoff on throttling and dropped
connections); what still fails becomes a StorageError that says what is wrong and which key
to check. No message, log line or cache entry ever holds a credential: only the bucket, the
prefix and the endpoint are named.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from simpletuner.helpers.data_backend.storage import (
    CAPTION_EXTENSION, IMAGE_EXTENSIONS, FileVersion, Listing, StorageError, extension_of,
)

RETRY_ATTEMPTS = 5
_REFUSED = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken",
            "ExpiredToken", "AuthorizationHeaderMalformed", "InvalidClientTokenId"}
_THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
              "TooManyRequests", "ServiceUnavailable", "503"}
_MISSING = {"NoSuchKey", "404", "NotFound"}


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

    @classmethod
    def for_dataset(cls, dataset) -> "S3Settings":
        """From a configuration.DatasetConfig with type 'aws'."""
        return cls(dataset.aws_bucket_name, dataset.aws_data_prefix or "", dataset.aws_endpoint_url,
                   dataset.aws_region_name, dataset.aws_access_key_id,
                   dataset.aws_secret_access_key, dataset.aws_session_token,
                   dataset.aws_max_pool_connections)


def _normalised_prefix(prefix: str) -> str:
    """'photos' and 'photos/' both mean the folder 'photos/', never also 'photos2/'."""
    prefix = prefix.lstrip("/")
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


class S3Storage:
    remote = True

    def __init__(self, settings: S3Settings):
        import boto3  # the 's3' extra; the config loader checks it is installed
        import botocore.session
        from botocore.config import Config

        self.settings = settings
        self.bucket = settings.bucket
        self.prefix = _normalised_prefix(settings.prefix)
        where = f" at {settings.endpoint_url}" if settings.endpoint_url else ""
        self.location = f"s3://{self.bucket}/{self.prefix}{where}"
        self.max_connections = settings.max_pool_connections
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
            config=Config(retries={"total_max_attempts": RETRY_ATTEMPTS, "mode": "standard"},
                          max_pool_connections=settings.max_pool_connections,
                          connect_timeout=10, read_timeout=60))

    # -- the storage interface -------------------------------------------------------------

    def list_files(self) -> Listing:
        rows: list[tuple[str, int, str]] = []
        captions: dict[str, str] = {}
        for sample_id, size, change_key in self._objects():
            extension = extension_of(sample_id)
            if extension == CAPTION_EXTENSION:
                captions[sample_id] = f"{size}:{change_key}"
            elif extension in IMAGE_EXTENSIONS:
                rows.append((sample_id, size, change_key))
        rows.sort()
        return Listing([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], captions)

    def versions(self, names: list[str]) -> dict[str, FileVersion]:
        wanted = set(names)  # one paginated listing instead of a HEAD per name
        return {sample_id: FileVersion(size, key) for sample_id, size, key in self._objects()
                if sample_id in wanted}

    def read_range(self, name: str, start: int, length: int) -> bytes:
        return self._get(name, Range=f"bytes={start}-{start + length - 1}")

    def read_bytes(self, name: str) -> bytes:
        return self._get(name)

    def write_atomic(self, name: str, data: bytes) -> None:
        # An S3 PUT replaces the object as a whole: readers never see part of it.
        self._call("write", name, self.client.put_object, Bucket=self.bucket,
                   Key=self.prefix + name, Body=data)

    def exists(self, name: str) -> bool:
        try:
            self._call("look up", name, self.client.head_object, Bucket=self.bucket,
                       Key=self.prefix + name)
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
        """(sample id, size, ETag) of every visible object under the prefix, page by page."""
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix)
        try:
            for page in pages:
                for item in page.get("Contents", ()):
                    sample_id = item["Key"][len(self.prefix):]
                    if not sample_id or sample_id.endswith("/") or any(
                            part.startswith(".") for part in sample_id.split("/")):
                        continue  # folder markers and hidden files, as for a local folder
                    etag = item.get("ETag", "").strip('"')
                    yield sample_id, item["Size"], etag or str(item.get("LastModified"))
        except Exception as exc:  # noqa: BLE001 - translated, or re-raised unchanged
            raise self._translated(exc, "list", "") from exc

    def _get(self, name: str, **extra) -> bytes:
        answer = self._call("read", name, self.client.get_object, Bucket=self.bucket,
                            Key=self.prefix + name, **extra)
        try:
            return answer["Body"].read()
        except Exception as exc:  # noqa: BLE001 - a connection dropped mid-body
            raise self._translated(exc, "read", name) from exc

    def _call(self, action: str, name: str, request, **arguments):
        try:
            return request(**arguments)
        except Exception as exc:  # noqa: BLE001 - translated, or re-raised unchanged
            raise self._translated(exc, action, name) from exc

    def _translated(self, exc: Exception, action: str, name: str) -> Exception:
        """A clear error naming the bucket, the key and the setting to check."""
        from botocore.exceptions import (
            ClientError, ConnectionError as BotoConnectionError, NoCredentialsError,
        )

        what = f"cannot {action} s3://{self.bucket}/{self.prefix}{name}"
        if isinstance(exc, NoCredentialsError):
            return StorageError(f"{what}: no AWS credentials found; set aws_access_key_id and "
                                "aws_secret_access_key in multidatabackend.json, or the "
                                "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY environment variables")
        if isinstance(exc, BotoConnectionError):
            endpoint = self.settings.endpoint_url or "the AWS endpoint"
            return StorageError(f"{what}: cannot reach {endpoint} after {RETRY_ATTEMPTS} "
                                f"attempts ({type(exc).__name__}); check aws_endpoint_url and "
                                "that the server is up and reachable from this machine")
        if not isinstance(exc, ClientError):
            return exc
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket":
            return StorageError(f"{what}: the bucket '{self.bucket}' does not exist at "
                                f"{self.settings.endpoint_url or 'AWS'}; check aws_bucket_name "
                                "and aws_endpoint_url")
        if code in _REFUSED or status == 403:
            return StorageError(f"{what}: the server refused the credentials ({code or status}); "
                                "check aws_access_key_id, aws_secret_access_key and "
                                "aws_session_token (or the AWS_* environment variables) and the "
                                "bucket's permissions")
        if code in _THROTTLED or status in (429, 503):
            return StorageError(f"{what}: throttled by the server ({code or status}) after "
                                f"{RETRY_ATTEMPTS} attempts with backoff; lower "
                                "aws_max_pool_connections or try again later")
        if code in _MISSING or status == 404:
            return FileNotFoundError(f"{what}: no such object")
        return StorageError(f"{what}: {code or status}: "
                            f"{exc.response.get('Error', {}).get('Message', '')}")
