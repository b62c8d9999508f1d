"""A SHA-256 sealed into a zip archive's comment: checkpoint.pt proves its own bytes before torch.load reads them.

``torch.save`` writes a zip archive; the zip format ends with an end-of-central-directory record whose last field
is the length of an optional archive comment (0 in torch's archives).  ``seal`` sets that comment to
``handgrad-sha256:<hex digest of every byte before the length field>``, so the file is still an ordinary zip
(``torch.load`` reads it as before, ``unzip -z`` prints the comment) and ``unseal`` finds the digest in the last
bytes of the file, with no second file to keep in step with it.
"""

from __future__ import annotations

import hashlib
import struct

PREFIX = b"handgrad-sha256:"
COMMENT = len(PREFIX) + 64  # the comment: prefix and 64 hex digits
_EOCD = b"PK\x05\x06"  # the end-of-central-directory signature
_TAIL = 2 + COMMENT  # the comment-length field and the comment
SEAL_BYTES = COMMENT  # how many bytes ``seal`` adds to an archive


class ChecksumMismatch(ValueError):
    """The bytes are not those the digest was computed over (damaged, or edited without resealing)."""


def seal(archive: bytes) -> bytes:
    """``archive`` (as torch.save wrote it, without a comment) with its SHA-256 as the archive comment."""
    if archive[-22:-18] != _EOCD or archive[-2:] != b"\0\0":
        raise ValueError("seal: not a zip archive ending in an end-of-central-directory record without a comment")
    body = archive[:-2]
    return body + struct.pack("<H", COMMENT) + PREFIX + hashlib.sha256(body).hexdigest().encode()


def ends_whole(data: bytes) -> bool:
    """Whether ``data`` ends as a zip archive does: an end-of-central-directory record followed by exactly the
    comment its last field announces.  A file cut short (a copy or download stopped early) does not."""
    at = data.rfind(_EOCD, max(0, len(data) - 22 - 0xFFFF))
    return at >= 0 and len(data) >= at + 22 and at + 22 + struct.unpack("<H", data[at + 20 : at + 22])[0] == len(data)


def digest(data: bytes) -> str | None:
    """The digest a sealed file carries, or None if it carries none."""
    if len(data) < _TAIL + 20 or data[-COMMENT:-64] != PREFIX or data[-_TAIL:-COMMENT] != struct.pack("<H", COMMENT):
        return None
    return data[-64:].decode("ascii", errors="replace")


def unseal(data: bytes) -> str | None:
    """Check sealed bytes against their digest; -> the digest, or None for bytes that carry none (an older file).

    Raises ChecksumMismatch naming both digests when the bytes were changed after they were sealed.
    """
    expected = digest(data)
    if expected is None:
        return None
    actual = hashlib.sha256(data[:-_TAIL]).hexdigest()
    if actual != expected:
        raise ChecksumMismatch(f"its SHA-256 is {_differing(actual, expected)}")
    return expected


def _differing(actual: str, expected: str) -> str:
    """Both digests, cut 8 hex digits past the first that differs (at least 16 shown), and that digit's position:
    a digest edited past its 16th digit no longer shows as two equal prefixes."""
    first = next(i for i, (a, b) in enumerate(zip(actual, expected, strict=True)) if a != b)
    n = max(16, first + 9)

    def cut(d: str) -> str:
        return d if n >= len(d) else d[:n] + "..."

    return f"{cut(actual)}, not the {cut(expected)} written with it (they first differ at hex digit {first + 1} of 64)"
