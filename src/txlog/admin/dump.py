"""What ``txlog dump`` shows of a partition: Kafka's kafka-dump-log for txlog.

A dump must work on a damaged log, where the normal read path refuses: it
lists a partition's segments and batch objects by name (not through the
producer state, which a broken chain stops) and decodes each object on its
own, reporting a failed check as a problem of that object instead of
raising.  A segment is read in one piece and walked batch by batch from its
header's lengths, not through its offset index, so that ``txlog verify``
can hold the index against what the segment really holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TypedDict

import crc32c

import msgpack
import numpy as np
import pyarrow as pa

from ..format.batch import (COMMIT, BatchHeader, ControlRecord, check_claim, decode_control,
                            decode_header, decode_records, payload_of, referenced_payload)
from ..errors import CorruptBatchError, StorageError
from ..format.snapshot_frame import is_framed, unframe
from ..format.segment import (ABORTED_ENTRY, HEADER_SIZE, OFFSET_ENTRY, SEGMENT_MAGIC, TIME_ENTRY,
                              SegmentHead, decode_head)
from ..partition.state_manager import ANCHOR_BYTES
from ..root.root import Root
from ..storage.contract import Storage
from ..storage.paths import (BATCH_SUFFIX, SEGMENT_SUFFIX, batch_path, named_offsets, partition_dir,
                             listed_segment_names, segments_dir)

RELISTS = 5  # listings of one partition in one dump before giving up (it keeps changing)


@dataclass(frozen=True)
class BatchDump:
    path: str
    size: int
    header: BatchHeader | None  # None when the header itself is unreadable
    control: ControlRecord | None = None  # the marker of a control batch
    problem: str | None = None  # the first failed check; None: every checksum is valid
    records: pa.Table | None = None
    position: int | None = None  # where it starts inside a segment; None: its own object
    base: int | None = None  # the offset its object or index entry names, if any
    anchor: bytes | None = None  # its first bytes (magic, header checksum): what names it

    @property
    def marker(self) -> str | None:
        if self.control is None:
            return None
        return "COMMIT" if self.control.type == COMMIT else "ABORT"

    @property
    def where(self) -> str:
        """The object and, inside a segment, the offset and position: what a problem names."""
        if self.position is None:
            return self.path
        base = self.header.base_offset if self.header is not None else self.base
        return f"{self.path} offset {base} (position {self.position})"

    def as_dict(self) -> dict[str, object]:
        """The batch as a JSON-ready map (header fields under Kafka's names)."""
        out: dict[str, object] = {"kind": "batch", "path": self.path}
        if self.position is not None:
            out["position"] = self.position
        out.update({"size": self.size, "valid": self.problem is None})
        if self.problem is not None:
            out["problem"] = self.problem
        h = self.header
        if h is not None:
            out.update({
                "baseOffset": h.base_offset, "lastOffset": h.last_offset,
                "count": h.record_count, "producerId": h.producer_id,
                "producerEpoch": h.producer_epoch, "baseSequence": h.base_sequence,
                "lastSequence": h.last_sequence, "isTransactional": h.is_transactional,
                "isControl": h.is_control, "marker": self.marker,
                "timestampType": "LogAppendTime" if h.timestamp_type else "CreateTime",
                "baseTimestamp": h.base_timestamp, "maxTimestamp": h.max_timestamp,
                "compression": h.compression or "none", "transactionalId": h.transactional_id,
                "decisionId": h.decision_id, "payloadCrc": h.payload_crc})
        return out


@dataclass(frozen=True)
class SegmentDump:
    """A segment as stored: its header, its sections as they decode, and its batches.

    ``offset_index``, ``time_index`` and ``aborted`` are the sections' entries
    even when their checksum fails (None only when the header does not say
    where they are), so a verifier can say which entry disagrees.
    """

    path: str
    size: int
    head: SegmentHead | None  # None when the header itself is unreadable
    problems: list[str] = field(default_factory=list)
    checksums: dict[str, bool] = field(default_factory=dict)  # header, snapshot, aborted, index
    snapshot: dict | None = None  # the producer-state fields, when they decode to a map
    aborted: np.ndarray | None = None  # ABORTED_ENTRY
    offset_index: np.ndarray | None = None  # OFFSET_ENTRY
    time_index: np.ndarray | None = None  # TIME_ENTRY
    batches: list[BatchDump] = field(default_factory=list)
    entries: bytes = b""  # a framed (version 4) snapshot's producer entries section

    @property
    def problem(self) -> str | None:
        return self.problems[0] if self.problems else None

    def as_dict(self) -> dict[str, object]:
        """The segment's header as a JSON-ready map (its batches are dumped on their own)."""
        out: dict[str, object] = {"kind": "segment", "path": self.path, "size": self.size,
                                  "valid": not self.problems}
        if self.problems:
            out["problems"] = self.problems
        h = self.head
        if h is not None:
            out.update({
                "baseOffset": h.base_offset, "endOffset": h.end_offset,
                "batchCount": h.batch_count, "dataBatchCount": h.data_batch_count,
                "topicId": h.topic_id, "createdMs": h.created_ms,
                "snapshotBytes": h.snapshot_length, "abortedCount": h.aborted_count,
                "abortedBytes": h.aborted_count * ABORTED_ENTRY.itemsize,
                "indexBytes": h.index_length, "dataBytes": h.data_length})
        out.update({f"{k}CrcValid": v for k, v in self.checksums.items()})
        return out


@dataclass(frozen=True)
class StrayDump:
    """A batch object below the compacted end: not part of the log.

    A leftover that compaction is deleting, or a stray that a writer
    published into a slot compaction had just retired; no reader uses it.
    """

    path: str
    base: int
    compacted_end: int

    def as_dict(self) -> dict[str, object]:
        return {"kind": "stray", "path": self.path, "baseOffset": self.base,
                "compactedEnd": self.compacted_end, "partOfLog": False}


def _url(storage: Storage, path: str) -> str:
    return f"{storage.url.rstrip('/')}/{path}"


def _name_offset(path: str, suffix: str) -> int | None:
    name = path.rsplit("/", 1)[-1]
    stem = name[:-len(suffix)] if name.endswith(suffix) else ""
    if suffix == SEGMENT_SUFFIX and "-" in stem:  # a merged segment: <base>-<end>
        stem = stem.split("-", 1)[0]
    return int(stem) if stem.isdigit() else None


class _Where(TypedDict):
    """Where a batch was found: the BatchDump fields every outcome of decoding shares."""

    position: int | None
    base: int | None
    anchor: bytes


def _dump_batch(data: memoryview | pa.Buffer, path: str, url: str, expected: int | None,
                with_records: bool, position: int | None = None,
                storage: Storage | None = None) -> BatchDump:
    """One batch's bytes decoded, both checksums checked (and its records with ``with_records``).

    A claim (a batch object holding only its header, format.md 2.7) is followed
    into its data object when ``storage`` is given.
    """
    size = len(data)
    where: _Where = {"position": position, "base": expected, "anchor": bytes(data[:ANCHOR_BYTES])}
    try:
        header = decode_header(data, url, expected)
    except CorruptBatchError as exc:
        return BatchDump(path, size, None, problem=exc.reason, **where)
    try:
        if storage is not None and header.is_claim and position is None:
            check_claim(data, header, url)
            try:
                payload = referenced_payload(storage.read_range(
                    header.data_path, header.data_offset, header.payload_length), header, url)
            except FileNotFoundError:
                raise CorruptBatchError(f"data object {header.data_path} of this claim is "
                                        "missing", url, header.base_offset) from None
            if header.is_control:
                return BatchDump(path, size, header, decode_control(payload, header, url),
                                 **where)
            records = decode_records(payload, header, url) if with_records else None
            return BatchDump(path, size, header, records=records, **where)
        payload = payload_of(data, header, url)
        if header.is_control:
            return BatchDump(path, size, header, decode_control(payload, header, url), **where)
        records = decode_records(payload, header, url) if with_records else None
    except CorruptBatchError as exc:
        return BatchDump(path, size, header, problem=exc.reason, **where)
    return BatchDump(path, size, header, records=records, **where)


def _section(view: memoryview, start: int, length: int, crc: int) -> tuple[memoryview, bool]:
    piece = view[start:start + length]
    return piece, len(piece) == length and crc32c.crc32c(piece) == crc


def decode_segment(data: pa.Buffer | bytes, path: str, url: str, base: int | None,
                   with_records: bool = False, start: int = 0) -> SegmentDump:
    """A segment's header, sections and batches, every failed check a problem, none raised.

    Batches ending at or before ``start`` are walked past (their headers only).
    """
    view = memoryview(data)
    if len(view) >= HEADER_SIZE and base is None:
        base = int.from_bytes(view[8:16], "big", signed=True)  # an object not named by its base
    try:
        head = decode_head(view, path, url, -1 if base is None else base)
    except CorruptBatchError as exc:
        return SegmentDump(path, len(view), None, [exc.reason], {"header": False})
    problems: list[str] = []
    if len(view) != head.total_length:
        problems.append(f"segment is {len(view)} bytes, its header promises {head.total_length}")
    snap, snap_ok = _section(view, head.snapshot_start, head.snapshot_length,
                                 head.snapshot_crc)
    aborted, aborted_ok = _section(view, head.aborted_start,
                                   head.aborted_count * ABORTED_ENTRY.itemsize,
                                   head.aborted_crc)
    offset_index, offsets_ok = _section(view, head.index_start, head.offset_index_length,
                                        head.index_crc)
    time_index, times_ok = _section(view, head.time_index_start,
                                    head.index_length - head.offset_index_length,
                                    head.time_index_crc)
    index_ok = offsets_ok and times_ok
    index = bytes(offset_index) + bytes(time_index)
    checksums = {"header": True, "snapshot": snap_ok, "aborted": aborted_ok, "index": index_ok}
    for what, ok in (("snapshot", snap_ok), ("aborted list", aborted_ok),
                     ("offset index", offsets_ok), ("time index", times_ok)):
        if not ok:
            problems.append(f"segment {what} checksum mismatch (or truncated)")
    snapshot = None
    entries = b""
    if snap_ok:
        try:
            if is_framed(snap):
                snapshot, at = unframe(snap)
                entries = bytes(snap[at:])
            else:
                snapshot = msgpack.unpackb(snap)
        except Exception as exc:  # garbage under a valid checksum: report, never raise
            problems.append(f"segment snapshot does not decode: {exc}")
        if snapshot is not None and not isinstance(snapshot, dict):
            problems.append("segment snapshot is not a map")
            snapshot = None
    aborted_arr = offsets = times = None
    if len(aborted) == head.aborted_count * ABORTED_ENTRY.itemsize:
        aborted_arr = np.frombuffer(aborted, dtype=ABORTED_ENTRY)
    if len(index) == head.index_length:
        split = head.batch_count * OFFSET_ENTRY.itemsize
        offsets = np.frombuffer(index, dtype=OFFSET_ENTRY, count=head.batch_count)
        times = np.frombuffer(index, dtype=TIME_ENTRY, offset=split,
                              count=head.data_batch_count)
    batches = _walk_batches(view, head, path, url, offsets, with_records, start, problems)
    return SegmentDump(path, len(view), head, problems, checksums, snapshot, aborted_arr,
                       offsets, times, batches, entries)


def _walk_batches(view: memoryview, head: SegmentHead, path: str, url: str,
                  offsets: np.ndarray | None, with_records: bool, start: int,
                  problems: list[str]) -> list[BatchDump]:
    """The batches of a segment's data section, walked by their own header lengths.

    A batch whose header is unreadable is stepped over with the offset
    index's size for its position, if the index has one; else the walk ends.
    """
    by_position: dict[int, tuple[int, int]] = {}
    if offsets is not None:
        by_position = dict(zip(offsets["position"].tolist(),
                               zip(offsets["base"].tolist(), offsets["size"].tolist())))
    end = min(len(view), head.total_length)
    out: list[BatchDump] = []
    pos = head.data_start
    while pos < end:
        try:
            header = decode_header(view[pos:end], url, None)
            size = header.header_length + header.payload_length
            base = header.base_offset
        except CorruptBatchError as exc:
            entry = by_position.get(pos)
            if entry is None:
                problems.append(f"unreadable batch at position {pos} ({exc.reason}) and no "
                                f"offset-index entry there: the last {end - pos} bytes "
                                "cannot be walked")
                break
            base, size = entry
            out.append(BatchDump(path, size, None, problem=exc.reason, position=pos, base=base))
            pos += size
            continue
        if pos + size > end:
            out.append(BatchDump(path, end - pos, header, position=pos, base=base,
                                 problem=f"batch runs {pos + size - end} bytes past the end "
                                         "of the segment"))
            break
        if header.next_offset > start:
            out.append(_dump_batch(view[pos:pos + size], path, url, base, with_records, pos))
        pos += size
    return out


def dump_object(storage: Storage, path: str, expected_offset: int | None = None,
                with_records: bool = False) -> BatchDump | SegmentDump:
    """Decode one object: a batch object, checking both checksums (and the records with
    ``with_records``), or a segment with every batch in it."""
    data = storage.read_buffer(path)
    url = _url(storage, path)
    if path.endswith(SEGMENT_SUFFIX) or bytes(memoryview(data)[:4]) == SEGMENT_MAGIC:
        base = expected_offset if expected_offset is not None else \
            _name_offset(path, SEGMENT_SUFFIX)
        return decode_segment(data, path, url, base, with_records)
    if expected_offset is None:
        expected_offset = _name_offset(path, BATCH_SUFFIX)
    return _dump_batch(data, path, url, expected_offset, with_records, storage=storage)


@dataclass(frozen=True)
class _Listing:
    segments: list[int]
    paths: dict[int, str]  # base -> the segment's path (merged ones name their range)
    compacted_end: int | None  # None: the newest segment's header is unreadable
    batches: list[int]  # every batch object, the log's and strays


def _list(storage: Storage, directory: str) -> _Listing:
    # The chain by names alone (docs/protocol.md 7.3): a segment starting inside a merged
    # segment's range is hidden by it (a merge's inputs not deleted yet).
    paths: dict[int, str] = {}
    covered = -1
    for base, end_, name in listed_segment_names(storage.list(segments_dir(directory))):
        if base < covered:
            continue
        paths[base] = f"{segments_dir(directory)}/{name}"
        covered = end_ if end_ is not None else base + 1
    segments = sorted(paths)
    batches = named_offsets(storage.list(directory), BATCH_SUFFIX)
    end: int | None = 0
    if segments:
        path = paths[segments[-1]]
        try:
            end = decode_head(storage.read_prefix(path, HEADER_SIZE), path,
                              _url(storage, path), segments[-1]).end_offset
        except CorruptBatchError:
            end = None
    return _Listing(segments, paths, end, batches)


def dump_partition(root: Root, topic: str, partition: int, start: int = 0,
                   max_batches: int | None = None, with_records: bool = False
                   ) -> Iterator[BatchDump | SegmentDump | StrayDump]:
    """The partition's log from the batch holding ``start``: each segment (with its
    batches) and batch object in offset order, then the batch objects below the
    compacted end that are not part of the log.

    ``max_batches`` counts batches, those inside segments included.  An object
    that vanishes while being read (compaction or retention ran) makes the
    partition be listed again and the dump go on from where it was.
    """
    root.describe_topic(topic)  # a clear error for an unknown topic
    directory = partition_dir(topic, partition)
    storage = root.storage
    position = start
    budget = max_batches
    for _ in range(RELISTS):
        listing = _list(storage, directory)
        try:
            for item in _walk(storage, directory, listing, position, with_records):
                if isinstance(item, SegmentDump):
                    if budget is not None:
                        item = replace(item, batches=item.batches[:budget])
                        budget -= len(item.batches)
                    position = item.head.end_offset if item.head is not None else position
                elif isinstance(item, BatchDump):
                    if budget is not None:
                        budget -= 1
                    if item.header is not None:
                        position = item.header.next_offset
                yield item
                if budget is not None and budget <= 0:
                    return
        except FileNotFoundError:
            continue
        break
    else:
        raise StorageError(f"{topic}-{partition}: objects kept vanishing under the dump "
                           f"({RELISTS} listings)")
    end = listing.compacted_end
    for base in listing.batches:
        if end is None or base >= end:
            break
        yield StrayDump(batch_path(directory, base), base, end)


def _walk(storage: Storage, directory: str, listing: _Listing, start: int,
          with_records: bool) -> Iterator[BatchDump | SegmentDump]:
    segments = listing.segments
    if segments and start < segments[0]:
        start = segments[0]  # below the log start: retention deleted it
    for i, base in enumerate(segments):
        if i + 1 < len(segments) and segments[i + 1] <= start:
            continue  # wholly before start
        if i + 1 == len(segments) and listing.compacted_end is not None and \
                listing.compacted_end <= start:
            break
        path = listing.paths[base]
        yield decode_segment(storage.read_buffer(path), path, _url(storage, path), base,
                             with_records, start)
    end = listing.compacted_end
    if end is None:  # the newest segment is unreadable: show what lies past its base
        end = segments[-1] + 1
    tail = [b for b in listing.batches if b >= end]
    first = max((b for b in tail if b <= start), default=start)  # the batch holding start
    for base in tail:
        if base < first:
            continue
        path = batch_path(directory, base)
        yield _dump_batch(storage.read_buffer(path), path, _url(storage, path), base,
                          with_records, storage=storage)
