"""One partition: a gap-free chain of batch objects, appended by slot claiming.

``PartitionLog`` is the face a ``Log`` hands out for one partition of one
topic incarnation.  The work is done by parts sharing one lock:
state_manager.py (the producer state, kept true to storage, with snapshots),
storage_cache.py (where the batches are: listings, segment heads and indexes,
batch headers), appender.py (slot-claiming appends) and reader.py (ranges
without aborted transactions).  Reads answer in the core's own form (``Piece``s);
clients/columns.py projects them to Kafka's record columns for ``Log.read``.
"""

from __future__ import annotations

from collections.abc import Callable

from ..format.batch import BatchHeader, Payload
from ..storage.contract import Storage
from .appender import Appender, AppendResult, DataReference
from .compaction import (DEFAULT_BUFFER_BYTES, DEFAULT_MIN_BATCHES, DEFAULT_SEGMENT_BYTES, Compacted, compact,
                         retire_batches)
from .isolation import READ_COMMITTED
from .producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS, ProducerState
from .reader import OutcomeResolver, Piece, Reader
from .retention import Retained, apply_retention, delete_records
from .segment_merge import Merged, merge_all
from .state_manager import StateManager
from .storage_cache import BatchRef


class PartitionLog:
    """Appends to and reads from one partition of one topic incarnation; caches its state.

    Bound to ``topic_id``: if the topic is deleted (and perhaps re-created)
    under it, every refresh raises (``UnknownTopicError`` /
    ``InconsistentTopicIdError``) and calls ``on_stale(topic, topic_id)`` so
    the owner can forget it; nothing of one incarnation reaches another.
    """

    def __init__(self, storage: Storage, topic: str, partition: int, topic_id: str,
                 resolver: OutcomeResolver | None = None,
                 on_stale: Callable[[str, str], None] | None = None,
                 producer_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
                 verify: Callable[[BatchHeader], bool] | None = None,
                 unwritten: bool = False) -> None:
        self.storage = storage
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self._states = StateManager(storage, topic, partition, topic_id, on_stale,
                                    producer_expiration_ms, unwritten)
        self._appender = Appender(self._states, verify)
        self._reader = Reader(self._states, resolver)
        self._cache = self._states.cache
        self.dir = self._cache.dir

    def batch_path(self, offset: int) -> str:
        return self._cache.batch_path(offset)

    def header(self, offset: int) -> BatchHeader:
        """Header of the batch based at ``offset`` (cached: batches never change)."""
        return self._cache.header(offset)

    def state(self, listing: bool = False) -> ProducerState:
        """The producer state at the current log end (refreshed from storage: see StateManager;
        ``listing``: the caller is about to read, which lists the batch objects anyway)."""
        return self._states.state(listing)

    def loaded_state(self) -> ProducerState:
        """The current state with every producer entry read (StateManager.loaded_state)."""
        return self._states.loaded_state()

    def proven_state(self) -> ProducerState:
        """The cached state if a refresh or an append's anchor check proved it current
        within GUESS_WINDOW_S, else a refreshed one (what a producer's expiry sweep right
        after its own append reads, without a request)."""
        return self._states.believed_state()

    def end_offset(self) -> int:
        return self.state().end_offset

    def stored(self, state: ProducerState | None = None) -> tuple[int, int, int, int]:
        """What the partition occupies: segments and their bytes (from their headers), then
        batch objects from the compacted end and their bytes (from their headers), up to
        the end of ``state`` if the caller has just refreshed one."""
        heads = self._cache.segment_heads()
        batches, batch_bytes = self._cache.tail_sizes((state or self.state()).end_offset)
        return len(heads), sum(h.total_length for h in heads), batches, batch_bytes

    def batch_refs(self, start: int, end: int | None = None,
                   state: ProducerState | None = None) -> list[BatchRef]:
        """Where the batches holding offsets ``[start, end)`` are (batch objects or stretches
        of segments), in offset order; ``end`` defaults to the log end."""
        state = state or self.state()
        return self._cache.refs(start, state.end_offset if end is None else end, state.end_offset)

    def log_start(self) -> int:
        """The first offset a reader may read: the oldest segment's base, or the log start
        delete-records recorded if higher (listed now)."""
        return self._cache.log_start()

    def listed_log_start(self) -> int:
        """The log start as the last listing of the segments found it (``log_start`` or
        ``stored`` lists them; this sends no request)."""
        return self._cache.known_log_start()

    def delete_records(self, offset: int) -> int:
        """Move the log start up to ``offset`` (-1: the log end), as Kafka's DeleteRecords;
        returns the new log start (retention.py)."""
        return delete_records(self._states, offset)

    def compacted_end(self) -> int:
        """Where the segments end and batch objects begin (0 before any compaction)."""
        return self._cache.compacted_end(refresh=True)

    def first_batch_reaching(self, timestamp_ms: int, end: int | None = None) -> int | None:
        """Base of the first data batch below ``end`` with a record at or after
        ``timestamp_ms`` (segments answer from their time index)."""
        state = self.state()
        return self._cache.first_reaching(timestamp_ms,
                                          state.end_offset if end is None else end,
                                          state.end_offset)

    def append(self, header: BatchHeader, payload: Payload,
               log_append_time: bool = False, continuing: bool = False) -> AppendResult:
        """A data batch at the log end, or the offsets of the batch it duplicates (appender.py).

        ``continuing``: the caller's previous append here has just returned (the next
        batch of one flush), so the slot is tried before refreshing."""
        return self._appender.append(header, payload, log_append_time, continuing)

    def append_claim(self, header: BatchHeader, payload: Payload, reference: DataReference,
                     log_append_time: bool = False, continuing: bool = False) -> AppendResult:
        """A data batch whose payload is already in a data object: only its claim is
        published at the log end (appender.py)."""
        return self._appender.append_claim(header, payload, reference, log_append_time,
                                           continuing)

    def append_claims(self, headers: list[BatchHeader], payloads: list[Payload],
                      reference: DataReference, log_append_time: bool = False,
                      continuing: bool = False) -> list[AppendResult]:
        """Consecutive batches of one producer under one claim: one slot, one small object
        however many batches (appender.py); each batch's offsets."""
        return self._appender.append_claims(headers, payloads, reference, log_append_time,
                                            continuing)

    def append_marker(self, producer_id: int, marker_epoch: int, commit: bool,
                      coordinator_epoch: int = 0, decision_id: str = "",
                      transactional_id: str = "") -> int | None:
        """The marker's offset, or None when the partition already had it (appender.py)."""
        return self._appender.append_marker(producer_id, marker_epoch, commit,
                                            coordinator_epoch, decision_id, transactional_id)

    def last_stable_offset(self, state: ProducerState | None = None) -> int:
        """First offset of the earliest undecided transaction, else the log end."""
        return self._reader.last_stable_offset(state or self.state())

    def aborted_check(self, state: ProducerState, start: int, end: int
                      ) -> Callable[[int, int], bool]:
        """``(producer id, base offset) -> bool``: is a transactional batch in ``[start, end)``
        of ``state``'s prefix aborted (its ABORT marker, or a decision read now)?  The
        filter read_committed applies (reader.py); a table's sync classifies batches with it."""
        return self._reader.aborted_check(state, start, end)

    def read(self, start: int, end: int | None = None, isolation_level: str = READ_COMMITTED,
             max_bytes: int | None = None, recent: bool = False) -> tuple[list[Piece], int]:
        """Records with offsets in ``[start, end)`` in the core's own form: per batch, the
        records, their offsets and millisecond timestamps (reader.py).

        ``end`` is capped at the last stable offset under read_committed and at
        the log end otherwise; ``max_bytes`` stops the read at the first batch
        boundary where the batches read reach it (at least one batch, as a Kafka
        fetch).  ``recent``: a state proven current within the last half second
        will do, without a refresh (a reader still behind the end it last saw).
        Returns the pieces and the offset up to which the partition was read
        (the position to continue from).
        """
        return self._reader.read(start, end, isolation_level, max_bytes, recent)

    def compact(self, max_bytes: int = DEFAULT_SEGMENT_BYTES,
                min_batches: int = DEFAULT_MIN_BATCHES, upto: int | None = None,
                buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> Compacted | None:
        """Merge the oldest run of batch objects into one segment (compaction.py), holding
        about ``buffer_bytes`` and one batch in memory, whatever ``max_bytes`` is."""
        return compact(self._states, max_bytes, min_batches, upto, buffer_bytes)

    def merge_segments(self, max_bytes: int = DEFAULT_SEGMENT_BYTES,
                       buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> list[Merged]:
        """Merge runs of adjacent small segments into segments of at most ``max_bytes``
        (segment_merge.py), so that frequent compactions do not pile up segments; each is
        streamed like a compaction's, holding about ``buffer_bytes``."""
        return merge_all(self._states, max_bytes, buffer_bytes)

    def remove_leftovers(self) -> list[str]:
        """Delete batch objects and snapshots the segments cover (a compaction killed
        half-way, or strays); returns their paths."""
        return retire_batches(self._states, self._cache.compacted_end(refresh=True))

    def apply_retention(self, retention_ms: int = -1, retention_bytes: int = -1,
                        now_ms: int | None = None, held_from: int | None = None) -> Retained:
        """Delete the oldest whole segments that retention allows (retention.py)."""
        return apply_retention(self._states, retention_ms, retention_bytes, now_ms, held_from)
