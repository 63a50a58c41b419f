"""One partition: a gap-free chain of batch objects, appended by slot claiming.

Batch k lives at ``<base offset, 20 digits>.batch`` and the next batch's base
offset is ``base + record_count``.  A writer validates its batch against the
producer state of exactly the prefix before the slot it claims, then publishes
if absent; a writer that loses the slot reloads (the winner is now part of the
prefix), validates again and retries.  Offsets are therefore unique and
contiguous no matter how many processes append at once.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import crc32c
import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .batch import (ABORT, COMMIT, CONTROL_BIT, HEADER_READ_SIZE, LOG_APPEND_TIME,
                    TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT, BatchHeader,
                    ControlRecord, decode_control, decode_header, decode_records, encode_control,
                    encode_header, payload_of)
from .errors import (CorruptBatchError, InconsistentTopicIdError,
                     OffsetOutOfRangeError, StorageError, UnknownTopicError)
from .producer_state import AbortedTransaction, OpenTransaction, ProducerState
from .scan import ISOLATION_LEVELS, READ_COMMITTED, READ_UNCOMMITTED, check_isolation_level
from .storage import Storage
from .topic_ids import current_topic_id

logger = logging.getLogger(__name__)

OFFSET_DIGITS = 20
BATCH_SUFFIX = ".batch"
SNAPSHOT_DIR = "snapshots"
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_INTERVAL = 64  # batches between producer-state snapshots
SNAPSHOTS_KEPT = 2
PARALLEL_MIN_BATCH_BYTES = 1 << 20  # batches at least this large are read on threads
ANCHOR_BYTES = 8  # magic + header checksum of a batch
SNAPSHOT_FORMAT = 2  # 2: the topic id and the last batch's anchor (format.md, section 3)
RELOADS = 5  # cache reloads in one refresh before giving up (storage keeps changing under us)
PUBLISH_ATTEMPTS = 5  # tries of one slot when the storage fails ambiguously

# Resolves an open transaction: True committed, False aborted, None undecided.
OutcomeResolver = Callable[[OpenTransaction], "bool | None"]

SPARK_TIMESTAMP = pa.timestamp("us", tz="UTC")


def offset_name(offset: int, suffix: str) -> str:
    return f"{offset:0{OFFSET_DIGITS}d}{suffix}"


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    duplicate: bool = False
    log_append_time: int = -1  # the batch's timestamp on a LogAppendTime topic, else -1


class AbortedIndex:
    """Per producer, the offset ranges of its aborted transactions, searchable by offset.

    A producer's transactions in one partition never overlap and end in
    marker order, so each producer's ranges are sorted by first offset and a
    lookup is one bisection (Kafka's consumer walks its aborted list the
    same way, in offset order).
    """

    def __init__(self) -> None:
        self._firsts: dict[int, list[int]] = {}
        self._lasts: dict[int, list[int]] = {}
        self.size = 0

    def add(self, aborted: AbortedTransaction) -> None:
        self._firsts.setdefault(aborted.producer_id, []).append(aborted.first_offset)
        self._lasts.setdefault(aborted.producer_id, []).append(aborted.last_offset)
        self.size += 1

    def covers(self, producer_id: int, offset: int) -> bool:
        firsts = self._firsts.get(producer_id)
        if not firsts:
            return False
        i = bisect.bisect_right(firsts, offset) - 1
        return i >= 0 and offset <= self._lasts[producer_id][i]


@dataclass(frozen=True, slots=True)
class _Piece:
    """Records of one batch within a read range, with their derived Spark columns."""

    records: pa.Table
    offsets: pa.Array
    timestamps: pa.Array  # microseconds, as Spark's TimestampType
    timestamp_type: int


@dataclass(frozen=True, slots=True)
class _Slot:
    header: BatchHeader
    data: bytes
    control: ControlRecord | None = None


class PartitionLog:
    """Appends to and reads from one partition of one topic incarnation; caches its state.

    Bound to ``topic_id``: if the topic is deleted (and perhaps re-created)
    under it, every refresh raises (``UnknownTopicError`` /
    ``InconsistentTopicIdError``) and calls ``on_stale(topic, topic_id)`` so
    the owner can forget it; nothing of one incarnation reaches another.
    """

    def __init__(self, storage: Storage, topic: str, partition: int, topic_id: str,
                 resolver: OutcomeResolver | None = None,
                 on_stale: Callable[[str, str], None] | None = None) -> None:
        self.storage = storage
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.dir = f"topics/{topic}/{partition}"
        self._resolver = resolver or (lambda txn: None)
        self._on_stale = on_stale
        self._lock = threading.RLock()
        self._drop_cache()

    def _drop_cache(self) -> None:
        """Forget everything learnt from storage (at start, and when it was pulled away)."""
        self._state: ProducerState | None = None
        self._since_snapshot = 0
        # Known base offsets, sorted; complete from 0 to the state's end once listed.
        self._bases: list[int] = []
        self._bases_complete = False
        self._headers: dict[int, BatchHeader] = {}
        # Base offset and first bytes (magic and header checksum) of the last
        # batch of the cached state: as long as that object is unchanged, the
        # cache describes this incarnation.  None while the state is empty.
        self._anchor: tuple[int, bytes] | None = None
        self._aborted = AbortedIndex()  # built from the state's ABORT markers as they come

    # --- paths and headers ----------------------------------------------------

    def batch_path(self, offset: int) -> str:
        return f"{self.dir}/{offset_name(offset, BATCH_SUFFIX)}"

    def _read_header(self, offset: int
                     ) -> tuple[BatchHeader, ControlRecord | None, bytes] | None:
        """Header (and control record) of a batch, with the bytes read; None if absent."""
        path = self.batch_path(offset)
        try:
            head = self.storage.read_prefix(path, HEADER_READ_SIZE)
        except FileNotFoundError:
            return None
        header = decode_header(head, self._url(path), offset)
        control = None
        if header.is_control:
            control = decode_control(payload_of(head, header, self._url(path)), header,
                                     self._url(path))
        return header, control, head

    def header(self, offset: int) -> BatchHeader:
        """Header of the batch based at ``offset`` (cached: batches never change)."""
        cached = self._headers.get(offset)
        if cached is None:
            found = self._read_header(offset)
            if found is None:
                raise CorruptBatchError("batch file is missing from the log",
                                        self._url(self.batch_path(offset)), offset)
            cached = self._headers[offset] = found[0]
        return cached

    def _url(self, path: str) -> str:
        return f"{self.storage.url.rstrip('/')}/{path}"

    # --- producer state -------------------------------------------------------

    def state(self) -> ProducerState:
        """The producer state at the current log end (refreshed from storage).

        The headers past the cached end are read first and applied only once
        the cache is known to still describe this incarnation (its anchor is
        unchanged, or for an empty state, ``topic.json`` has our id).  A new
        incarnation can only be created after every object of the old one
        was deleted, so an anchor that still exists after the reads proves
        that the headers read came from the same incarnation.
        """
        with self._lock:
            for _ in range(RELOADS):
                if self._state is None:
                    self._state = self._load_snapshot()
                state = self._state
                found = []
                offset = state.end_offset
                while (item := self._read_header(offset)) is not None:
                    found.append(item)
                    offset = item[0].next_offset
                if not self._still_current():
                    continue
                for header, control, head in found:
                    self._applied(header, control, head)
                if self._since_snapshot >= SNAPSHOT_INTERVAL:
                    self._write_snapshot(state)
                return state
            raise StorageError(f"{self.topic}-{self.partition}: the log kept changing under "
                               f"this process ({RELOADS} reloads in one refresh)")

    def _still_current(self) -> bool:
        """Whether the cached state still describes this incarnation (one small read).

        On a mismatch, ``topic.json`` decides: another topic id, or none,
        raises (the topic was deleted, perhaps re-created); the same id means
        the anchor went away for another reason (damage): the cache is
        dropped and False returned, so the caller reloads.
        """
        if self._anchor is not None:
            base, expected = self._anchor
            try:
                if self.storage.read_prefix(self.batch_path(base), ANCHOR_BYTES) == expected:
                    return True
            except FileNotFoundError:
                pass
        current = current_topic_id(self.storage, self.topic)
        if current != self.topic_id:
            self._stale(current)
        if self._anchor is None:
            return True
        logger.warning("%s-%d: batch %d of the cached state changed or vanished although the "
                       "topic is unchanged; reloading", self.topic, self.partition,
                       self._anchor[0])
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

    def _applied(self, header: BatchHeader, control: ControlRecord | None,
                 data: bytes) -> None:
        """Advance the cached state past a batch; ``data`` holds at least its first bytes."""
        assert self._state is not None
        self._anchor = (header.base_offset, bytes(data[:ANCHOR_BYTES]))
        self._note_base(header.base_offset)
        self._state.apply(header, control)
        self._since_snapshot += 1

    def _note_base(self, base: int) -> None:
        if not self._bases or base > self._bases[-1]:
            self._bases.append(base)

    def _snapshot_offsets(self) -> list[int]:
        names = self.storage.list(f"{self.dir}/{SNAPSHOT_DIR}")
        return sorted(int(n[:-len(SNAPSHOT_SUFFIX)]) for n in names
                      if n.endswith(SNAPSHOT_SUFFIX) and n[:-len(SNAPSHOT_SUFFIX)].isdigit())

    def _snapshot_path(self, offset: int) -> str:
        return f"{self.dir}/{SNAPSHOT_DIR}/{offset_name(offset, SNAPSHOT_SUFFIX)}"

    def _load_snapshot(self) -> ProducerState:
        """The newest usable snapshot's state, else the empty state.

        A snapshot is only a cache: one that is damaged, of an older format,
        of another incarnation of the topic, or that does not end with the
        batch it claims to, is skipped with a warning, never trusted and never
        fatal.
        """
        self._anchor = None
        for offset in reversed(self._snapshot_offsets()):
            path = self._snapshot_path(offset)
            try:
                data = self.storage.read(path)
            except FileNotFoundError:
                continue  # pruned by another process meanwhile
            try:
                state, anchor = self._parse_snapshot(offset, data)
            except Exception as exc:  # whatever garbage holds, it only costs a rebuild
                logger.warning("skipping producer-state snapshot %s: %s", self._url(path), exc)
                continue
            self._anchor = anchor
            return state
        return ProducerState()

    def _parse_snapshot(self, offset: int, data: bytes) -> tuple[ProducerState, tuple[int, bytes]]:
        if len(data) < 5 or crc32c.crc32c(data[4:]) != int.from_bytes(data[:4], "big"):
            raise ValueError("checksum mismatch (or truncated)")
        obj = msgpack.unpackb(data[4:])
        if not isinstance(obj, dict) or obj.get("v") != SNAPSHOT_FORMAT:
            raise ValueError(f"not a version {SNAPSHOT_FORMAT} snapshot")
        if obj.get("topic_id") != self.topic_id:
            raise ValueError(f"it belongs to topic id {obj.get('topic_id')!r}, not "
                             f"{self.topic_id!r} (the topic was re-created)")
        state = ProducerState.from_dict(obj)
        if state.end_offset != offset:
            raise ValueError(f"it ends at {state.end_offset}, not at its name's offset")
        last = obj.get("last")
        if not (isinstance(last, list) and len(last) == 2 and type(last[0]) is int
                and isinstance(last[1], bytes) and len(last[1]) == ANCHOR_BYTES):
            raise ValueError("no valid last-batch anchor")
        base, anchor = last
        found = self._read_header(base) if 0 <= base < offset else None
        if found is None or found[0].next_offset != offset or found[2][:ANCHOR_BYTES] != anchor:
            raise ValueError(f"the log has no batch at {base} ending at {offset} with the "
                             "recorded checksum")
        return state, (base, anchor)

    def _write_snapshot(self, state: ProducerState) -> None:
        """Publish a snapshot; it is only a cache, so failing to write one is harmless."""
        self._since_snapshot = 0
        if self._anchor is None:
            return
        base, anchor = self._anchor
        body = msgpack.packb({"v": SNAPSHOT_FORMAT, "topic_id": self.topic_id,
                              "last": [base, anchor], **state.to_dict()})
        data = crc32c.crc32c(body).to_bytes(4, "big") + body
        try:
            # Right before publishing: a topic re-created since the refresh is
            # not ours to write into (the loader's id check covers the rest).
            if current_topic_id(self.storage, self.topic) != self.topic_id:
                return
            self.storage.publish_if_absent(self._snapshot_path(state.end_offset), data)
            for old in self._snapshot_offsets()[:-SNAPSHOTS_KEPT]:
                self.storage.delete(self._snapshot_path(old))
        except OSError:
            pass  # e.g. a read-only reader: it just rebuilds from the older snapshot next time

    def end_offset(self) -> int:
        return self.state().end_offset

    # --- appends ----------------------------------------------------------------

    def _claim(self, prepare: Callable[[ProducerState], "_Slot | AppendResult | None"]
               ) -> "AppendResult | None":
        """The slot-claiming loop shared by data batches and markers.

        ``prepare`` sees the state at the log end and returns either a final
        answer (a duplicate, a marker already present) or the bytes to publish
        at that end.  Losing the slot, or a storage error after which the
        object may or may not exist, both mean: reload and prepare again.
        """
        failures = 0
        with self._lock:
            while True:
                state = self.state()
                step = prepare(state)
                if not isinstance(step, _Slot):
                    return step
                slot = state.end_offset
                try:
                    published = self.storage.publish_if_absent(self.batch_path(slot), step.data)
                except OSError as exc:
                    failures += 1
                    if failures >= PUBLISH_ATTEMPTS:
                        raise StorageError(
                            f"publishing a batch at offset {slot} of {self.topic}-"
                            f"{self.partition} failed {failures} times: {exc}") from exc
                    continue
                if published:
                    self._applied(step.header, step.control, step.data)
                    appended_at = step.header.max_timestamp \
                        if step.header.timestamp_type == LOG_APPEND_TIME else -1
                    return AppendResult(slot, step.header.last_offset,
                                        log_append_time=appended_at)

    def append(self, header: BatchHeader, payload: bytes,
               log_append_time: bool = False) -> AppendResult:
        """Append a data batch at the log end; the header's base offset is ignored.

        A batch that duplicates one of its producer's last five is not written;
        the original's offsets are returned.
        """
        header = replace(header, payload_length=len(payload), payload_crc=crc32c.crc32c(payload))

        def prepare(state: ProducerState) -> _Slot | AppendResult:
            duplicate = state.check_append(header)
            if duplicate is not None:
                return AppendResult(duplicate.base_offset, duplicate.last_offset, True)
            placed = replace(header, base_offset=state.end_offset)
            if log_append_time:
                now = int(time.time() * 1000)
                placed = replace(placed, attributes=placed.attributes | TIMESTAMP_TYPE_BIT,
                                 max_timestamp=now)
            return _Slot(placed, encode_header(placed) + payload)

        result = self._claim(prepare)
        assert result is not None
        return result

    def append_marker(self, producer_id: int, marker_epoch: int, commit: bool,
                      coordinator_epoch: int = 0, decision_id: str = "",
                      transactional_id: str = "") -> int | None:
        """Write a COMMIT/ABORT marker unless this partition already has it.

        Returns the marker's offset, or None when it was already there.
        """
        def prepare(state: ProducerState) -> _Slot | None:
            if not state.marker_needed(producer_id, marker_epoch):
                return None
            entry = state.producers.get(producer_id)
            control = ControlRecord(COMMIT if commit else ABORT, coordinator_epoch,
                                    entry.txn_first_offset if entry is not None else -1)
            payload = encode_control(control)
            now = int(time.time() * 1000)
            header = BatchHeader(
                base_offset=state.end_offset, record_count=1,
                attributes=CONTROL_BIT | TRANSACTIONAL_BIT, base_timestamp=now,
                max_timestamp=now, producer_id=producer_id, producer_epoch=marker_epoch,
                decision_id=decision_id, transactional_id=transactional_id,
                payload_length=len(payload), payload_crc=crc32c.crc32c(payload))
            return _Slot(header, encode_header(header) + payload, control)

        result = self._claim(prepare)
        return None if result is None else result.base_offset

    # --- transactions as readers see them ---------------------------------------

    def last_stable_offset(self, state: ProducerState | None = None) -> int:
        """First offset of the earliest undecided transaction, else the log end."""
        state = state or self.state()
        for txn in state.open_transactions():
            if self._resolver(txn) is None:
                return txn.first_offset
        return state.end_offset

    def _aborted_check(self, state: ProducerState) -> Callable[[int, int], bool]:
        """``(producer id, offset) -> bool``: is a transactional batch there aborted?

        Aborted transactions come from the ABORT markers (an append-only list,
        indexed incrementally) and from open transactions already decided as
        aborted whose markers are not written yet.
        """
        with self._lock:
            for a in state.aborted[self._aborted.size:]:
                self._aborted.add(a)
            index = self._aborted
        decided_aborted = {txn.producer_id: txn.first_offset
                           for txn in state.open_transactions() if self._resolver(txn) is False}

        def aborted(producer_id: int, offset: int) -> bool:
            first = decided_aborted.get(producer_id)
            return (first is not None and offset >= first) or index.covers(producer_id, offset)

        return aborted

    # --- reads --------------------------------------------------------------------

    def _batch_bases(self, state: ProducerState) -> list[int]:
        """All base offsets below the state's end (one listing, then probes)."""
        with self._lock:
            if not self._bases_complete:
                names = self.storage.list(self.dir)
                listed = sorted(int(n[:-len(BATCH_SUFFIX)]) for n in names
                                if n.endswith(BATCH_SUFFIX) and n[:-len(BATCH_SUFFIX)].isdigit())
                merged = sorted(set(listed) | set(self._bases))
                self._bases = [b for b in merged if b < state.end_offset]
                self._bases_complete = True
            return self._bases  # callers only read; appends only ever extend it

    def read(self, start: int, end: int | None = None, isolation_level: str = READ_COMMITTED,
             include_headers: bool = False) -> tuple[pa.Table, int]:
        """Records with offsets in ``[start, end)`` as an Arrow table in Spark's Kafka schema.

        ``end`` is capped at the last stable offset under read_committed and at
        the log end otherwise.  Returns the table and the offset up to which
        the partition was read (the position to continue from).
        """
        check_isolation_level(isolation_level, "isolation_level")
        requested_end = end
        state = self.state()
        limit = self.last_stable_offset(state) if isolation_level == READ_COMMITTED \
            else state.end_offset
        if start < 0 or start > state.end_offset:
            raise OffsetOutOfRangeError(
                f"offset {start} is out of range for {self.topic}-{self.partition} "
                f"(valid: 0 to {state.end_offset})")
        end = limit if end is None else min(end, limit)
        if end <= start:
            return empty_table(include_headers), start
        aborted = self._aborted_check(state) if isolation_level == READ_COMMITTED else None
        bases = self._batch_bases(state)
        first = max(bisect.bisect_right(bases, start) - 1, 0)
        last = bisect.bisect_left(bases, end, lo=first)
        wanted = bases[first:last]

        def load(base: int) -> tuple[_Piece | None, int]:
            return self._load_piece(base, start, end, aborted)

        try:
            loaded = [load(base) for base in wanted[:1]]
            # Threads pay off for large batches only: for small ones the per-batch
            # Python work dominates and contends for the GIL.
            parallel = len(wanted) > 2 and loaded[0][1] >= PARALLEL_MIN_BATCH_BYTES
            loaded += _reader_pool().map(load, wanted[1:]) if parallel else map(load, wanted[1:])
        except CorruptBatchError:
            with self._lock:
                self._still_current()  # a topic deleted under the read says so, clearly
            raise
        # The batches were read by name: had the topic been re-created meanwhile,
        # they could belong to the new incarnation.  The anchor still being there
        # proves they do not (one small read per read call).
        with self._lock:
            current = self._still_current()
        if not current:
            return self.read(start, requested_end, isolation_level, include_headers)
        pieces = [piece for piece, _ in loaded if piece is not None]
        if not pieces:
            return empty_table(include_headers), end
        return to_spark_table(pieces, self.topic, self.partition, include_headers), end

    def _load_piece(self, base: int, start: int, end: int,
                    aborted: Callable[[int, int], bool] | None
                    ) -> tuple[_Piece | None, int]:
        """One batch's records within [start, end) and the batch's payload size.

        Derived columns are computed here too, so that they are built on the
        reader threads when a read is parallel.

        No records for control batches and aborted transactions (still
        checksummed: damage never passes silently, whatever the reader keeps).
        """
        path = self.batch_path(base)
        url = self._url(path)
        try:
            buf = self.storage.read_buffer(path)
        except FileNotFoundError:
            raise CorruptBatchError("batch file is missing from the log", url, base) from None
        header = decode_header(buf, url, base)
        payload = payload_of(buf, header, url)
        if header.is_control:
            return None, header.payload_length
        if aborted is not None and header.is_transactional and \
                aborted(header.producer_id, base):
            return None, header.payload_length
        records = decode_records(payload, header, url)
        lo = max(start - base, 0)
        hi = min(end, header.next_offset) - base
        if lo or hi < header.record_count:
            records = records.slice(lo, hi - lo)
        millis = records.column("timestamp").combine_chunks()
        if header.timestamp_type == LOG_APPEND_TIME:
            millis = _repeat(pa.int64(), header.max_timestamp, records.num_rows)
        offsets = pc.add(_counting(pa.int64(), records.num_rows), pa.scalar(base + lo, pa.int64()))
        micros = pc.multiply(millis, pa.scalar(1000, pa.int64())).cast(SPARK_TIMESTAMP)
        return _Piece(records, offsets, micros, header.timestamp_type), header.payload_length


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _reader_pool() -> ThreadPoolExecutor:
    """Threads that load batches in parallel: memory-mapping, CRC-32C and Arrow
    decoding all release the GIL, so a multi-batch read uses every core."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1),
                                       thread_name_prefix="txlog-read")
        return _POOL


def spark_schema(include_headers: bool) -> pa.Schema:
    """The columns of Spark's Kafka source, as Arrow types Spark accepts for them."""
    from .batch import HEADER_TYPE

    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", SPARK_TIMESTAMP),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", HEADER_TYPE))
    return pa.schema(fields)


