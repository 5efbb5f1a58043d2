"""File names are data: a sample id may hold any bytes the filesystem allows.

On POSIX, ``os.scandir`` decodes a name that is not UTF-8 with 'surrogateescape': each byte that
does not decode becomes one lone surrogate (``b'caf\\xe9.png'`` -> ``'caf\\udce9.png'``). That str
is a lossless, one-to-one escape of the bytes, so it is the sample id as it is (the same on
every rank, in every run, and it opens the file). It only cannot be encoded as UTF-8, so
wherever an id leaves the process it goes through one of these: digests hash the name's own
bytes, text shows them escaped, and JSON escapes the surrogates (common/atomic.py).
"""

from __future__ import annotations


def name_bytes(name: str) -> bytes:
    """The bytes of ``name`` as the filesystem holds them; a UTF-8 name gives its UTF-8, so
    digests of ordinary ids are unchanged."""
    try:
        return name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no filesystem gave us (e.g. a JSON table's "\ud800")
        return name.encode("utf-8", "surrogatepass")


def printable(name: str) -> str:
    """``name`` for messages: bytes that are not UTF-8 written as ``\\xNN`` ('caf\\xe9.png')."""
    return name_bytes(name).decode("utf-8", "backslashreplace")
