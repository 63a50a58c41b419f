"""The storage cache of one partition: where its batches are, and their headers.

A partition is a run of segments from its log start to its *compacted end*,
then batch objects from there to its log end (docs/protocol.md, section 7).
Finding a batch should not cost a listing per read, so this cache keeps what
storage said: the segments' bases, headers and indexes, the bases of the batch
objects after them, and batch headers (which never change).  It follows
compaction and retention by listing again when an object it expected is gone.
What the producer state of the partition is, and whether the cache still
describes this incarnation of the topic, is the state manager's business
(state_manager.py); the two share one lock.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import pyarrow as pa

from ..errors import CorruptBatchError, OffsetOutOfRangeError, StorageError
from ..format.batch import (HEADER_READ_SIZE, BatchHeader, ControlRecord, check_claim,
                            decode_control, decode_header, inline_batch, payload_of)
from ..format.segment import (CorruptSegmentError, SegmentHead, SegmentIndex, TimeIndex,
                              read_aborted, read_head, read_header, read_index, read_time_index)
from ..format.topic_ids import current_topic_id
from ..storage.contract import Storage
from ..storage.paths import (BATCH_SUFFIX, LOG_START_SUFFIX, batch_path, listed_segment_names,
                             named_offsets, partition_dir, segment_path, segments_dir)

logger = logging.getLogger(__name__)

RELOADS = 5  # listings or loads in one call before giving up (storage keeps changing under us)


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
class SegmentPiece:
    """A segment as the listing uses it: the offsets from ``start`` that it serves.

    ``start`` is the segment's base, or later when an earlier segment of the
    listing already covers its first offsets (two merges that overlapped, or
    a compactor that published late: docs/protocol.md 7.3).  ``end`` is known
    for merged segments (from the name) and for those whose header was read;
    None means "up to the next piece".
    """

    start: int
    base: int
    end: int | None
    path: str


class StorageCache:
    """Listings, segment heads and indexes, batch locations and headers of one partition
    incarnation, as storage last said; ``lock`` is the partition's."""

    def __init__(self, storage: Storage, topic: str, partition: int, topic_id: str,
                 lock: threading.RLock, stale: Callable[[str | None], NoReturn]) -> None:
        self.storage = storage
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.dir = partition_dir(topic, partition)
        self.lock = lock
        self._stale = stale  # called with the topic's current id when a segment is foreign
        self.reset()

    def reset(self) -> None:
        """Forget everything learnt from storage (at start, and when it was pulled away)."""
        # Base offsets of batch objects from the compacted end, sorted; complete
        # up to the state's end once listed.
        self._bases: list[int] = []
        self._bases_complete = False
        self._headers: dict[int, BatchHeader] = {}
        # Markers (batch objects) a refresh read whole and checked: a read needs nothing
        # of them (they hold no records), so it does not read them again.
        self._checked_markers: set[int] = set()
        # Segments as last listed: where each piece of the chain starts (the segment's
        # base, or later: SegmentPiece), the pieces by start, the segments the chain hides
        # (wholly covered by another: ``(base, end, path)``), and where the newest ends.
        self._segment_bases: list[int] = []
        self._pieces: dict[int, SegmentPiece] = {}
        self._hidden: list[tuple[int, int, str]] = []
        self._compacted_end = 0
        # The largest log start recorded by delete-records (0: none), and when the
        # segments directory, which holds those records, was last listed.
        self._recorded_start = 0
        self._recorded_starts: list[int] = []
        self._listed_at = float("-inf")
        # Keyed by the segment's path: a merged segment and the plain one it replaced
        # may share a base offset.
        self._heads: dict[str, SegmentHead] = {}
        self._indexes: dict[str, SegmentIndex] = {}
        self._time_indexes: dict[str, TimeIndex] = {}
        self._aborted: dict[tuple[str, int], list[tuple[int, int, int]]] = {}

    # --- paths and headers ----------------------------------------------------

    def batch_path(self, offset: int) -> str:
        return batch_path(self.dir, offset)

    def segment_path(self, base: int) -> str:
        """The plain segment name at ``base`` (the one compaction claims)."""
        return segment_path(self.dir, base)

    def piece(self, start: int) -> SegmentPiece:
        """The segment serving the piece of the last listing that starts at ``start``
        (the plain segment there if the listing has no such piece)."""
        found = self._pieces.get(start)
        if found is None:
            found = SegmentPiece(start, start, None, self.segment_path(start))
        return found

    def piece_path(self, start: int) -> str:
        return self.piece(start).path

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

    def note_header(self, header: BatchHeader) -> None:
        """Remember a header read by a state refresh (a read then needs no request for it)."""
        self._headers[header.base_offset] = header

    def note_checked_marker(self, base: int) -> None:
        """The marker batch object at ``base`` was read whole and its checksums checked."""
        self._checked_markers.add(base)

    def checked_marker(self, base: int) -> bool:
        return base in self._checked_markers

    def cached_header(self, offset: int) -> BatchHeader | None:
        return self._headers.get(offset)

    def referenced(self, header: BatchHeader) -> pa.Buffer:
        """A claim's payload bytes, one ranged read of its data object (unchecked: the
        caller checks them against the header).  FileNotFoundError when the data object
        is gone: the claim was compacted and the object collected since it was listed."""
        return self.storage.read_range(header.data_path, header.data_offset,
                                       header.payload_length)

    def inline(self, ref: BatchRef) -> pa.Buffer:
        """The batch as one inline run of bytes, header then payload, however it is stored
        (a batch object, a claim and its data object, or a stretch of a segment).

        The one way compaction and tools obtain a batch's payload bytes: a claim's
        header bytes are kept unchanged (its anchor stays), its payload fetched.
        """
        for _ in range(RELOADS):
            data = self.load(ref)
            url = self.url(ref.path)
            header = decode_header(data, url, ref.base)
            if not header.is_claim or len(data) != header.header_length:
                return data  # inline already (a segment holds claims with their payloads)
            try:
                payload = self.referenced(header)
            except FileNotFoundError:
                ref = self.relocate_claim(ref.base, header)
                continue
            return pa.py_buffer(inline_batch(data, header, payload, url))
        raise StorageError(f"{self.topic}-{self.partition}: the batch at {ref.base} kept "
                           "moving under a read")

    def relocate_claim(self, base: int, header: BatchHeader) -> BatchRef:
        """Where a claim's batch is now that its data object is gone: in a segment
        (compacted, then the object collected).  A claim still in place whose data
        object is missing is damage, named as such."""
        try:
            return self.relocate(base)
        except CorruptBatchError:
            raise CorruptBatchError(f"data object {header.data_path} of this claim is missing",
                                    self.url(self.batch_path(base)), base) from None

    # --- segments -------------------------------------------------------------

    def listed_segments(self, names: list[str] | None = None
                        ) -> list[tuple[int, int | None, str]]:
        """The segments in storage now, ``(base, end or None, name)`` sorted (one listing,
        no header read: ``end`` is known from a merged segment's name only); ``names``:
        the directory's names, listed by the caller just now ([] when a listing of the
        partition showed no segments directory).

        The same listing names the log starts recorded by delete-records and
        retention: the cache keeps the largest (log start records only ever raise it).
        """
        if names is None:
            names = self.storage.list(segments_dir(self.dir))
        with self.lock:
            self._recorded_starts = named_offsets(names, LOG_START_SUFFIX)
            if self._recorded_starts:
                self._recorded_start = max(self._recorded_start, self._recorded_starts[-1])
            self._listed_at = time.monotonic()
        return listed_segment_names(names)

    def _chain(self, listed: list[tuple[int, int | None, str]]
               ) -> tuple[list[SegmentPiece], list[tuple[int, int, str]]]:
        """The pieces a listing reads from, and the segments it hides (docs/protocol.md 7.3).

        Every segment in storage holds the log's own bytes for its range, so
        any segment covering an offset may serve it; the chain takes, for each
        offset, the segment with the smallest base (at one base the merged
        segment with the larger end, then the plain one).  A segment whose
        range another covers wholly is hidden; one that reaches further
        serves only its part past the covered offsets.  A plain segment's end
        is read from its header only where it matters: when it starts inside
        a range already covered, when it starts below the recorded log start,
        and for the newest (the compacted end).
        """
        pieces: list[SegmentPiece] = []
        hidden: list[tuple[int, int, str]] = []
        cur_end: int | None = None
        seg_dir = segments_dir(self.dir)
        for base, end, name in listed:
            path = f"{seg_dir}/{name}"
            if cur_end is not None and base < cur_end:
                if end is None:
                    end = self.head_of(path, base).end_offset
                if end <= cur_end:
                    hidden.append((base, end, path))
                    continue
                pieces.append(SegmentPiece(cur_end, base, end, path))
                cur_end = end
                continue
            if end is None and base < self._recorded_start:
                end = self.head_of(path, base).end_offset
            pieces.append(SegmentPiece(base, base, end, path))
            cur_end = end if end is not None else base + 1
        return pieces, hidden

    def list_segments(self, names: list[str] | None = None) -> list[int]:
        """List the segments again (they come and go under compaction, merging and
        retention); returns where the pieces of the chain start.  ``names``: as for
        ``listed_segments``, used for the first try only."""
        with self.lock:
            for _ in range(RELOADS):
                listed = self.listed_segments(names)
                names = None
                try:
                    pieces, hidden = self._chain(listed)
                    end = 0
                    if pieces:
                        last = pieces[-1]
                        end = last.end if last.end is not None else \
                            self.head_of(last.path, last.base).end_offset
                except FileNotFoundError:
                    continue  # deleted by retention or merging meanwhile: list again
                self._pieces = {p.start: p for p in pieces}
                self._segment_bases = [p.start for p in pieces]
                self._hidden = hidden
                self._compacted_end = end
                self._bases = self._bases[bisect.bisect_left(self._bases, end):]  # sorted
                return list(self._segment_bases)
            raise StorageError(f"{self.topic}-{self.partition}: the segments kept changing "
                               f"under this process ({RELOADS} listings)")

    def pieces(self) -> list[SegmentPiece]:
        """The pieces of the chain as last listed, oldest first (ends filled in from the
        next piece, or the compacted end for the newest)."""
        starts = self._segment_bases
        out = []
        for i, start in enumerate(starts):
            p = self._pieces[start]
            end = p.end if p.end is not None else \
                (starts[i + 1] if i + 1 < len(starts) else self._compacted_end)
            out.append(SegmentPiece(p.start, p.base, end, p.path))
        return out

    def hidden_segments(self) -> list[tuple[int, int, str]]:
        """``(base, end, path)`` of the segments the last listing hides: wholly covered by
        another segment (a merge's inputs not deleted yet, or a late duplicate)."""
        return list(self._hidden)

    def compacted_end(self, refresh: bool = False) -> int:
        """Where the segments end and batch objects begin (as last listed)."""
        if refresh:
            self.list_segments()
        return self._compacted_end

    def log_start(self) -> int:
        """The log start offset, listed now: the larger of the oldest segment's base (0
        without segments) and the log start recorded by delete-records."""
        bases = self.list_segments()
        return max(bases[0] if bases else 0, self._recorded_start)

    def stored_start(self) -> int:
        """The first offset still stored (the oldest segment's base, else 0), as last
        listed: the records below it cannot be read by anyone, whatever they last listed."""
        return self._segment_bases[0] if self._segment_bases else 0

    def known_log_start(self) -> int:
        """The log start as last listed (no request)."""
        return max(self.stored_start(), self._recorded_start)

    def recorded_starts(self) -> list[int]:
        """The offsets of the log start records as last listed, sorted."""
        return list(self._recorded_starts)

    def listing_age_s(self) -> float:
        """Seconds since the segments directory (and the log start records) were listed."""
        return time.monotonic() - self._listed_at

    def head_of(self, path: str, base: int) -> SegmentHead:
        """The header of the segment at ``path`` (based at ``base``), cached."""
        head = self._heads.get(path)
        if head is None:
            head = read_header(self.storage, path, self.url(path), base)
            self._check_topic_id(head)
            self._heads[path] = head
        return head

    def segment_head(self, base: int) -> SegmentHead:
        """The header (range and sections; not the snapshot) of the segment serving the
        piece at ``base``."""
        p = self.piece(base)
        return self.head_of(p.path, p.base)

    def _check_topic_id(self, head: SegmentHead) -> None:
        if head.topic_id != self.topic_id:
            current = current_topic_id(self.storage, self.topic)
            if current != self.topic_id:
                self._stale(current)
            raise CorruptSegmentError(f"segment belongs to topic id {head.topic_id}, not "
                                      f"{self.topic_id}", self.url(head.path), head.base_offset)

    def segment_snapshot(self, base: int) -> tuple[SegmentHead, object]:
        """A segment's header and its snapshot's fields, undecoded (the state manager
        decodes them: the rules of a producer state are not this cache's business)."""
        p = self.piece(base)
        head, fields = read_head(self.storage, p.path, self.url(p.path), p.base)
        self._check_topic_id(head)
        self._heads[p.path] = head
        return head, fields

    def segment_index(self, base: int) -> SegmentIndex:
        head = self.segment_head(base)
        index = self._indexes.get(head.path)
        if index is None:
            index = self._indexes[head.path] = read_index(self.storage, head,
                                                          self.url(head.path))
        return index

    def time_index(self, base: int) -> TimeIndex:
        """A segment's time index (lookups by time and retention only need it)."""
        head = self.segment_head(base)
        index = self._time_indexes.get(head.path)
        if index is None:
            index = self._time_indexes[head.path] = read_time_index(
                self.storage, head, self.segment_index(base), self.url(head.path))
        return index

    def segment_aborted(self, base: int) -> list[tuple[int, int, int]]:
        """``(producer id, first offset, marker offset)`` of the transactions aborted in a
        segment (its aborted section: the reader's aborted index below the compacted end).

        Of a piece that starts past its segment's base, only the markers from the
        piece's start: the earlier ones are the earlier pieces' (each once, in order).
        """
        head = self.segment_head(base)
        found = self._aborted.get((head.path, base))
        if found is None:
            rows = read_aborted(self.storage, head, self.url(head.path))
            if base > head.base_offset:
                rows = rows[rows["last"] >= base]
            found = self._aborted[(head.path, base)] = list(zip(
                rows["producer_id"].tolist(), rows["first"].tolist(), rows["last"].tolist()))
        return found

    def listed_bases(self) -> list[int]:
        """The segments' bases as last listed (no request)."""
        return list(self._segment_bases)

    def _segment_refs(self, base: int, start: int, end: int) -> list[BatchRef]:
        index = self.segment_index(base)
        path = self.piece_path(base)
        lo = max(index.find(max(start, base)), 0)
        hi = int(index.bases.searchsorted(end, side="left"))
        return [BatchRef(int(b), path, int(p), int(n)) for b, p, n in
                zip(index.bases[lo:hi], index.positions[lo:hi], index.sizes[lo:hi])]

    # --- where batches are ----------------------------------------------------

    def note_batch(self, base: int) -> None:
        """A batch object at ``base`` was applied past the cached end: remember where it is."""
        if not self._bases or base > self._bases[-1]:
            self._bases.append(base)

    def list_batches(self) -> list[int]:
        """The bases of the batch objects in storage now, sorted (one listing; a stray in a
        retired slot included: callers follow the chain)."""
        return named_offsets(self.storage.list(self.dir), BATCH_SUFFIX)

    def adopt_batch_listing(self, listed: list[int], log_end: int) -> None:
        """A listing of the batch objects that holds every batch from the compacted end to
        the state the caller just refreshed up to ``log_end`` (state_manager.py says when
        one does): a read then finds the batches without listing them again."""
        with self.lock:
            self._merge_listing(listed, log_end)

    def _merge_listing(self, listed: list[int], log_end: int) -> None:
        """Take ``listed`` up to ``log_end`` as the complete list of batch objects.

        Bases noted past ``log_end`` stay: a thread may apply batches after the
        caller's state was taken, and dropping those would leave the list with a
        gap once the next one is noted (note_batch only appends).  Listed ones
        past ``log_end`` are left out: they may be strays in retired slots."""
        merged = {b for b in listed if b < log_end} | set(self._bases)
        self._bases = sorted(b for b in merged if b >= self._compacted_end)
        self._bases_complete = True

    def _tail_bases(self, log_end: int) -> list[int]:
        """Bases of the batch objects from the compacted end to ``log_end``.

        A listing that does not start at the compacted end means a compaction
        ran since the segments were listed: they are listed again.
        """
        for _ in range(RELOADS):
            if not self._bases_complete:
                self._merge_listing(self.list_batches(), log_end)
            if self._compacted_end >= log_end or \
                    (self._bases and self._bases[0] == self._compacted_end):
                return self._bases
            self._bases_complete = False
            self.list_segments()
        raise CorruptBatchError("batch file is missing from the log",
                                self.url(self.batch_path(self._compacted_end)),
                                self._compacted_end)

    def refs(self, start: int, end: int, log_end: int) -> list[BatchRef]:
        """Where the batches holding offsets ``[start, end)`` are, in offset order.

        Logarithmic in the log's size: a bisection over the segments, one in
        the segment's offset index, one over the batch objects after them.
        """
        with self.lock:
            for _ in range(RELOADS):
                listing_now = not self._bases_complete
                tail = self._tail_bases(log_end)
                try:
                    out = self._segment_part(start, min(end, self._compacted_end))
                except FileNotFoundError:
                    self.list_segments()  # retention removed a segment: look again
                    continue
                first = max(start, self._compacted_end)
                lo = max(bisect.bisect_right(tail, first) - 1, 0)
                stretch = tail[lo:bisect.bisect_left(tail, end, lo=lo)]
                missing = self._gap(stretch)
                if missing is not None:
                    if listing_now:  # storage itself lacks it: a hole, never skipped
                        raise CorruptBatchError("batch file is missing from the log",
                                                self.url(self.batch_path(missing)), missing)
                    logger.warning("%s-%d: the cached batch bases skip offset %d; listing "
                                   "them again", self.topic, self.partition, missing)
                    self._bases_complete = False
                    continue
                out.extend(BatchRef(b, self.batch_path(b)) for b in stretch)
                return out
            raise StorageError(f"{self.topic}-{self.partition}: segments kept vanishing "
                               "under a read")

    def _gap(self, bases: list[int]) -> int | None:
        """The first offset missing between consecutive ``bases`` whose headers are known.

        Batch objects from the compacted end are contiguous, so a known header
        whose next offset is not the next base means the cached list lost a base:
        a reader would skip that batch's records without a word, and a compaction
        would stop its run there on every pass (a long-lived process was once seen
        to stop compacting a partition so; a fresh one compacted it at once)."""
        for base, following in zip(bases, bases[1:]):
            header = self._headers.get(base)
            if header is not None and header.next_offset != following:
                return header.next_offset
        return None

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
            stop = min(end, bases[i + 1]) if i + 1 < len(bases) else end
            out.extend(self._segment_refs(bases[i], start, stop))
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
            for _ in range(RELOADS):
                self.list_segments()
                if base >= self._compacted_end:
                    break
                try:  # below the log start: OffsetOutOfRangeError
                    found = self._segment_part(base, base + 1)
                except FileNotFoundError:
                    continue  # merged or deleted by retention since the listing: list again
                if found and found[0].base == base:
                    return found[0]
                break
            else:
                raise StorageError(f"{self.topic}-{self.partition}: segments kept vanishing "
                                   "under a read")
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

    def first_reaching(self, timestamp_ms: int, end: int, log_end: int) -> int | None:
        """Base of the first data batch below ``end`` whose max timestamp reaches
        ``timestamp_ms``: bisections of the segments' time indexes, then the headers
        of the batch objects after them."""
        with self.lock:
            for base in self.list_segments():
                hit = self.time_index(base).first_reaching(timestamp_ms)
                if hit is not None:
                    return hit if hit < end else None
            for base in self._tail_bases(log_end):
                if base >= end:
                    break
                header = self.header(base)
                if not header.is_control and header.max_timestamp >= timestamp_ms:
                    return base
        return None

    def segment_heads(self) -> list[SegmentHead]:
        """The headers of the segments the chain reads from, oldest first, as listed now
        (one that retention deleted since the listing is left out)."""
        heads = []
        for base in self.list_segments():
            try:
                heads.append(self.segment_head(base))
            except FileNotFoundError:
                continue
        return heads

    def tail_sizes(self, log_end: int) -> tuple[int, int]:
        """The batch objects from the compacted end to ``log_end``: how many, and their
        bytes (from their cached headers, never a payload)."""
        bases = [r.base for r in self.refs(self._compacted_end, log_end, log_end)
                 if not r.in_segment]
        return len(bases), sum(h.header_length + h.payload_length
                               for h in map(self.header, bases))


def _decoded(head: bytes, url: str, offset: int
             ) -> tuple[BatchHeader, ControlRecord | None, bytes]:
    header = decode_header(head, url, offset)
    control = None
    if header.is_claim:
        check_claim(head, header, url)
    if header.is_control:
        control = decode_control(payload_of(head, header, url), header, url)
    return header, control, head
