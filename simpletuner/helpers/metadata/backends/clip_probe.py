"""What a clip's container says, read with PyAV without decoding every frame.

Width and height come from the first decoded frame, with the container's display matrix applied
(a phone's portrait clip is stored landscape with a 90 degree rotation, so the two swap);
decoding that one frame also proves the stream can be decoded. The frame count is the
container's own where it keeps one (``stream.frames``: MP4/MOV's sample table, AVI's index),
else the stream's duration times its frame rate (Matroska and WebM store no count; with a
variable frame rate that is an estimate at the nominal rate). A cut file keeps its header, so
the count is checked against the bytes that are there (``_frames_in_data``) and a clip short
of it is skipped as truncated. The latent cache decodes the clip and verifies the count it
needs. A remote object is read through ranged reads (RangedFile), so only the parts of the
file the demuxer asks for are fetched.
"""

from __future__ import annotations

import io
import math
from collections import OrderedDict
from fractions import Fraction

import av

from simpletuner.helpers.data_backend.storage import Storage, StorageError
from simpletuner.helpers.metadata.backends.discovery import VANISHED, ZERO_BYTE, ClipProbe

NO_VIDEO_STREAM = "no video stream"
AUDIO_ONLY = "audio only: no video stream"
UNDECODABLE = "cannot be decoded (truncated, corrupt or not a video)"
NO_FRAMES = "no frames"
NO_FRAME_RATE = "no frame rate in the container"
TRUNCATED = "truncated"
# frames a complete clip's last timestamp may fall short of its count, as a timestamp is rounded
# to a frame number (without a sample table: Matroska, WebM, AVI); a cut file loses far more
TRUNCATION_SLACK = 1
COUNTED_BY_CONTAINER, COUNTED_BY_DURATION = "container", "duration"
BLOCK_BYTES = 128 * 1024  # per ranged read: a demuxer asks for a few KiB at a time
MAX_BLOCKS = 32           # 4 MiB kept per clip being probed (one per thread)


def probe_clip(source, size: int, ranged: "RangedFile | None" = None) -> ClipProbe:
    """Probe a path or a seekable binary file of ``size`` bytes (``ranged``: the remote file
    under it). A StorageError of a remote read is raised: an outage is not a bad clip."""
    if size == 0:
        return ClipProbe(error=ZERO_BYTE)
    try:
        with av.open(source, "r") as container:
            return _probe_container(container, size)
    except StorageError:
        raise
    except FileNotFoundError:  # PyAV's is also an FFmpegError
        return ClipProbe(error=VANISHED)
    except av.FFmpegError as exc:
        failure = ranged.failure if ranged is not None else None  # PyAV wraps what a read raised
        if isinstance(failure, StorageError):
            raise failure from exc
        if isinstance(failure, FileNotFoundError):
            return ClipProbe(error=VANISHED)
        return ClipProbe(error=f"{UNDECODABLE}: {exc.strerror or type(exc).__name__}")
    except (OSError, ValueError, EOFError) as exc:
        return ClipProbe(error=f"{UNDECODABLE}: {exc}")


def _probe_container(container, size: int) -> ClipProbe:
    if not container.streams.video:
        return ClipProbe(error=AUDIO_ONLY if container.streams.audio else NO_VIDEO_STREAM)
    stream = container.streams.video[0]
    rate = stream_rate(stream)
    if not rate:
        return ClipProbe(error=NO_FRAME_RATE)
    frames, counted_by = stream.frames, COUNTED_BY_CONTAINER
    if frames <= 0:
        frames, counted_by = _frames_from_duration(container, stream, rate)
    first = next(iter(container.decode(stream)), None)
    if first is None or frames <= 0:
        return ClipProbe(error=NO_FRAMES)
    width, height = first.width, first.height
    if (first.rotation or 0) % 180:
        width, height = height, width
    present = _frames_in_data(container, stream, rate, frames, size)
    if present is not None and present < frames - TRUNCATION_SLACK:
        return ClipProbe(error=f"{TRUNCATED}: the container says {frames} frames, its data ends "
                               f"after about {present}")
    return ClipProbe(width, height, frames, f"{rate.numerator}/{rate.denominator}", counted_by)


