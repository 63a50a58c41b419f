"""The cached producer state of one partition, kept true to storage.

A partition's producer state (producer_state.py) is a fold over its batch
headers.  Folding from offset 0 on every call would read the whole log, so
this module keeps the fold in memory, advances it by the headers written
since, loads it from a snapshot when starting cold, and writes a snapshot
every SNAPSHOT_INTERVAL batches.  A cache is only worth having if it can
never describe another incarnation of the topic: the anchor check below is
what makes it safe (docs/protocol.md, section 1; the snapshot bytes are in
docs/format.md, section 3).
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import crc32c
import msgpack

import pyarrow as pa

from ..format.batch import (HEADER_READ_SIZE, BatchHeader, ControlRecord, decode_control,
                            decode_header, payload_of)
from ..errors import (CorruptBatchError, InconsistentTopicIdError, OffsetOutOfRangeError,
                      StorageError, UnknownTopicError)
from .producer_state import ProducerState
from ..format.segment import (CorruptSegmentError, SegmentHead, SegmentIndex, TimeIndex, read_head,
                              read_header, read_index, read_time_index)
from ..storage.backends import Storage
from ..storage.paths import (BATCH_SUFFIX, SNAPSHOT_SUFFIX, batch_path, named_offsets, partition_dir,
                             segment_bases, segment_path, segments_dir, snapshot_path,
                             snapshots_dir)
from ..format.topic_ids import current_topic_id

logger = logging.getLogger(__name__)

SNAPSHOT_INTERVAL = 64  # batches between producer-state snapshots
SNAPSHOTS_KEPT = 2
ANCHOR_BYTES = 8  # magic + header checksum of a batch
SNAPSHOT_FORMAT = 2  # 2: the topic id and the last batch's anchor (format.md, section 3)
RELOADS = 5  # cache reloads in one refresh before giving up (storage keeps changing under us)


@dataclass(frozen=True, slots=True)
class BatchRef:
    """Where the bytes of one batch are: its own object, or a stretch of a segment."""

    base: int
    path: str
    position: int = 0
    size: int = -1  # -1: the whole object (a batch file)

    @property
    def in_segment(self) -> bool:
        return self.size >= 0


@dataclass(frozen=True, slots=True)
class _Anchor:
    """The last object of the cached prefix and its first bytes (magic and header checksum).

    For a segment, ``next_segment`` is its end offset: the prefix is current
    only while no segment starts there, since a compaction that began at the
    end of the prefix deletes batches without touching this segment.
    """

    base: int
    path: str
    data: bytes
    next_segment: int | None = None


class StateManager:
    """Producer state, batch locations and headers of one partition incarnation, cached.

    A partition is a run of segments from its log start to its *compacted
    end*, then batch objects from there to its log end (docs/protocol.md,
    section 7).  Appends and reads of the partition share this object and its
    ``lock``, so that what one learns (a batch it published, a listing) the
    others see.
    """

    def __init__(self, storage: Storage, topic: str, partition: int, topic_id: str,
                 on_stale: Callable[[str, str], None] | None = None) -> None:
        self.storage = storage
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.dir = partition_dir(topic, partition)
        self._on_stale = on_stale
        self.lock = threading.RLock()
        self._drop_cache()

    def _drop_cache(self) -> None:
        """Forget everything learnt from storage (at start, and when it was pulled away)."""
        self._state: ProducerState | None = None
        self._since_snapshot = 0
        # Base offsets of batch objects from the compacted end, sorted; complete
        # up to the state's end once listed.
        self._bases: list[int] = []
        self._bases_complete = False
        self._headers: dict[int, BatchHeader] = {}
        # The last object of the cached state's prefix: as long as it is
        # unchanged, the cache describes this incarnation and nothing it
        # covers was compacted away.  None while the state is empty.
        self._anchor: _Anchor | None = None
        # Segments as last listed: their bases, and where the newest ends.
        self._segment_bases: list[int] = []
        self._compacted_end = 0
        self._heads: dict[int, SegmentHead] = {}
        self._indexes: dict[int, SegmentIndex] = {}
        self._time_indexes: dict[int, TimeIndex] = {}

    # --- paths and headers ----------------------------------------------------

    def batch_path(self, offset: int) -> str:
        return batch_path(self.dir, offset)

    def segment_path(self, base: int) -> str:
        return segment_path(self.dir, base)

    def url(self, path: str) -> str:
        """``path`` as a full URL, for error messages that name the object."""
        return f"{self.storage.url.rstrip('/')}/{path}"

    def read_header(self, offset: int
                    ) -> tuple[BatchHeader, ControlRecord | None, bytes] | None:
        """Header (and control record) of a batch object, with the bytes read; None if absent."""
        path = self.batch_path(offset)
        try:
            head = self.storage.read_prefix(path, HEADER_READ_SIZE)
        except FileNotFoundError:
            return None
        return _decoded(head, self.url(path), offset)

    def header(self, offset: int) -> BatchHeader:
        """Header of the batch based at ``offset``, wherever it is (cached: batches never change)."""
        cached = self._headers.get(offset)
        if cached is None:
            ref = self.ref_of(offset)
            data = self.load(ref, HEADER_READ_SIZE)
            cached = self._headers[offset] = decode_header(data, self.url(ref.path), offset)
        return cached

    # --- segments -------------------------------------------------------------

    def _listed_segments(self) -> list[int]:
        """Bases of the segments in storage now (one listing, no header read)."""
        return segment_bases(self.storage.list(segments_dir(self.dir)))

    def list_segments(self) -> list[int]:
        """List the segments again (they come and go under compaction and retention)."""
        with self.lock:
            for _ in range(RELOADS):
                bases = self._listed_segments()
                try:
                    end = self.segment_head(bases[-1]).end_offset if bases else 0
                except FileNotFoundError:
                    continue  # deleted by retention after a newer one was made: list again
                self._segment_bases = bases
                self._compacted_end = end
                self._bases = [b for b in self._bases if b >= end]
                return bases
            raise StorageError(f"{self.topic}-{self.partition}: the segments kept changing "
                               f"under this process ({RELOADS} listings)")

    def compacted_end(self, refresh: bool = False) -> int:
        """Where the segments end and batch objects begin (as last listed)."""
        if refresh:
            self.list_segments()
        return self._compacted_end

    def log_start(self) -> int:
        """The first offset still stored: the base of the oldest segment, else 0."""
        bases = self.list_segments()
        return bases[0] if bases else 0

    def segment_head(self, base: int) -> SegmentHead:
        """A segment's header (its range and sections); the snapshot is not read."""
        head = self._heads.get(base)
        if head is None:
            path = self.segment_path(base)
            head = read_header(self.storage, path, self.url(path), base)
            self._check_topic_id(head)
            self._heads[base] = head
        return head

    def _check_topic_id(self, head: SegmentHead) -> None:
        if head.topic_id != self.topic_id:
            current = current_topic_id(self.storage, self.topic)
            if current != self.topic_id:
                self._stale(current)
            raise CorruptSegmentError(f"segment belongs to topic id {head.topic_id}, not "
                                      f"{self.topic_id}", self.url(head.path), head.base_offset)

    def segment_state(self, base: int) -> tuple[SegmentHead, ProducerState]:
        """A segment's header and the producer state at its end (a damaged one is an error:
        the batches it replaced are gone)."""
        path = self.segment_path(base)
        head, fields = read_head(self.storage, path, self.url(path), base)
        self._check_topic_id(head)
        self._heads[base] = head
        try:
            return head, self.state_from_fields(fields, head.end_offset)
        except ValueError as exc:
            raise CorruptSegmentError(f"segment snapshot unusable: {exc}", self.url(path),
                                      base) from None

    def segment_index(self, base: int) -> SegmentIndex:
        index = self._indexes.get(base)
        if index is None:
            head = self.segment_head(base)
            index = self._indexes[base] = read_index(self.storage, head, self.url(head.path))
        return index

    def time_index(self, base: int) -> TimeIndex:
        """A segment's time index (lookups by time and retention only need it)."""
        index = self._time_indexes.get(base)
        if index is None:
            head = self.segment_head(base)
            index = self._time_indexes[base] = read_time_index(
                self.storage, head, self.segment_index(base), self.url(head.path))
        return index

    def _segment_refs(self, base: int, start: int, end: int) -> list[BatchRef]:
        index = self.segment_index(base)
        path = self.segment_path(base)
        lo = max(index.find(start), 0)
        hi = int(index.bases.searchsorted(end, side="left"))
        return [BatchRef(int(b), path, int(p), int(n)) for b, p, n in
                zip(index.bases[lo:hi], index.positions[lo:hi], index.sizes[lo:hi])]

    # --- where batches are ----------------------------------------------------

    def _tail_bases(self, state: ProducerState) -> list[int]:
        """Bases of the batch objects from the compacted end to the state's end.

        A listing that does not start at the compacted end means a compaction
        ran since the segments were listed: they are listed again.
        """
        for _ in range(RELOADS):
            if not self._bases_complete:
                listed = named_offsets(self.storage.list(self.dir), BATCH_SUFFIX)
                merged = sorted(set(listed) | set(self._bases))
                self._bases = [b for b in merged if self._compacted_end <= b < state.end_offset]
                self._bases_complete = True
            if self._compacted_end >= state.end_offset or \
                    (self._bases and self._bases[0] == self._compacted_end):
                return self._bases
            self._bases_complete = False
            self.list_segments()
        raise CorruptBatchError("batch file is missing from the log",
                                self.url(self.batch_path(self._compacted_end)),
                                self._compacted_end)

    def refs(self, start: int, end: int, state: ProducerState) -> list[BatchRef]:
        """Where the batches holding offsets ``[start, end)`` are, in offset order.

        Logarithmic in the log's size: a bisection over the segments, one in
        the segment's offset index, one over the batch objects after them.
        """
        with self.lock:
            for _ in range(RELOADS):
                tail = self._tail_bases(state)
                try:
                    out = self._segment_part(start, min(end, self._compacted_end))
                except FileNotFoundError:
                    self.list_segments()  # retention removed a segment: look again
                    continue
                first = max(start, self._compacted_end)
                lo = max(bisect.bisect_right(tail, first) - 1, 0)
                hi = bisect.bisect_left(tail, end, lo=lo)
                out.extend(BatchRef(b, self.batch_path(b)) for b in tail[lo:hi])
                return out
            raise StorageError(f"{self.topic}-{self.partition}: segments kept vanishing "
                               "under a read")

    def _segment_part(self, start: int, end: int) -> list[BatchRef]:
        if start >= end:
            return []
        bases = self._segment_bases
        if start < bases[0]:
            raise OffsetOutOfRangeError(
                f"offset {start} of {self.topic}-{self.partition} was deleted by retention "
                f"(log start offset {bases[0]})")
        out: list[BatchRef] = []
        for i in range(bisect.bisect_right(bases, start) - 1, len(bases)):
            if bases[i] >= end:
                break
            out.extend(self._segment_refs(bases[i], start, end))
        return out

    def ref_of(self, base: int) -> BatchRef:
        """Where the batch based at ``base`` is."""
        with self.lock:
            if base >= self._compacted_end:
                return BatchRef(base, self.batch_path(base))
        return self.relocate(base)

    def relocate(self, base: int) -> BatchRef:
        """Where the batch at ``base`` is now that its object is gone: in a segment.

        Raises OffsetOutOfRangeError when retention removed it, and
        CorruptBatchError when nothing holds it (a hole in the log).
        """
        with self.lock:
            bases = self.list_segments()
            if bases and base < bases[0]:
                raise OffsetOutOfRangeError(
                    f"offset {base} of {self.topic}-{self.partition} was deleted by retention "
                    f"(log start offset {bases[0]})")
            if base < self._compacted_end:
                i = bisect.bisect_right(bases, base) - 1
                found = self._segment_refs(bases[i], base, base + 1)
                if found and found[0].base == base:
                    return found[0]
        raise CorruptBatchError("batch file is missing from the log",
                                self.url(self.batch_path(base)), base)

    def load(self, ref: BatchRef, limit: int | None = None) -> pa.Buffer:
        """The batch's bytes (its first ``limit`` only, if given), following it into a
        segment if compaction moved it meanwhile."""
        for _ in range(RELOADS):
            try:
                if not ref.in_segment:
                    if limit is None:
                        return self.storage.read_buffer(ref.path)
                    return pa.py_buffer(self.storage.read_prefix(ref.path, limit))
                length = ref.size if limit is None else min(limit, ref.size)
                return self.storage.read_range(ref.path, ref.position, length)
            except FileNotFoundError:
                ref = self.relocate(ref.base)
        raise StorageError(f"{self.topic}-{self.partition}: the batch at {ref.base} kept "
                           "moving under a read")

    def first_reaching(self, timestamp_ms: int, end: int, state: ProducerState) -> int | None:
        """Base of the first data batch below ``end`` whose max timestamp reaches
        ``timestamp_ms``: bisections of the segments' time indexes, then the headers
        of the batch objects after them."""
        with self.lock:
            for base in self.list_segments():
                hit = self.time_index(base).first_reaching(timestamp_ms)
                if hit is not None:
                    return hit if hit < end else None
            for base in self._tail_bases(state):
                if base >= end:
                    break
                header = self.header(base)
                if not header.is_control and header.max_timestamp >= timestamp_ms:
                    return base
        return None

    def segment_heads(self) -> list[SegmentHead]:
        """The segments' headers, oldest first, as listed now (one that retention deleted
        since the listing is left out)."""
        heads = []
        for base in self.list_segments():
            try:
                heads.append(self.segment_head(base))
            except FileNotFoundError:
                continue
        return heads

    def tail_sizes(self, state: ProducerState) -> tuple[int, int]:
        """The batch objects from the compacted end to the state's end: how many, and their
        bytes (from their cached headers, never a payload)."""
        bases = [r.base for r in self.refs(self._compacted_end, state.end_offset, state)
                 if not r.in_segment]
        return len(bases), sum(h.header_length + h.payload_length
                               for h in map(self.header, bases))

    # --- producer state -------------------------------------------------------

    def state(self) -> ProducerState:
        """The producer state at the current log end (refreshed from storage).

        The headers past the cached end are read first and applied only once
        the cache is known to still describe this incarnation and to be
        untouched by compaction (its anchor is unchanged, or for an empty
        state, no segment exists and ``topic.json`` has our id).  A new
        incarnation can only be created after every object of the old one
        was deleted, and compaction deletes batch objects in offset order
        after publishing their segment: an anchor that still exists after
        the reads proves that the headers read are the log's own.
        """
        with self.lock:
            for _ in range(RELOADS):
                if self._state is None:
                    self._state = self._load_state()
                state = self._state
                found = []
                offset = state.end_offset
                while (item := self.read_header(offset)) is not None:
                    found.append(item)
                    offset = item[0].next_offset
                if not self.still_current():
                    continue
                for header, control, head in found:
                    self.applied(header, control, head)
                if self._since_snapshot >= SNAPSHOT_INTERVAL:
                    self._write_snapshot(state)
                return state
            raise StorageError(f"{self.topic}-{self.partition}: the log kept changing under "
                               f"this process ({RELOADS} reloads in one refresh)")

    def still_current(self) -> bool:
        """Whether the cached state still describes the log (one or two small reads).

        On a mismatch, ``topic.json`` decides: another topic id, or none,
        raises (the topic was deleted, perhaps re-created); the same id means
        the anchor went away for another reason (compaction, retention, or
        damage): the cache is dropped and False returned, so the caller reloads.
        """
        anchor = self._anchor
        if anchor is not None:
            try:
                if self.storage.read_prefix(anchor.path, ANCHOR_BYTES) == anchor.data and (
                        anchor.next_segment is None or
                        not self.storage.exists(self.segment_path(anchor.next_segment))):
                    return True
            except FileNotFoundError:
                pass
        elif not self._listed_segments():
            current = current_topic_id(self.storage, self.topic)
            if current != self.topic_id:
                self._stale(current)
            return True
        current = current_topic_id(self.storage, self.topic)
        if current != self.topic_id:
            self._stale(current)
        compacted = bool(self._listed_segments())
        (logger.debug if compacted else logger.warning)(
            "%s-%d: %s of the cached state changed or vanished (%s); reloading",
            self.topic, self.partition, anchor.path if anchor else "the empty prefix",
            "compaction or retention ran" if compacted else "although the topic is unchanged")
        self._drop_cache()
        return False

    def _stale(self, current: str | None) -> None:
        """This incarnation is gone: forget it and tell the caller clearly."""
        self._drop_cache()
        if self._on_stale is not None:
            self._on_stale(self.topic, self.topic_id)
        if current is None:
            raise UnknownTopicError(
                f"topic {self.topic!r} (topic id {self.topic_id}) was deleted by another "
                f"process since this one opened it (partition {self.partition})")
        raise InconsistentTopicIdError(
            f"topic {self.topic!r} was deleted and re-created since this process opened it "
            f"(topic id {self.topic_id}, now {current}); nothing of the old topic is applied "
            "to the new one: open the partition again to use it")

    def applied(self, header: BatchHeader, control: ControlRecord | None,
                data: bytes) -> None:
        """Advance the cached state past a batch; ``data`` holds at least its first bytes."""
        assert self._state is not None
        self._anchor = _Anchor(header.base_offset, self.batch_path(header.base_offset),
                               bytes(data[:ANCHOR_BYTES]))
        if not self._bases or header.base_offset > self._bases[-1]:
            self._bases.append(header.base_offset)
        self._state.apply(header, control)
        self._since_snapshot += 1

    def holds(self, base: int, anchor: bytes) -> bool:
        """Whether the log (reloaded) has, at ``base``, the batch that starts with ``anchor``.

        An appender asks after a publish whose slot may have been compacted
        away between its refresh and its publish: then its object is a stray
        that no process reads, and the batch must be written again.
        """
        with self.lock:
            state = self.state()
            if base >= state.end_offset:
                return False
            try:
                ref = self.ref_of(base)
                return bytes(self.load(ref, ANCHOR_BYTES)) == anchor
            except CorruptBatchError:
                return False

    # --- snapshots ------------------------------------------------------------

    def _snapshot_offsets(self) -> list[int]:
        return named_offsets(self.storage.list(snapshots_dir(self.dir)), SNAPSHOT_SUFFIX)

    def snapshot_path(self, offset: int) -> str:
        return snapshot_path(self.dir, offset)

    def _load_state(self) -> ProducerState:
        """The state of the newest segment or snapshot, whichever ends later; else empty.

        A snapshot is only a cache: one that is damaged, of an older format,
        of another incarnation of the topic, or that does not end with the
        batch it claims to, is skipped with a warning, never trusted and never
        fatal.  A segment's state is part of the log (its batches are gone):
        damage there is an error.
        """
        for _ in range(RELOADS):
            bases = self.list_segments()
            from_segment = None
            if bases:
                try:
                    head, state = self.segment_state(bases[-1])
                except FileNotFoundError:
                    continue
                from_segment = state, _Anchor(head.base_offset, head.path, head.anchor,
                                                      head.end_offset)
            for offset in reversed(self._snapshot_offsets()):
                if offset <= self._compacted_end:
                    break
                loaded = self._load_snapshot_file(offset)
                if loaded is not None:
                    self._anchor = loaded[1]
                    return loaded[0]
            if from_segment is not None:
                self._anchor = from_segment[1]
                logger.debug("%s-%d: producer state loaded from the segment ending at %d",
                             self.topic, self.partition, self._compacted_end)
                return from_segment[0]
            logger.debug("%s-%d: no usable producer-state snapshot; rebuilding from offset 0",
                         self.topic, self.partition)
            self._anchor = None
            return ProducerState()
        raise StorageError(f"{self.topic}-{self.partition}: the segments kept changing under "
                           f"this process ({RELOADS} loads)")

    def _load_snapshot_file(self, offset: int) -> tuple[ProducerState, _Anchor] | None:
        path = self.snapshot_path(offset)
        try:
            data = self.storage.read(path)
        except FileNotFoundError:
            return None  # pruned by another process meanwhile
        try:
            state, anchor = self._parse_snapshot(offset, data)
        except Exception as exc:  # whatever garbage holds, it only costs a rebuild
            logger.warning("skipping producer-state snapshot %s: %s", self.url(path), exc)
            return None
        logger.debug("%s-%d: producer state loaded from the snapshot at offset %d",
                     self.topic, self.partition, offset)
        return state, anchor

    def state_from_fields(self, obj: object, end: int) -> ProducerState:
        """The state a snapshot's fields hold, refusing (ValueError) anything else."""
        if not isinstance(obj, dict) or obj.get("v") != SNAPSHOT_FORMAT:
            raise ValueError(f"not a version {SNAPSHOT_FORMAT} snapshot")
        if obj.get("topic_id") != self.topic_id:
            raise ValueError(f"it belongs to topic id {obj.get('topic_id')!r}, not "
                             f"{self.topic_id!r} (the topic was re-created)")
        state = ProducerState.from_dict(obj)
        if state.end_offset != end:
            raise ValueError(f"it ends at {state.end_offset}, not at {end}")
        return state

    def snapshot_fields(self, state: ProducerState, last_base: int, anchor: bytes) -> dict:
        return {"v": SNAPSHOT_FORMAT, "topic_id": self.topic_id, "last": [last_base, anchor],
                **state.to_dict()}

    def _parse_snapshot(self, offset: int, data: bytes) -> tuple[ProducerState, _Anchor]:
        if len(data) < 5 or crc32c.crc32c(data[4:]) != int.from_bytes(data[:4], "big"):
            raise ValueError("checksum mismatch (or truncated)")
        obj = msgpack.unpackb(data[4:])
        state = self.state_from_fields(obj, offset)
        last = obj.get("last")
        if not (isinstance(last, list) and len(last) == 2 and type(last[0]) is int
                and isinstance(last[1], bytes) and len(last[1]) == ANCHOR_BYTES):
            raise ValueError("no valid last-batch anchor")
        base, anchor = last
        found = self.read_header(base) if 0 <= base < offset else None
        if found is None or found[0].next_offset != offset or found[2][:ANCHOR_BYTES] != anchor:
            raise ValueError(f"the log has no batch at {base} ending at {offset} with the "
                             "recorded checksum")
        return state, _Anchor(base, self.batch_path(base), anchor)

    def _write_snapshot(self, state: ProducerState) -> None:
        """Publish a snapshot; it is only a cache, so failing to write one is harmless."""
        self._since_snapshot = 0
        anchor = self._anchor
        if anchor is None or anchor.next_segment is not None:
            return  # nothing since the newest segment, whose own snapshot serves
        body = msgpack.packb(self.snapshot_fields(state, anchor.base, anchor.data))
        data = crc32c.crc32c(body).to_bytes(4, "big") + body
        try:
            # Right before publishing: a topic re-created since the refresh is
            # not ours to write into (the loader's id check covers the rest).
            if current_topic_id(self.storage, self.topic) != self.topic_id:
                return
            self.storage.publish_if_absent(self.snapshot_path(state.end_offset), data)
            for old in self._snapshot_offsets()[:-SNAPSHOTS_KEPT]:
                self.storage.delete(self.snapshot_path(old))
        except OSError:
            pass  # e.g. a read-only reader: it just rebuilds from the older snapshot next time


def _decoded(head: bytes, url: str, offset: int
             ) -> tuple[BatchHeader, ControlRecord | None, bytes]:
    header = decode_header(head, url, offset)
    control = None
    if header.is_control:
        control = decode_control(payload_of(head, header, url), header, url)
    return header, control, head
