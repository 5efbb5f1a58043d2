"""Image sizes from file headers, never a full decode (probe_pool.py reads many in parallel).

Pillow's ``Image.open`` parses only the header; the pixel data is decoded by ``load()``, which is
never called here except to confirm a file whose end marker is missing (see ``probe_image``).
EXIF orientations 5-8 rotate the picture by 90 degrees, so width and height are swapped: a
portrait photo stored landscape is bucketed as portrait.
"""

from __future__ import annotations

import io
import os
import stat
from dataclasses import dataclass

from PIL import Image

from simpletuner.helpers.data_backend.storage import special_file_reason

ORIENTATION_TAG = 0x0112
_ROTATED_ORIENTATIONS = frozenset({5, 6, 7, 8})
_IMAGE_SIGNATURES = (
    b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"BM", b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+",
)
_TAIL_BYTES = 4096

ZERO_BYTE = "zero-byte file"
NOT_AN_IMAGE = "not an image"
BAD_HEADER = "truncated or unreadable header"
TRUNCATED_DATA = "truncated image data"
VANISHED = "deleted while the dataset was being read"


def over_bomb_limit(max_pixels: int) -> str:
    return f"over Pillow's decompression-bomb limit (Image.MAX_IMAGE_PIXELS = {max_pixels})"


@dataclass(frozen=True)
class Probe:
    """What a header says: the EXIF-oriented size, or why the file cannot be used."""

    width: int = 0
    height: int = 0
    error: str | None = None


@dataclass(frozen=True)
class ClipProbe:
    """A clip as discovery sees it, or why it is skipped (``error``); clip_probe.py reads it
    with PyAV, which image datasets never import, so the type lives here with Probe."""

    width: int = 0            # as displayed (rotation applied)
    height: int = 0
    frames: int = 0           # frames in the first video stream
    fps: str = ""             # exact frame rate, 'num/den' (30000/1001 stays exact)
    counted_by: str = ""      # COUNTED_BY_CONTAINER or COUNTED_BY_DURATION
    error: str | None = None


def _looks_like_image(head: bytes) -> bool:
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return True
    return any(head.startswith(sig) for sig in _IMAGE_SIGNATURES)


def _orientation(im: Image.Image) -> int:
    # Image.Image.getexif reads only what the header parse stored; PNG's own override would
    # decode the whole image to look for an eXIf chunk after the pixel data.
    try:
        value = Image.Image.getexif(im).get(ORIENTATION_TAG, 1)
        return int(value)
    except Exception:  # a malformed EXIF block: the trainer's exif_transpose ignores it too
        return 1


def _end_marker_present(handle, image_format: str | None, file_size: int, head: bytes) -> bool:
    """Cheap truncation check from the file's tail; True where the format has no check."""
    if image_format == "WEBP":  # the RIFF header states the file length
        return int.from_bytes(head[4:8], "little") + 8 <= file_size
    if image_format == "BMP":  # so does the BMP header (0 when the writer left it out)
        return int.from_bytes(head[2:6], "little") <= file_size
    if image_format in ("JPEG", "MPO"):
        marker = b"\xff\xd9"
    elif image_format == "PNG":
        marker = b"IEND"
    else:
        return True
    handle.seek(max(0, file_size - _TAIL_BYTES))
    return marker in handle.read(_TAIL_BYTES)


def _decodes(source) -> bool:
    try:
        with Image.open(source) as im:
            im.load()
        return True
    except Exception:
        return False