def stream_rate(stream) -> Fraction | None:
    """A video stream's frame rate as the probe reads it (the decode re-times on this grid)."""
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    return Fraction(rate) if rate else None


def _frames_in_data(container, stream, rate: Fraction, frames: int, size: int) -> int | None:
    """How many frames the file's bytes hold. A cut file keeps its header's count or duration,
    not its end. With a full sample table (MP4, MOV): the frames whose bytes end within the
    file, exact whatever the frame rate. Else: seek to where the last frame should be and demux
    (no decode) to the end; the last timestamp found, as a frame number. None when the
    container cannot seek there (the latent cache's decode still checks the count)."""
    entries = stream.index_entries
    if len(entries) >= frames:
        if max(entries[-1].pos + entries[-1].size, entries[0].pos + entries[0].size) <= size:
            return len(entries)  # the usual case, without an object per frame of a long clip
        return sum(1 for entry in entries if entry.pos + entry.size <= size)
    time_base = Fraction(stream.time_base)
    start = stream.start_time or 0
    last = None
    try:
        container.seek(start + int((frames - 1) / rate / time_base), stream=stream,
                       backward=True)
        for packet in container.demux(stream):
            if packet.pts is not None:
                last = packet.pts if last is None else max(last, packet.pts)
    except (av.FFmpegError, OSError):
        return None
    return None if last is None else round((last - start) * time_base * rate) + 1


def _frames_from_duration(container, stream, rate: Fraction) -> tuple[int, str]:
    if stream.duration is not None and stream.time_base:
        seconds = stream.duration * Fraction(stream.time_base)
    elif container.duration is not None:
        seconds = Fraction(container.duration, av.time_base)
    else:
        return 0, COUNTED_BY_DURATION
    # rounded, not floored: a duration stored in milliseconds is off by a fraction of a frame
    return int(math.floor(seconds * rate + Fraction(1, 2))), COUNTED_BY_DURATION


class RangedFile(io.RawIOBase):
    """A remote object as a seekable read-only file. Reads are served from blocks of
    ``BLOCK_BYTES``, each fetched once by a ranged GET (the missing blocks of one read in one
    request): a demuxer reads the header, seeks to the index at the end and back, and would
    fetch the same bytes again on every seek. A failed read's error is kept in ``failure``:
    PyAV turns an exception in a read into its own."""

    def __init__(self, storage: Storage, name: str, size: int):
        self.storage, self.name, self.size = storage, name, size
        self.position = 0
        self.blocks: OrderedDict[int, bytes] = OrderedDict()
        self.failure: OSError | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer) -> int:
        length = min(len(buffer), self.size - self.position)
        if length <= 0:
            return 0
        first, last = self.position // BLOCK_BYTES, (self.position + length - 1) // BLOCK_BYTES
        missing = [block for block in range(first, last + 1) if block not in self.blocks]
        if missing:
            self._fetch(missing[0], missing[-1])
        data = b"".join(self.blocks[block] for block in range(first, last + 1))
        skip = self.position - first * BLOCK_BYTES
        buffer[:length] = data[skip:skip + length]
        self.position += length
        return length

    def _fetch(self, first: int, last: int) -> None:
        start, end = first * BLOCK_BYTES, min((last + 1) * BLOCK_BYTES, self.size)
        try:
            data = self.storage.read_range(self.name, start, end - start)
        except OSError as exc:  # StorageError, or FileNotFoundError when it was deleted
            self.failure = exc
            raise
        for block in range(first, last + 1):
            at = (block - first) * BLOCK_BYTES
            self.blocks[block] = data[at:at + BLOCK_BYTES]
            self.blocks.move_to_end(block)
        while len(self.blocks) > MAX_BLOCKS:
            self.blocks.popitem(last=False)


def probe_stored_clip(storage: Storage, name: str, size: int) -> ClipProbe:
    """Probe one clip of ``storage``: by path when local, by ranged reads when remote."""
    path = storage.local_path(name)
    if path is not None:
        return probe_clip(str(path), size)
    ranged = RangedFile(storage, name, size)
    with ranged:
        return probe_clip(ranged, size, ranged)
