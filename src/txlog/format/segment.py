"""Segment objects: a run of consecutive batches of one partition in one object.

A log fed by a streaming query writes a small batch object every few
seconds; compaction (partition/compaction.py) copies a run of them, byte for byte,
into one segment and retires the batch objects.  The segment carries what a
process would otherwise rebuild from every batch header of the run: an
offset index (where each batch starts), a time index (the largest timestamp
up to each data batch), the transactions aborted inside it and the producer
state at its end.  Batches keep their own header and both checksums, so
everything that checks a batch checks it the same way inside a segment.

The bytes are described in docs/format.md, section 4.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import crc32c
import msgpack
import numpy as np
import pyarrow as pa

from .batch import BatchHeader
from .snapshot_frame import FRAME_SIZE, framed_length, is_framed, unframe
from ..errors import CorruptBatchError
from ..storage.contract import Storage

SEGMENT_MAGIC = b"TXS\x01"
# magic, header crc, base, end, batch count, data batch count, topic id, created ms,
# snapshot length, snapshot crc, aborted count, aborted crc, offset index crc,
# time index crc, data length
_HEADER = struct.Struct(">4sI qqII16sq IIIIII Q")
HEADER_SIZE = _HEADER.size  # 88
HEAD_READ_SIZE = 64 * 1024  # the header and, for a few hundred producers, the snapshot
OFFSET_ENTRY = np.dtype([("base", ">i8"), ("position", ">u8"), ("size", ">u8")])  # 24 bytes
TIME_ENTRY = np.dtype([("max_timestamp", ">i8"), ("base", ">i8")])  # 16 bytes
ABORTED_ENTRY = np.dtype([("producer_id", ">i8"), ("first", ">i8"), ("last", ">i8")])  # 24 bytes


class CorruptSegmentError(CorruptBatchError):
    """A segment whose bytes do not hold what its header promises."""


@dataclass(frozen=True, slots=True)
class SegmentHead:
    """What the first bytes of a segment say: its range, section sizes and producer state."""

    path: str
    base_offset: int
    end_offset: int
    batch_count: int
    data_batch_count: int
    topic_id: str
    created_ms: int
    snapshot_length: int
    snapshot_crc: int
    aborted_count: int
    aborted_crc: int
    index_crc: int  # of the offset index
    time_index_crc: int
    data_length: int
    anchor: bytes  # magic and header checksum: what identifies this object

    @property
    def snapshot_start(self) -> int:
        return HEADER_SIZE

    @property
    def aborted_start(self) -> int:
        return HEADER_SIZE + self.snapshot_length

    @property
    def index_start(self) -> int:
        return self.aborted_start + self.aborted_count * ABORTED_ENTRY.itemsize

    @property
    def index_length(self) -> int:
        """Both indexes: the offset index, then the time index."""
        return self.offset_index_length + self.data_batch_count * TIME_ENTRY.itemsize

    @property
    def offset_index_length(self) -> int:
        return self.batch_count * OFFSET_ENTRY.itemsize

    @property
    def time_index_start(self) -> int:
        return self.index_start + self.offset_index_length

    @property
    def data_start(self) -> int:
        return self.index_start + self.index_length

    @property
    def total_length(self) -> int:
        return self.data_start + self.data_length


@dataclass(frozen=True, slots=True)
class SegmentIndex:
    """The offset index of one segment, as arrays to bisect."""

    bases: np.ndarray  # int64, strictly increasing, bases[0] == base_offset
    positions: np.ndarray  # int64, from the segment's start
    sizes: np.ndarray  # int64

    def find(self, offset: int) -> int:
        """Index of the batch holding ``offset`` (logarithmic)."""
        return int(np.searchsorted(self.bases, offset, side="right")) - 1


@dataclass(frozen=True, slots=True)
class TimeIndex:
    """The time index of one segment: read only by lookups by time and retention."""

    max_timestamps: np.ndarray  # int64, running maximum over data batches
    bases: np.ndarray  # int64, the data batch each entry describes

    def first_reaching(self, timestamp_ms: int) -> int | None:
        """Base of the first data batch whose records reach ``timestamp_ms``, if any."""
        i = int(np.searchsorted(self.max_timestamps, timestamp_ms, side="left"))
        return int(self.bases[i]) if i < len(self.bases) else None

    @property
    def newest(self) -> int | None:
        """The largest timestamp of the segment's data batches (None without data)."""
        return int(self.max_timestamps[-1]) if len(self.max_timestamps) else None