def empty_table(include_headers: bool) -> pa.Table:
    return spark_schema(include_headers).empty_table()


_COUNTING: dict[pa.DataType, pa.Array] = {}


def _counting(type_: pa.DataType, n: int) -> pa.Array:
    """0, 1, ..., n-1 as a slice of a cached array.

    Columns are then derived with Arrow kernels, whose allocations come from
    Arrow's pool and reuse memory; fresh numpy arrays of this size cost more
    in page faults than in arithmetic.
    """
    cached = _COUNTING.get(type_)
    if cached is None or len(cached) < n:
        size = max(n, 1 << 16, 2 * len(cached) if cached is not None else 0)
        cached = _COUNTING[type_] = pa.array(np.arange(size, dtype=type_.to_pandas_dtype()))
    return cached.slice(0, n)


def _repeat(type_: pa.DataType, value: int, n: int) -> pa.Array:
    counting = _counting(type_, n)
    return pc.add(pc.multiply(counting, pa.scalar(0, type_)), pa.scalar(value, type_))


def _constant_strings(value: str, n: int) -> pa.Array | pa.ChunkedArray:
    raw = value.encode("utf-8")
    per_chunk = max((2**31 - 1) // max(len(raw), 1), 1)  # string offsets are int32
    if n > per_chunk:
        sizes = [per_chunk] * (n // per_chunk) + ([n % per_chunk] if n % per_chunk else [])
        return pa.chunked_array([_constant_strings(value, k) for k in sizes], pa.string())
    offsets = pc.multiply(_counting(pa.int32(), n + 1), pa.scalar(len(raw), pa.int32()))
    return pa.StringArray.from_buffers(n, offsets.buffers()[1], pa.py_buffer(raw * n))


def to_spark_table(pieces: list[_Piece], topic: str, partition: int,
                   include_headers: bool) -> pa.Table:
    """Spark's Kafka columns around the pieces read from batches."""
    records = pa.concat_tables([p.records for p in pieces])
    n = records.num_rows
    kinds = {p.timestamp_type for p in pieces}
    if len(kinds) == 1:
        ts_types: pa.Array | pa.ChunkedArray = _repeat(pa.int32(), kinds.pop(), n)
    else:
        ts_types = pa.chunked_array([_repeat(pa.int32(), p.timestamp_type, p.records.num_rows)
                                     for p in pieces])
    columns = [
        records.column("key"),
        records.column("value"),
        _constant_strings(topic, n),
        _repeat(pa.int32(), partition, n),
        pa.chunked_array([p.offsets for p in pieces], pa.int64()),
        pa.chunked_array([p.timestamps for p in pieces], SPARK_TIMESTAMP),
        ts_types,
    ]
    if include_headers:
        columns.append(records.column("headers"))
    return pa.Table.from_arrays(columns, schema=spark_schema(include_headers))
