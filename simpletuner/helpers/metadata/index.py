"""The bucket index of one dataset: plain data every later stage reads, never mutates."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from simpletuner.helpers.metadata.skipped import SkippedFile, SkippedFiles
from simpletuner.helpers.metadata.split import SortedIds, canonical_ids

__all__ = ["ClipPlan", "DatasetIndex", "SizesView", "SkippedFile", "SkippedFiles"]


@dataclass(frozen=True)
class ClipPlan:
    """What caching decodes of one clip: its first ``frames`` frames of the first video stream,
    in presentation order from its start, at the source's rate or, when ``retimed_fps`` is set,
    re-timed to that rate (clip_timing.py)."""

    frames: int         # the count of its bucket "WxH@F"
    fps: str            # the source's exact rate, 'num/den'
    source_frames: int  # what discovery read (``counted_by``: the container's count or
    counted_by: str     # duration x rate); the decode verifies at least ``frames`` exist
    retimed_fps: int | None = None  # video.fps where it differs from ``fps``; else None

    def digested(self) -> list:
        """What the index digest covers (frames: in the bucket key); the re-timing only when
        set, so an index without it keeps its digest."""
        return [self.fps, self.source_frames, *([self.retimed_fps] if self.retimed_fps else [])]


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def _ids_json(ids: SortedIds) -> bytes:
    """_compact(list(ids)) in UTF-8; ids of printable ASCII without a quote or backslash (nearly
    all) are joined directly, several times faster than the encoder at millions of ids."""
    plain = ids.plain_joined(b'","') if len(ids) else None
    if plain is not None:
        return b'["' + plain + b'"]'
    joined = '","'.join(ids)
    if joined and joined.isascii():
        data = joined.encode("ascii")
        codes = np.frombuffer(data, np.uint8)
        if (codes.min() >= 0x20 and codes.max() < 0x7F and b"\\" not in data
                and data.count(b'"') == 2 * (len(ids) - 1)):
            return b'["' + data + b'"]'
    return _compact(list(ids)).encode("utf-8")


class SizesView(Mapping):
    """Sample id -> (width, height), read from the file table's columns instead of copied into
    a dict of one tuple per image, which a start-up would pay for on every rank."""

    def without(self, removed: Mapping[str, str]) -> "SizesView":
        """The same view less ``removed``."""
        raise NotImplementedError


def _digest_without(digest: str, removed: dict[str, str]) -> str:
    """The digest of an index less ``removed``: this index's and the removed ids (sorted: the
    same whatever order a caller's dict has), which decide the smaller content."""
    names = "\0".join(sorted(removed)).encode("utf-8", "surrogatepass")
    return hashlib.sha256(b"without\0" + digest.encode("ascii") + b"\0" + names).hexdigest()


@dataclass
class DatasetIndex:
    dataset_id: str
    buckets: dict[str, SortedIds]              # "WxH" (clips "WxH@F") -> sorted sample ids
    original_sizes: Mapping[str, tuple[int, int]]  # sample id -> (width, height), EXIF-oriented
    # any iterable of SkippedFile is accepted and held as columns (skipped.py)
    skipped: SkippedFiles = field(default_factory=list)
    clips: Mapping[str, ClipPlan] = field(default_factory=dict)  # a video dataset's samples
    # edit pairs (pairs.py): sample id -> its reference id in each conditioning dataset
    references: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self):
        # Any list is accepted and put in canonical order once, here (see SortedIds).
        self.buckets = {key: canonical_ids(ids) for key, ids in self.buckets.items()}
        self.skipped = SkippedFiles.of(self.skipped)
        # Not a field, so dataclasses.replace() (other content) starts without it.
        self._digest: str | None = None

    @property
    def sample_count(self) -> int:
        return sum(len(ids) for ids in self.buckets.values())

    def digest(self) -> str:
        """Stable across processes and machines: ranks compare it to agree on the index, the
        sampler's fingerprint holds it. Hashing the content costs seconds at 10 M samples, so
        it is computed once per content: when the index cache is written, or on first use."""
        if self._digest is None:
            self._digest = self._content_digest()
        return self._digest

    @property
    def known_digest(self) -> str | None:
        """The digest if already known (recorded, derived or computed), else None."""
        return self._digest

    def set_digest(self, digest: str) -> None:
        """Take ``digest`` as this content's: the one recorded in the index cache by the main
        process that wrote it, so a loading rank never hashes millions of ids."""
        self._digest = digest

    def _content_digest(self) -> str:
        """SHA-256 of the compact JSON of [dataset id, {bucket key: ids}, clips if any,
        references if any], hashed a bucket at a time."""
        digest = hashlib.sha256(f"[{_compact(self.dataset_id)},{{".encode("utf-8"))
        for n, (key, ids) in enumerate(sorted(self.buckets.items())):
            digest.update(f"{',' if n else ''}{_compact(key)}:".encode("utf-8") + _ids_json(ids))
        digest.update(b"}")
        if self.clips:  # only then, so an image index keeps its digest
            digest.update(b"," + _compact({s: c.digested() for s, c in
                                           sorted(self.clips.items())}).encode("utf-8"))
        if self.references:  # likewise
            digest.update(b"," + _compact({s: list(refs) for s, refs in
                                           sorted(self.references.items())}).encode("utf-8"))
        digest.update(b"]")
        return digest.hexdigest()

    def without(self, removed: dict[str, str]) -> "DatasetIndex":
        """A copy without ``removed`` (sample id -> reason), which are reported as skipped."""
        smaller = self._less(removed)
        # A few removed (undecodable files): derived from them, the rest not hashed again.
        # Most removed (max_num_samples): what is left is the smaller thing to hash.
        if smaller is not self and len(removed) <= self.sample_count // 2:
            smaller.set_digest(_digest_without(self.digest(), removed))
        return smaller

    def _less(self, removed: dict[str, str]) -> "DatasetIndex":
        if not removed:
            return self
        buckets = {}
        for key, ids in self.buckets.items():
            kept = ids.without(removed)
            if kept:
                buckets[key] = kept
        if isinstance(self.original_sizes, SizesView):  # a view: no copy of millions of sizes
            sizes = self.original_sizes.without(removed)
        else:
            sizes = {s: wh for s, wh in self.original_sizes.items() if s not in removed}
        skipped = self.skipped + [SkippedFile(s, r) for s, r in sorted(removed.items())]
        clips = {s: plan for s, plan in self.clips.items() if s not in removed}
        references = {s: refs for s, refs in self.references.items() if s not in removed}
        return DatasetIndex(self.dataset_id, buckets, sizes, skipped, clips, references)