class AbortedRange(Protocol):
    """An aborted transaction as the producer state keeps it (partition/producer_state.py).

    Read-only properties, so that the state's frozen records match."""

    @property
    def producer_id(self) -> int: ...
    @property
    def first_offset(self) -> int: ...
    @property
    def last_offset(self) -> int: ...


def encode_segment(topic_id: str, base_offset: int,
                   batches: list[tuple[BatchHeader, bytes | pa.Buffer]], state_end: int,
                   state_aborted: Iterable[AbortedRange], snapshot_fields: dict | bytes,
                   created_ms: int) -> bytes:
    """A segment holding ``batches`` (headers and their whole bytes, consecutive from
    ``base_offset``) and the producer state at their end: where it ends, the transactions
    it knows aborted, and its snapshot (``snapshot_fields``: a framed version 4 snapshot,
    or older fields as a map)."""
    head = encode_segment_head(topic_id, base_offset,
                               [(h, len(memoryview(d))) for h, d in batches], state_end,
                               state_aborted, snapshot_fields, created_ms)
    return b"".join([head, *(data for _, data in batches)])


def encode_segment_head(topic_id: str, base_offset: int,
                        batches: list[tuple[BatchHeader, int]], state_end: int,
                        state_aborted: Iterable[AbortedRange], snapshot_fields: dict | bytes,
                        created_ms: int) -> bytes:
    """Every byte of a segment before its data: header, snapshot, aborted section and
    indexes, from the batches' headers and inline sizes alone.

    The data section comes last in the layout, so a compactor that knows the
    headers can write this first and then stream the batches' bytes behind it
    one at a time (compaction.py), never holding the whole run; the segment is
    ``encode_segment``'s, byte for byte.
    """
    if not batches or batches[0][0].base_offset != base_offset:
        raise ValueError("a segment starts with the batch at its base offset")
    sizes = np.fromiter((size for _, size in batches), dtype=np.int64, count=len(batches))
    offsets = np.zeros(len(batches), dtype=OFFSET_ENTRY)
    offsets["base"] = [h.base_offset for h, _ in batches]
    offsets["size"] = sizes
    data_headers = [h for h, _ in batches if not h.is_control]
    times = np.zeros(len(data_headers), dtype=TIME_ENTRY)
    times["max_timestamp"] = np.maximum.accumulate(
        np.array([h.max_timestamp for h in data_headers], dtype=np.int64)) \
        if data_headers else []
    times["base"] = [h.base_offset for h in data_headers]
    end = batches[-1][0].next_offset
    if state_end != end:
        raise ValueError(f"producer state ends at {state_end}, the batches at {end}")
    aborted = [a for a in state_aborted if base_offset <= a.last_offset < end]
    aborted_arr = np.zeros(len(aborted), dtype=ABORTED_ENTRY)
    aborted_arr["producer_id"] = [a.producer_id for a in aborted]
    aborted_arr["first"] = [a.first_offset for a in aborted]
    aborted_arr["last"] = [a.last_offset for a in aborted]
    snapshot = snapshot_fields if isinstance(snapshot_fields, bytes) else \
        msgpack.packb(snapshot_fields)
    return _head(base_offset, end, topic_id, created_ms, snapshot, crc32c.crc32c(snapshot),
                 aborted_arr, offsets, times)


def _head(base_offset: int, end_offset: int, topic_id: str, created_ms: int, snapshot: bytes,
          snapshot_crc: int, aborted: np.ndarray, offsets: np.ndarray, times: np.ndarray
          ) -> bytes:
    """Header and sections of a segment whose offset index has its bases and sizes: the
    positions follow from the sections' lengths, the header from their checksums."""
    aborted_bytes = aborted.tobytes()
    start = HEADER_SIZE + len(snapshot) + len(aborted_bytes) + \
        len(offsets) * OFFSET_ENTRY.itemsize + len(times) * TIME_ENTRY.itemsize
    sizes = offsets["size"].astype(np.int64)
    offsets["position"] = start + np.concatenate(([0], np.cumsum(sizes)[:-1]))
    offset_index, time_index = offsets.tobytes(), times.tobytes()
    fields = _HEADER.pack(
        SEGMENT_MAGIC, 0, base_offset, end_offset, len(offsets), len(times),
        bytes.fromhex(topic_id), created_ms, len(snapshot), snapshot_crc, len(aborted),
        crc32c.crc32c(aborted_bytes), crc32c.crc32c(offset_index), crc32c.crc32c(time_index),
        int(sizes.sum()))
    header = fields[:4] + crc32c.crc32c(fields[8:]).to_bytes(4, "big") + fields[8:]
    return b"".join([header, snapshot, aborted_bytes, offset_index, time_index])


