"""The framing of a version 4 producer-state snapshot: small fields, then the entries.

A snapshot file and a segment's snapshot section hold the same bytes
(docs/format.md, section 3.1): a magic, the checksum and length of a
msgpack map of fields, the map, then the producer entries section that the
map describes.  The framing exists so that a reader of the log reads the
fields (open transactions, aborted list, clock: what the last stable
offset needs) and never the entries, whose size follows the number of
producer ids of the last ``producer.id.expiration.ms``; only a process that
appends reads the entries, with one ranged read.
"""

from __future__ import annotations

import struct

import crc32c
import msgpack

FRAME_MAGIC = b"TXP\x04"
_FRAME = struct.Struct(">4sII")  # magic, CRC-32C of the fields, fields length
FRAME_SIZE = _FRAME.size  # 12


def frame(fields: dict, entries: bytes) -> bytes:
    """The framed snapshot: ``fields`` (which describe ``entries``), then ``entries``."""
    body = msgpack.packb(fields)
    return _FRAME.pack(FRAME_MAGIC, crc32c.crc32c(body), len(body)) + body + entries


def is_framed(data: bytes | memoryview) -> bool:
    return bytes(data[:4]) == FRAME_MAGIC


def framed_length(data: bytes | memoryview) -> int:
    """Bytes of the frame's head and fields (``data`` holds at least FRAME_SIZE bytes)."""
    return FRAME_SIZE + _FRAME.unpack_from(data, 0)[2]


def unframe(data: bytes | memoryview) -> tuple[dict, int]:
    """The fields of a framed snapshot (``data`` holds at least its head and fields) and
    where its entries section starts, relative to the frame; ValueError if damaged."""
    if len(data) < FRAME_SIZE:
        raise ValueError("snapshot frame truncated")
    magic, crc, length = _FRAME.unpack_from(data, 0)
    if magic != FRAME_MAGIC:
        raise ValueError(f"not a framed snapshot (magic {bytes(magic)!r})")
    body = memoryview(data)[FRAME_SIZE:FRAME_SIZE + length]
    if len(body) != length or crc32c.crc32c(body) != crc:
        raise ValueError("snapshot fields checksum mismatch (or truncated)")
    fields = msgpack.unpackb(body)
    if not isinstance(fields, dict):
        raise ValueError("snapshot fields are not a map")
    return fields, FRAME_SIZE + length
