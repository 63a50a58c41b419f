"""Reading a range of one partition: its batches, without aborted transactions.

This is the core's read: it answers with the decoded records of each batch
and the offsets and timestamps the batch implies (a ``Piece`` per batch), in
no client's column shape; clients/columns.py projects pieces to Kafka's
record columns.  The last stable offset and the aborted-transaction filter are here
because only a reader needs them: a writer validates against the producer
state alone.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from ..format.arrays import counting, repeat
from ..format.batch import (LOG_APPEND_TIME, BatchHeader, decode_header, decode_records,
                            payload_of, referenced_payload)
from ..errors import CorruptBatchError, OffsetOutOfRangeError, StorageError
from ..storage.pools import READ_THREADS, read_pool
from .producer_state import AbortedIndex, AbortedTransaction, OpenTransaction, ProducerState
from .isolation import READ_COMMITTED, check_isolation_level, visible_end
from .state_manager import StateManager
from .storage_cache import RELOADS, BatchRef

PARALLEL_MIN_BATCH_BYTES = 1 << 20  # batches at least this large are read on threads
SPAN_BATCHES = 64  # batches of one segment fetched with one read (and decoded on one thread)
LOG_START_REFRESH_S = 1.0  # a reader lists the log start again after this long (see _log_start)
# Claims whose payloads lie back to back in one data object are fetched with one
# ranged read of at most this many bytes (more reads then go in parallel).
COALESCE_BYTES = 8 << 20
# Fetching ahead: at most this many reads, and bytes, requested beyond the one
# being assembled (the result itself holds the range it returns).
READ_AHEAD_REQUESTS = READ_THREADS
READ_AHEAD_BYTES = 64 << 20
# A read bounded in bytes takes at most this many batches of unknown size (see _within).
UNKNOWN_SIZES = 64

# Resolves an open transaction: True committed, False aborted, None undecided.
OutcomeResolver = Callable[[OpenTransaction], "bool | None"]


@dataclass(frozen=True, slots=True)
class Piece:
    """Records of one batch within a read range, with the offsets and times they have."""

    records: pa.Table  # as decoded (batch.RECORD_SCHEMA)
    offsets: pa.Array  # int64
    timestamps: pa.Array  # int64 ms: the records' own, or the batch's on a LogAppendTime topic
    timestamp_type: int


class Reader:
    """Reads the partition ``states`` caches, deciding open transactions with ``resolver``."""

    def __init__(self, states: StateManager, resolver: OutcomeResolver | None = None) -> None:
        self._states = states
        self._resolver = resolver or (lambda txn: None)
        # Built from the cached state's ABORT markers as they come; a new state
        # object (the cache was dropped and reloaded) starts a new index.
        self._aborted = AbortedIndex()
        self._aborted_of: ProducerState | None = None
        # segment path -> _open_before (never changes; by path: a merged segment may
        # share its base with the plain one it replaced)
        self._open_at_end: dict[str, int] = {}

    def last_stable_offset(self, state: ProducerState) -> int:
        """First offset of the earliest undecided transaction, else the log end."""
        for txn in state.open_transactions():
            if self._resolver(txn) is None:
                return txn.first_offset
        return state.end_offset

    def aborted_check(self, state: ProducerState, start: int = 0, end: int | None = None
                      ) -> Callable[[int, int], bool]:
        """``(producer id, offset) -> bool``: is a transactional batch in ``[start, end)``
        aborted?

        Aborted transactions come from the ABORT markers: those at or after the
        state's ``aborted_from`` from the state (an append-only list, indexed
        incrementally), the earlier ones from the aborted sections of the
        segments the range needs (``_segment_aborted``); and from open
        transactions already decided as aborted whose markers are not written yet.
        """
        segments = self._segment_aborted(state, start, state.end_offset if end is None else end)
        with self._states.lock:
            if self._aborted_of is not state:
                self._aborted, self._aborted_of = AbortedIndex(), state
            for a in state.aborted[self._aborted.size:]:
                self._aborted.add(a)
            index = self._aborted
        decided_aborted = {txn.producer_id: txn.first_offset
                           for txn in state.open_transactions() if self._resolver(txn) is False}

        def aborted(producer_id: int, offset: int) -> bool:
            first = decided_aborted.get(producer_id)
            return (first is not None and offset >= first) or \
                index.covers(producer_id, offset) or segments.covers(producer_id, offset)

        return aborted

    def _segment_aborted(self, state: ProducerState, start: int, end: int) -> AbortedIndex:
        """The transactions aborted before ``state.aborted_from`` that a read of ``[start,
        end)`` needs: those whose marker is at or after ``start`` and which began before
        ``end``, from the segments' aborted sections (Kafka's per-segment transaction
        index, read for the fetched range only).

        The segments are read from the one holding ``start`` on, and no further
        than needed: past ``end``, a segment whose end state has no transaction
        open that began before ``end`` ends the search (every transaction such a
        read needs was then already ended by a marker in a segment read), and
        from ``aborted_from`` on the state itself knows every marker.
        """
        index = AbortedIndex()
        upto = state.aborted_from
        if start >= upto or end <= start:
            return index
        cache = self._states.cache
        for _ in range(RELOADS):
            with self._states.lock:
                if cache.compacted_end() < upto:
                    cache.list_segments()
                bases = cache.listed_bases()
            if not bases or cache.compacted_end() < upto:
                raise StorageError(f"{self._states.topic}-{self._states.partition}: the "
                                   f"segments end before offset {upto}, where its producer "
                                   "state's aborted list starts")
            found = AbortedIndex()
            try:
                for base in bases[max(bisect.bisect_right(bases, start) - 1, 0):]:
                    if base >= upto:
                        break
                    head = cache.segment_head(base)
                    if head.end_offset <= start:
                        continue
                    for pid, first, last in cache.segment_aborted(base):
                        if last >= start and first < end:
                            found.add(AbortedTransaction(pid, first, last))
                    if head.end_offset >= end and self._open_before(base) >= end:
                        break
            except FileNotFoundError:  # retention deleted a segment: list them again
                with self._states.lock:
                    cache.list_segments()
                continue
            return found
        raise StorageError(f"{self._states.topic}-{self._states.partition}: segments kept "
                           "vanishing under a read")

    def _open_before(self, base: int) -> int:
        """The first offset of the earliest transaction still open at the end of the
        segment at ``base`` (its snapshot), or its end offset if none is."""
        path = self._states.cache.piece_path(base)
        found = self._open_at_end.get(path)
        if found is None:
            head, state = self._states.segment_state(base)
            opened = [t.first_offset for t in state.open_transactions()]
            found = self._open_at_end[head.path] = min(opened, default=head.end_offset)
        return found

    def read(self, start: int, end: int | None, isolation_level: str,
             max_bytes: int | None = None, recent: bool = False) -> tuple[list[Piece], int]:
        """The pieces of offsets ``[start, end)`` and the offset up to which the partition was read.

        ``end`` is capped at the last stable offset under read_committed and at
        the log end otherwise, and with ``max_bytes`` at a batch boundary (see
        ``_within``); the offset returned is where to continue from.  ``recent``:
        a state proven current within GUESS_WINDOW_S will do (no refresh: the
        read is as of that proof, docs/protocol.md 6.1).
        """
        check_isolation_level(isolation_level, "isolation_level")
        states = self._states
        state = states.believed_state(listing=True) if recent else states.state(listing=True)
        limit = visible_end(isolation_level, state.end_offset,
                            lambda: self.last_stable_offset(state))
        upto = limit if end is None else min(end, limit)
        log_start = self._log_start(start, upto)
        if start < log_start or start < 0 or start > state.end_offset:
            raise OffsetOutOfRangeError(
                f"offset {start} is out of range for {states.topic}-{states.partition} "
                f"(valid: {log_start} to {state.end_offset})")
        if upto <= start:
            return [], start
        aborted = self.aborted_check(state, start, upto) \
            if isolation_level == READ_COMMITTED else None

        def load(span: _Span) -> list[tuple[Piece | None, int]]:
            if span.data_path:
                return self._load_claims(span, start, upto, aborted)
            if span.preloaded is not None:
                return [self._load_piece(span.refs[0], span.preloaded, start, upto, aborted)]
            return self._load_span(span.refs, start, upto, aborted)

        try:
            refs = states.cache.refs(start, upto, state.end_offset)
            if max_bytes is not None:
                refs, upto = self._within(refs, upto, max_bytes)
            wanted = self._plan(refs)
            loaded = _load_all(load, wanted)
        except CorruptBatchError:
            with states.lock:
                states.still_current()  # a topic deleted under the read says so, clearly
            raise
        # Batches read by name after the state was proven: had the topic been
        # re-created meanwhile, they could belong to the new incarnation.  The anchor
        # still being there proves they do not (one small read).  A read of claims
        # alone, each known from a proven state, needs no proof: a claim names its data
        # object, which no other batch or incarnation shares and nobody rewrites
        # (docs/protocol.md 6.1).
        if any(span.by_name for span in wanted):
            with states.lock:
                current = states.still_current()
            if not current:
                return self.read(start, end, isolation_level, max_bytes, recent)
        return [piece for span in loaded for piece, _ in span if piece is not None], upto

    def _within(self, refs: list[BatchRef], end: int, max_bytes: int
                ) -> tuple[list[BatchRef], int]:
        """The first batches of ``refs`` holding about ``max_bytes`` (stored bytes: header
        and payload), and where they end (``end`` if all are kept).

        As a Kafka fetch: at least one batch, whole batches, stopping once the
        bytes reach ``max_bytes``.  A batch whose header this process has not
        read yet (below a snapshot it loaded) counts as nothing until it is,
        and at most UNKNOWN_SIZES of them are taken: each costs a request to
        learn its size, which would otherwise be made for the whole range.
        """
        cache = self._states.cache
        total = unknown = 0
        for i, ref in enumerate(refs):
            if i and (total >= max_bytes or unknown >= UNKNOWN_SIZES):
                return refs[:i], ref.base
            if ref.in_segment:
                total += ref.size
                continue
            header = cache.cached_header(ref.base)
            if header is None:
                unknown += 1
            else:
                total += header.header_length + header.payload_length
        return refs, end

    def _log_start(self, start: int, end: int) -> int:
        """The log start a read from ``start`` to ``end`` is checked against.

        Listed again (one listing of the segments directory, which also names
        the log starts delete-records recorded) when the read starts below
        the compacted end, where retention may have removed it, or below the
        log start last listed, or when that listing is older than
        LOG_START_REFRESH_S; an empty read lists nothing.  So a log start
        recorded by another process is enforced here within that time
        (docs/protocol.md, section 7.1).
        """
        cache = self._states.cache
        known = cache.known_log_start()
        if start < 0:
            return known
        if start < known or (end > start and (start < cache.compacted_end() or
                                               cache.listing_age_s() >= LOG_START_REFRESH_S)):
            return cache.log_start()
        return known

    def _plan(self, refs: list[BatchRef]) -> list[_Span]:
        """Group the batches into reads: consecutive batches of one segment, claims whose
        payloads lie back to back in one data object, and inline batch objects alone;
        none for a marker the state's refresh read whole (checked then, and no records).

        A claim's header is known from the state refresh that found it; headers
        not cached (a fresh process reading below its snapshot) are read first,
        several at once.
        """
        cache = self._states.cache
        missing = [r for r in refs if not r.in_segment and cache.cached_header(r.base) is None]
        # Objects whose header is unknown are read whole, several at once: a claim is
        # its header, and an inline batch's bytes are what the read needs anyway.
        remote = getattr(self._states.storage, "remote", False)
        loads = _ahead(_reader_pool(), cache.load, missing) if remote and len(missing) > 1 \
            else map(cache.load, missing)
        preloaded = dict(zip((r.base for r in missing), loads, strict=True))
        spans: list[_Span] = []
        for ref in refs:
            if not ref.in_segment and cache.checked_marker(ref.base):
                continue  # no records, and its bytes were checked when the state read it
            prev = spans[-1] if spans else None
            header = None
            buf = preloaded.get(ref.base)
            if buf is not None:
                header = decode_header(buf, cache.url(ref.path), ref.base)
                if header.is_claim and len(buf) == header.header_length:
                    cache.note_header(header)
                else:  # an inline batch (or one compaction moved meanwhile): read already
                    spans.append(_Span([ref], preloaded=buf))
                    continue
            elif not ref.in_segment:
                header = cache.header(ref.base)
            if header is not None and header.is_claim:
                if prev is not None and prev.data_path == header.data_path and \
                        prev.data_end == header.data_offset and \
                        prev.size + header.payload_length <= COALESCE_BYTES:
                    prev.add(ref, header)
                else:
                    spans.append(_Span([], header.data_path, header.data_offset,
                                       by_name=False))
                    spans[-1].add(ref, header)
                # A claim read just now, after the state's proof, was read by name.
                spans[-1].by_name |= buf is not None
                continue
            last = prev.refs[-1] if prev is not None and prev.refs else None
            if prev is not None and last is not None and not prev.data_path and ref.in_segment and \
                    last.path == ref.path and last.position + last.size == ref.position and \
                    len(prev.refs) < SPAN_BATCHES:
                prev.refs.append(ref)
                prev.size += ref.size
            else:
                spans.append(_Span([ref], size=max(ref.size, 0)))
        return spans

    def _load_claims(self, span: _Span, start: int, end: int,
                     aborted: Callable[[int, int], bool] | None
                     ) -> list[tuple[Piece | None, int]]:
        """Claims whose payloads lie back to back in one data object: one ranged read.

        A data object that is gone was collected after compaction copied the
        payloads into a segment: each batch is followed there, as a batch
        object deleted under a reader is.
        """
        cache = self._states.cache
        try:
            buf = self._states.storage.read_range(span.data_path, span.data_offset, span.size)
        except FileNotFoundError:
            span.by_name = True  # followed into segments, by their names
            out = []
            for ref, header in zip(span.refs, span.headers, strict=True):
                moved = cache.relocate_claim(ref.base, header)
                out.append(self._load_piece(moved, cache.load(moved), start, end, aborted))
            return out
        out = []
        for ref, header in zip(span.refs, span.headers, strict=True):
            url = cache.url(ref.path)
            payload = buf.slice(header.data_offset - span.data_offset, header.payload_length)
            out.append(self._piece(header, referenced_payload(payload, header, url), url,
                                   start, end, aborted))
        return out

    def _load_span(self, span: list[BatchRef], start: int, end: int,
                   aborted: Callable[[int, int], bool] | None
                   ) -> list[tuple[Piece | None, int]]:
        """The pieces of consecutive batches of one object: one read for all of them."""
        states = self._states
        if len(span) == 1:
            return [self._load_piece(span[0], states.cache.load(span[0]), start, end, aborted)]
        first, last = span[0], span[-1]
        whole = BatchRef(first.base, first.path, first.position,
                         last.position + last.size - first.position)
        try:
            buf = states.storage.read_range(whole.path, whole.position, whole.size)
        except FileNotFoundError:  # the segment went (retention): one by one, with the reason
            return [self._load_piece(r, states.cache.load(r), start, end, aborted) for r in span]
        return [self._load_piece(r, buf.slice(r.position - first.position, r.size), start, end,
                                 aborted) for r in span]

    def _load_piece(self, ref: BatchRef, buf: pa.Buffer, start: int, end: int,
                    aborted: Callable[[int, int], bool] | None
                    ) -> tuple[Piece | None, int]:
        """One batch's records within [start, end) and the batch's payload size.

        Offsets and timestamps are derived here too, so that they are built on
        the reader threads when a read is parallel.

        No records for control batches and aborted transactions (still
        checksummed: damage never passes silently, whatever the reader keeps).
        """
        url = self._states.cache.url(ref.path)
        header = decode_header(buf, url, ref.base)
        if header.is_claim and len(buf) == header.header_length:  # not planned as one
            buf = self._states.cache.inline(ref)
        return self._piece(header, payload_of(buf, header, url), url, start, end, aborted)

    def _piece(self, header: BatchHeader, payload: memoryview, url: str, start: int, end: int,
               aborted: Callable[[int, int], bool] | None) -> tuple[Piece | None, int]:
        """The records of one checked batch within [start, end) (None for a marker or an
        aborted transaction's batch)."""
        base = header.base_offset
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
            millis = repeat(pa.int64(), header.max_timestamp, records.num_rows)
        offsets = pc.add(counting(pa.int64(), records.num_rows), pa.scalar(base + lo, pa.int64()))
        return Piece(records, offsets, millis, header.timestamp_type), header.payload_length


@dataclass
class _Span:
    """One read: consecutive batches of a segment, one batch object, or claims whose
    payloads lie back to back in the data object ``data_path`` from ``data_offset``."""

    refs: list[BatchRef]
    data_path: str = ""
    data_offset: int = 0
    size: int = 0
    headers: list[BatchHeader] = field(default_factory=list)
    preloaded: pa.Buffer | None = None  # a batch object already read whole while planning
    # Whether it reads by a partition's object names (segments, batch objects, claims
    # not known from a proven state), which needs the anchor's proof afterwards.
    by_name: bool = True

    @property
    def data_end(self) -> int:
        return self.data_offset + self.size

    def add(self, ref: BatchRef, header: BatchHeader) -> None:
        self.refs.append(ref)
        self.headers.append(header)
        self.size += header.payload_length


_T = TypeVar("_T")
_R = TypeVar("_R")
# A span's batches as loaded: each one's piece (None: nothing to return) and payload size.
_Loaded = list[tuple[Piece | None, int]]


def _load_all(load: Callable[[_Span], _Loaded], wanted: list[_Span]) -> list[_Loaded]:
    """Every span loaded, in order."""
    if any(span.data_path for span in wanted):
        # Payloads in data objects: ranged reads, several in flight.
        return list(_ahead(_reader_pool(), load, wanted))
    loaded = [load(span) for span in wanted[:1]]
    # Threads pay off for large batches only: for small ones the per-batch
    # Python work dominates and contends for the GIL.
    parallel = len(wanted) > 2 and loaded[0][0][1] >= PARALLEL_MIN_BATCH_BYTES
    loaded += list(_ahead(_reader_pool(), load, wanted[1:])) if parallel \
        else map(load, wanted[1:])
    return loaded


def _ahead(pool: ThreadPoolExecutor, fn: Callable[[_T], _R], items: Iterable[_T]
           ) -> Iterable[_R]:
    """``map(fn, items)`` in order, with up to READ_AHEAD_REQUESTS calls (and about
    READ_AHEAD_BYTES of reads, by each item's ``size`` where it has one) running ahead
    on ``pool``: several ranged GETs in flight, never the whole range at once."""
    running: deque[tuple[Future[_R], int]] = deque()
    in_flight = 0
    for item in items:
        size = max(getattr(item, "size", 0) or 0, 0)
        while running and (len(running) >= READ_AHEAD_REQUESTS or
                           in_flight + size > READ_AHEAD_BYTES):
            future, done = running.popleft()
            in_flight -= done
            yield future.result()
        running.append((pool.submit(fn, item), size))
        in_flight += size
    while running:
        yield running.popleft()[0].result()


def _reader_pool() -> ThreadPoolExecutor:
    """Threads that load batches in parallel: ranged reads wait on storage, and
    memory-mapping, CRC-32C and Arrow decoding release the GIL, so a multi-batch
    read overlaps its requests and uses every core.  As many threads as reads may be
    in flight: they mostly wait on storage."""
    return read_pool()