def decode_head(data: bytes | memoryview, path: str, url: str, base_offset: int) -> SegmentHead:
    """The fixed header of a segment, checked (``data`` holds at least its first bytes)."""
    if len(data) < HEADER_SIZE:
        raise CorruptSegmentError("segment header truncated", url, base_offset)
    (magic, crc, base, end, count, data_count, topic_id, created, snap_len, snap_crc,
     aborted_count, aborted_crc, index_crc, time_index_crc, data_length) = \
        _HEADER.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC:
        raise CorruptSegmentError(f"not a segment (magic {magic!r})", url, base_offset)
    if crc32c.crc32c(bytes(data[8:HEADER_SIZE])) != crc:
        raise CorruptSegmentError("segment header checksum mismatch", url, base_offset)
    if base != base_offset:
        raise CorruptSegmentError(f"segment header says base offset {base}, its name "
                                  f"{base_offset}", url, base_offset)
    if end <= base or count < 1 or data_count > count or count > end - base:
        raise CorruptSegmentError(f"inconsistent segment header (offsets {base} to {end}, "
                                  f"{count} batches)", url, base_offset)
    return SegmentHead(path, base, end, count, data_count, topic_id.hex(), created, snap_len,
                       snap_crc, aborted_count, aborted_crc, index_crc, time_index_crc,
                       data_length, bytes(data[:8]))


def _section(data: bytes | pa.Buffer, start: int, length: int, crc: int, what: str, url: str,
             base: int) -> bytes:
    piece = memoryview(data)[start:start + length]
    if len(piece) != length or crc32c.crc32c(piece) != crc:
        raise CorruptSegmentError(f"segment {what} checksum mismatch (or truncated)", url, base)
    return bytes(piece)


def read_header(storage: Storage, path: str, url: str, base_offset: int) -> SegmentHead:
    """The fixed header alone (where a segment ends), without the snapshot."""
    return decode_head(storage.read_prefix(path, HEADER_SIZE), path, url, base_offset)


def read_head(storage: Storage, path: str, url: str, base_offset: int
              ) -> tuple[SegmentHead, dict]:
    """The header and the producer-state snapshot fields of a segment (one read, usually).

    A framed (version 4) snapshot's fields are read and checked without its
    producer entries section (format.md 3.1): the fields get ``_entries_at``,
    where the section starts in the object (added here, never stored).
    FileNotFoundError if the segment is gone (retention).
    """
    data = storage.read_prefix(path, HEAD_READ_SIZE)
    head = decode_head(data, path, url, base_offset)
    if head.snapshot_length >= FRAME_SIZE and is_framed(
            memoryview(data)[HEADER_SIZE:HEADER_SIZE + FRAME_SIZE]):
        length = framed_length(memoryview(data)[HEADER_SIZE:])
        if length > head.snapshot_length:
            raise CorruptSegmentError("segment snapshot fields overrun the section", url,
                                      base_offset)
        if len(data) < HEADER_SIZE + length:
            data = storage.read_prefix(path, HEADER_SIZE + length)
        try:
            fields, entries_at = unframe(memoryview(data)[HEADER_SIZE:HEADER_SIZE + length])
        except ValueError as exc:
            raise CorruptSegmentError(f"segment snapshot: {exc}", url, base_offset) from None
        fields["_entries_at"] = HEADER_SIZE + entries_at
        return head, fields
    if len(data) < HEADER_SIZE + head.snapshot_length:
        data = storage.read_prefix(path, HEADER_SIZE + head.snapshot_length)
    snapshot = _section(data, HEADER_SIZE, head.snapshot_length, head.snapshot_crc, "snapshot",
                        url, base_offset)
    fields = msgpack.unpackb(snapshot)
    if not isinstance(fields, dict):
        raise CorruptSegmentError("segment snapshot is not a map", url, base_offset)
    return head, fields


