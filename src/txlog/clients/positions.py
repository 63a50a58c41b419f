"""Positions in a partition as a reader sees them: bounds, read limits, offsets by time.

Shared by the consumer, ``Log.offsets_for_times``, the ``txlog`` command and
the Spark source, so that "earliest", "latest", a timestamp or the LSO mean
the same thing everywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..partition.isolation import READ_COMMITTED, READ_UNCOMMITTED, visible_end
from ..partition.partition_log import PartitionLog
from ..root.root import Root
from .partition_reads import each_partition

if TYPE_CHECKING:
    from ..partition.producer_state import ProducerState
    from ..partition.reader import Piece

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionBounds:
    """What one partition holds now: its log start, last stable offset and log end."""

    topic: str
    partition: int
    topic_id: str
    log_start: int
    stable: int
    end: int

    def limit(self, isolation_level: str) -> int:
        """How far a reader at ``isolation_level`` may read: the LSO or the log end."""
        return visible_end(isolation_level, self.end, lambda: self.stable)

    def lag(self, committed: int) -> int:
        """A group's lag here: log end minus its committed offset, as kafka-consumer-groups
        takes it; never below 0 (an offset committed past the end, e.g. of a topic since
        re-created, leaves nothing to read)."""
        return max(self.end - committed, 0)


def bounds(root: Root, topic: str, partition: int) -> PartitionBounds:
    part = root.partition(topic, partition)
    return bounds_of(part, part.state(), part.log_start())


def bounds_all(root: Root, partitions: list[tuple[str, int]],
               topic_ids: Mapping[str, str] | None = None) -> list[PartitionBounds]:
    """``bounds`` of each partition, all at once on an object store (partition_reads.py);
    a cold partition lists its batch objects to read its headers at once (docs/protocol.md
    6.1).  ``topic_ids``: the incarnation a topic named there must be, else
    InconsistentTopicIdError."""
    ids = topic_ids or {}
    return each_partition([root.partition(t, p, topic_id=ids.get(t)) for t, p in partitions],
                          lambda part: bounds_of(part, part.state(listing=True),
                                                 part.log_start()))


def bounds_of(part: PartitionLog, state: ProducerState, log_start: int) -> PartitionBounds:
    """The bounds from a state and a log start the caller has just read (an operator's
    scrape takes the log start from the listing that also sizes the partition)."""
    # A transaction left open below a log start delete-records moved holds nothing a
    # reader can reach: as Kafka, the LSO is never below the log start.
    return PartitionBounds(part.topic, part.partition, part.topic_id, log_start,
                           max(part.last_stable_offset(state), log_start), state.end_offset)


def end_expired_transactions(root: Root, partitions: list[tuple[str, int]]) -> None:
    """End the expired transactions that hold back these partitions' LSO.

    A transaction whose producer died holds every read_committed reader
    until its timeout (a shared one: its lease) has passed and some process
    aborts it.  Producers of the partition do that, but a topic nobody
    writes to any more would stay held, so readers may do it too: aborting
    an expired transaction is allowed to any process (docs/protocol.md 4.9),
    and decided ones are only rolled forward.  A reader that may not write
    to the log only logs what holds it.
    """
    def end_in(part: PartitionLog) -> None:
        # The refresh a read would make: a cold partition lists its batch objects.
        state = part.state(listing=True)
        if part.last_stable_offset(state) >= state.end_offset:
            return  # nothing undecided holds it: the common case costs no request
        try:
            root.coordinator.abort_expired_in(part.topic, part.partition)
        except PermissionError as exc:
            logger.warning("%s-%d: its last stable offset is held by an open transaction, and "
                           "this reader may not write to the log to end it if it has expired "
                           "(%s)", part.topic, part.partition, exc)

    each_partition([root.partition(t, p) for t, p in partitions], end_in)


def _partition_limit(part: PartitionLog, state: ProducerState, isolation_level: str) -> int:
    return visible_end(isolation_level, state.end_offset, lambda: part.last_stable_offset(state))


def read_limit(root: Root, topic: str, partition: int, isolation_level: str) -> int:
    """The offset a reader at ``isolation_level`` reads up to (exclusive) right now."""
    part = root.partition(topic, partition)
    return _partition_limit(part, part.state(), isolation_level)


def lag_after_read(root: Root, topic: str, partition: int, position: int,
                   isolation_level: str) -> int:
    """Records between ``position`` and what a reader at ``isolation_level`` may read,
    from the state a read has just proven current (no request then; a refresh if the
    read took longer than the state manager trusts a proof)."""
    part = root.partition(topic, partition)
    return _partition_limit(part, part.proven_state(), isolation_level) - position


def offset_for_timestamp(root: Root, topic: str, partition: int, timestamp_ms: int,
                         isolation_level: str = READ_COMMITTED) -> tuple[int, int] | None:
    """Earliest (offset, timestamp) whose timestamp is >= ``timestamp_ms``, or None.

    Kafka's ListOffsets by time: the first batch whose max timestamp reaches
    the target below the reader's cap is found with the segments' time
    indexes, then the headers of the batch objects after them; only that
    batch is decoded and searched, as written (aborted records included).
    """
    part = root.partition(topic, partition)
    state = part.state()
    limit = _partition_limit(part, state, isolation_level)
    base = part.first_batch_reaching(timestamp_ms, limit)
    if base is None:
        return None
    log_start = part.log_start()
    if base >= log_start:
        pieces, _ = part.read(base, min(part.header(base).next_offset, limit), READ_UNCOMMITTED)
        return _first_reaching(pieces, timestamp_ms)
    # The batch lies below a log start delete-records moved (retention has not deleted
    # it yet): as Kafka, the answer is the first record at or after the log start.
    position = log_start
    while position < limit:
        pieces, position_after = part.read(position, min(position + TIME_SCAN_OFFSETS, limit),
                                           READ_UNCOMMITTED)
        found = _first_reaching(pieces, timestamp_ms)
        if found is not None or position_after <= position:
            return found
        position = position_after
    return None


TIME_SCAN_OFFSETS = 10_000  # offsets read at once when a time lookup scans from the log start


def _first_reaching(pieces: list[Piece], timestamp_ms: int) -> tuple[int, int] | None:
    for piece in pieces:
        hits = np.flatnonzero(piece.timestamps.to_numpy() >= timestamp_ms)
        if len(hits):
            i = int(hits[0])
            return int(piece.offsets[i].as_py()), int(piece.timestamps[i].as_py())
    return None