def probe_image(path: str, max_pixels: int | None) -> Probe:
    """Size of one image from its header, or the reason it is skipped."""
    try:
        # Non-blocking: a named pipe put in place of a listed file must not wait for a writer.
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            if not stat.S_ISREG(mode):
                return Probe(error=special_file_reason(mode))
            head = handle.read(16)
            if not head:
                return Probe(error=ZERO_BYTE)
            file_size = os.fstat(handle.fileno()).st_size
            handle.seek(0)
            try:
                width, height, orientation, image_format = _header(handle)
            except Image.DecompressionBombError:
                return _over_limit(max_pixels)
            except Exception:  # Pillow's plugins raise many kinds on malformed headers
                return Probe(error=BAD_HEADER if _looks_like_image(head) else NOT_AN_IMAGE)
            checked = _checked_size(width, height, max_pixels)
            if checked.error:
                return checked
            # A missing end marker is only a suspicion (some writers append data after it),
            # so such a file is decoded once to be sure. Complete files never are.
            complete = _end_marker_present(handle, image_format, file_size, head)
            if not complete and not _decodes(path):
                return Probe(error=TRUNCATED_DATA)
    except OSError as exc:
        return Probe(error=f"cannot be read ({exc.strerror or exc})")
    if orientation in _ROTATED_ORIENTATIONS:
        width, height = height, width
    return Probe(width, height)


_WEBP_EXIF_FLAG = 0x08  # VP8X: an EXIF chunk (which may rotate) is present


def webp_size(head: bytes) -> tuple[int, int] | None:
    """A WebP's canvas size from its first 30 bytes, as libwebp reads it; None when the file
    carries EXIF (usually at its end) or the header is not one of the three kinds. Pillow
    wants the whole file for a WebP, which for a remote object means fetching all of it."""
    if len(head) < 30 or head[:4] != b"RIFF" or head[8:12] != b"WEBP":
        return None
    kind = head[12:16]
    if kind == b"VP8X" and not head[20] & _WEBP_EXIF_FLAG:
        return (int.from_bytes(head[24:27], "little") + 1,
                int.from_bytes(head[27:30], "little") + 1)
    if kind == b"VP8 " and head[23:26] == b"\x9d\x01\x2a":
        return (int.from_bytes(head[26:28], "little") & 0x3FFF,
                int.from_bytes(head[28:30], "little") & 0x3FFF)
    if kind == b"VP8L" and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


def probe_head(head: bytes, file_size: int, max_pixels: int | None) -> Probe | None:
    """Size from the first bytes of a remote file; None when they end before its header does
    (read more and ask again). A file read whole gets probe_image's truncation check too; for
    a partial read that check would cost another request, so truncated data is found when the
    latent cache decodes the image, which drops it on every rank alike."""
    if file_size == 0:
        return Probe(error=ZERO_BYTE)
    complete = len(head) >= file_size
    webp = None if complete else webp_size(head)
    if webp is not None:
        return _checked_size(*webp, max_pixels)
    handle = io.BytesIO(head)
    try:
        width, height, orientation, image_format = _header(handle)
    except Image.DecompressionBombError:
        return _over_limit(max_pixels)
    except Exception:  # Pillow's plugins raise many kinds on malformed or cut-off headers
        if not complete:
            return None
        return Probe(error=BAD_HEADER if _looks_like_image(head[:16]) else NOT_AN_IMAGE)
    checked = _checked_size(width, height, max_pixels)
    if checked.error:
        return checked
    if (complete and not _end_marker_present(handle, image_format, file_size, head[:16])
            and not _decodes(io.BytesIO(head))):
        return Probe(error=TRUNCATED_DATA)
    if orientation in _ROTATED_ORIENTATIONS:
        width, height = height, width
    return Probe(width, height)


def _header(handle) -> tuple[int, int, int, str | None]:
    """(width, height, EXIF orientation, format) from what Pillow reads of the header."""
    with Image.open(handle) as im:
        width, height = im.size
        return width, height, _orientation(im), im.format


def _over_limit(max_pixels: int | None) -> Probe:
    return Probe(error=over_bomb_limit(max_pixels or Image.MAX_IMAGE_PIXELS or 0))


def _checked_size(width: int, height: int, max_pixels: int | None) -> Probe:
    if width <= 0 or height <= 0:
        return Probe(error=BAD_HEADER)
    if max_pixels is not None and width * height > max_pixels:
        return Probe(error=over_bomb_limit(max_pixels))
    return Probe(width, height)