def read_index(storage: Storage, head: SegmentHead, url: str) -> SegmentIndex:
    """The offset index of a segment (not its time index), checked against its header."""
    raw = storage.read_range(head.path, head.index_start, head.offset_index_length)
    data = _section(raw, 0, head.offset_index_length, head.index_crc, "offset index", url,
                    head.base_offset)
    offsets = np.frombuffer(data, dtype=OFFSET_ENTRY, count=head.batch_count)
    bases = offsets["base"].astype(np.int64)
    positions = offsets["position"].astype(np.int64)
    sizes = offsets["size"].astype(np.int64)
    ends = positions + sizes
    if (bases[0] != head.base_offset or np.any(np.diff(bases) <= 0) or bases[-1] >= head.end_offset
            or positions[0] != head.data_start or np.any(positions[1:] != ends[:-1])
            or ends[-1] != head.total_length):
        raise CorruptSegmentError("segment offset index does not describe its data", url,
                                  head.base_offset)
    return SegmentIndex(bases, positions, sizes)


def read_aborted(storage: Storage, head: SegmentHead, url: str) -> np.ndarray:
    """The aborted section of a segment (ABORTED_ENTRY rows: the transactions whose ABORT
    marker lies in the segment), checked against its checksum."""
    length = head.aborted_count * ABORTED_ENTRY.itemsize
    if not length:
        return np.zeros(0, dtype=ABORTED_ENTRY)
    raw = storage.read_range(head.path, head.aborted_start, length)
    data = _section(raw, 0, length, head.aborted_crc, "aborted list", url, head.base_offset)
    return np.frombuffer(data, dtype=ABORTED_ENTRY, count=head.aborted_count)


def read_time_index(storage: Storage, head: SegmentHead, index: SegmentIndex,
                    url: str) -> TimeIndex:
    """The time index of a segment, checked against its header and offset index."""
    length = head.data_batch_count * TIME_ENTRY.itemsize
    raw = storage.read_range(head.path, head.time_index_start, length)
    data = _section(raw, 0, length, head.time_index_crc, "time index", url, head.base_offset)
    times = np.frombuffer(data, dtype=TIME_ENTRY, count=head.data_batch_count)
    max_ts = times["max_timestamp"].astype(np.int64)
    bases = times["base"].astype(np.int64)
    if np.any(np.diff(max_ts) < 0) or np.any(np.diff(bases) <= 0) or \
            not np.all(np.isin(bases, index.bases)):
        raise CorruptSegmentError("segment time index is not monotonic or names batches the "
                                  "offset index does not have", url, head.base_offset)
    return TimeIndex(max_ts, bases)


@dataclass(frozen=True, slots=True)
class MergeInput:
    """One segment of a merge, as read back: its header and sections (its batches are
    streamed behind the merged head, never held together: segment_merge.py)."""

    head: SegmentHead
    aborted: np.ndarray  # ABORTED_ENTRY rows
    index: SegmentIndex
    times: TimeIndex


def encode_merged_head(inputs: list[MergeInput], snapshot: bytes, snapshot_crc: int) -> bytes:
    """Every byte before the data of one segment holding the batches of adjacent segments
    ``inputs`` (oldest first); their data sections, back to back, complete it.

    Nothing is re-derived from the batches: the sections are the inputs'
    joined (offset index rebased to the new data start, time index kept a
    running maximum across the joins, aborted sections in order), and the
    snapshot is the newest input's bytes, since it is the producer state at
    the merged segment's end.  ``created_ms`` is the newest input's, so a
    merge does not make old marker-only segments look young to retention.
    """
    first, last = inputs[0].head, inputs[-1].head
    for a, b in zip(inputs, inputs[1:]):
        if a.head.end_offset != b.head.base_offset:
            raise ValueError(f"segments at {a.head.base_offset} and {b.head.base_offset} "
                             "are not adjacent")
    aborted = np.concatenate([i.aborted for i in inputs]).astype(ABORTED_ENTRY)
    sizes = np.concatenate([i.index.sizes for i in inputs])
    offsets = np.zeros(len(sizes), dtype=OFFSET_ENTRY)
    offsets["base"] = np.concatenate([i.index.bases for i in inputs])
    offsets["size"] = sizes
    times = np.zeros(sum(len(i.times.bases) for i in inputs), dtype=TIME_ENTRY)
    if len(times):
        times["max_timestamp"] = np.maximum.accumulate(
            np.concatenate([i.times.max_timestamps for i in inputs]))
        times["base"] = np.concatenate([i.times.bases for i in inputs])
    return _head(first.base_offset, last.end_offset, last.topic_id, last.created_ms, snapshot,
                 snapshot_crc, aborted, offsets, times)
