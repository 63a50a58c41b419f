"""Planning and reading offset ranges: the one read path of the library.

A read is planned once (where does it start and end in each partition, capped
at what the isolation level lets a reader see) and then executed range by
range, possibly in other processes.  The Spark source, the consumer and the
``txlog`` command all stand on this module, so that "earliest", "latest", a
timestamp or the LSO mean the same thing everywhere.

A planned range carries its topic's id: a range planned against one
incarnation of a topic is never read from another (KIP-516).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np
import pyarrow as pa

from ..errors import InvalidConfigError, OffsetOutOfRangeError, UnknownTopicError
from ..storage.names import validate_name

if TYPE_CHECKING:
    from ..log import Log
    from ..partition.partition_log import PartitionLog
    from ..partition.producer_state import ProducerState

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
ISOLATION_LEVELS = (READ_COMMITTED, READ_UNCOMMITTED)

# Kafka's ListOffsets sentinels, as Spark's Kafka source takes them in JSON offsets.
EARLIEST = -2
LATEST = -1
CHUNK_ROWS = 1 << 16  # records per chunk a range is read in (rounded to whole batches)

TopicPartition = tuple[str, int]
PositionKind = Literal["earliest", "latest", "offsets", "timestamp", "timestamps"]


@dataclass(frozen=True)
class Subscription:
    """Which partitions a read covers: Spark's ``subscribe``, ``subscribePattern``, ``assign``."""

    kind: Literal["subscribe", "pattern", "assign"]
    topics: tuple[str, ...] = ()
    pattern: str = ""
    assignment: tuple[TopicPartition, ...] = ()

    @staticmethod
    def subscribe(topics: list[str]) -> Subscription:
        if not topics:
            raise InvalidConfigError("subscribe needs at least one topic")
        for t in topics:
            validate_name(t, "topic")
        return Subscription("subscribe", topics=tuple(dict.fromkeys(topics)))

    @staticmethod
    def subscribe_pattern(pattern: str) -> Subscription:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InvalidConfigError(
                f"subscribePattern {pattern!r} is not a valid regular expression: {exc}") from None
        return Subscription("pattern", pattern=pattern)

    @staticmethod
    def assign(assignment: list[TopicPartition]) -> Subscription:
        if not assignment:
            raise InvalidConfigError("assign needs at least one topic partition")
        for t, p in assignment:
            validate_name(t, "topic")
            if not isinstance(p, int) or isinstance(p, bool) or p < 0:
                raise InvalidConfigError(
                    f"assign: partition {p!r} of topic {t!r} must be a non-negative integer")
        return Subscription("assign", assignment=tuple(dict.fromkeys(assignment)))

    def partitions(self, log: Log) -> list[TopicPartition]:
        """The topic partitions this subscription covers now, sorted."""
        if self.kind == "assign":
            for topic, partition in self.assignment:
                log.partition(topic, partition)  # raises for unknown topics and partitions
            return sorted(self.assignment)
        if self.kind == "pattern":
            regex = re.compile(self.pattern)
            topics = [t for t in log.topics() if regex.fullmatch(t)]
        else:
            topics = list(self.topics)
            missing = [t for t in topics if t not in log.topics()]
            if missing:
                raise UnknownTopicError(
                    f"subscribe: topic(s) {', '.join(map(repr, missing))} do not exist in "
                    f"{log.root}")
        return sorted((t, p) for t in topics
                      for p in range(log.describe_topic(t, refresh=True).partitions))


@dataclass(frozen=True)
class PositionSpec:
    """Where a read starts or ends in each partition.

    ``offsets`` maps a partition to an offset, or to EARLIEST/LATEST;
    partitions it does not name take ``default``.  ``timestamp`` applies one
    time to every partition, ``timestamps`` one per partition: the position
    is the earliest offset whose timestamp is at least that time, or, when no
    record is that late, the latest offset (``if_none="latest"``) or an error
    (``if_none="error"``), as Spark's ``startingOffsetsByTimestampStrategy``.
    """

    kind: PositionKind
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    timestamp: int | None = None
    timestamps: dict[TopicPartition, int] = field(default_factory=dict)
    default: Literal["earliest", "latest"] = "latest"
    if_none: Literal["error", "latest"] = "latest"


@dataclass(frozen=True)
class OffsetRange:
    """``[start, end)`` of one partition, planned against topic incarnation ``topic_id``."""

    topic: str
    partition: int
    topic_id: str
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start



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


def check_isolation_level(isolation_level: str, name: str = "isolation level") -> str:
    """``isolation_level`` if it is one; ``name`` is how the caller's user spells the setting."""
    if isolation_level not in ISOLATION_LEVELS:
        raise InvalidConfigError(f"{name} must be one of {', '.join(ISOLATION_LEVELS)}, "
                                 f"not {isolation_level!r}")
    return isolation_level


def visible_end(isolation_level: str, log_end: int, stable: Callable[[], int]) -> int:
    """How far a reader at ``isolation_level`` may read: the LSO or the log end.

    Every reader's cap is decided here, so that read_committed means the same
    for the core read, the consumer, the ``txlog`` command and Spark.  The
    LSO comes as a callable because working it out may ask the coordinator
    about open transactions, which a read_uncommitted reader never needs.
    """
    check_isolation_level(isolation_level)
    return stable() if isolation_level == READ_COMMITTED else log_end


def bounds(log: Log, topic: str, partition: int) -> PartitionBounds:
    part = log.partition(topic, partition)
    state = part.state()
    return PartitionBounds(topic, partition, part.topic_id, part.log_start(),
                           part.last_stable_offset(state), state.end_offset)


def _partition_limit(part: PartitionLog, state: ProducerState, isolation_level: str) -> int:
    return visible_end(isolation_level, state.end_offset, lambda: part.last_stable_offset(state))


def read_limit(log: Log, topic: str, partition: int, isolation_level: str) -> int:
    """The offset a reader at ``isolation_level`` reads up to (exclusive) right now."""
    part = log.partition(topic, partition)
    return _partition_limit(part, part.state(), isolation_level)


def read_from(log: Log, topic: str, partition: int, start: int, max_records: int,
              isolation_level: str = READ_COMMITTED, include_headers: bool = False
              ) -> tuple[pa.Table, int]:
    """Up to ``max_records`` records from ``start`` that the reader may see, in Spark's columns.

    Also returns the position to continue from: past the records returned and
    past any aborted or control batches skipped, so a polling reader that
    keeps no plan never reads those again.
    """
    return log.partition(topic, partition).read(start, start + max_records, isolation_level,
                                                include_headers)


def offset_for_timestamp(log: Log, topic: str, partition: int, timestamp_ms: int,
                         isolation_level: str = READ_COMMITTED) -> tuple[int, int] | None:
    """Earliest (offset, timestamp) whose timestamp is >= ``timestamp_ms``, or None.

    Kafka's ListOffsets by time: the first batch whose max timestamp reaches
    the target below the reader's cap is found with the segments' time
    indexes, then the headers of the batch objects after them; only that
    batch is decoded and searched, as written (aborted records included).
    """
    part = log.partition(topic, partition)
    state = part.state()
    limit = _partition_limit(part, state, isolation_level)
    base = part.first_batch_reaching(timestamp_ms, limit)
    if base is None:
        return None
    for piece in part.read_pieces(base, min(part.header(base).next_offset, limit),
                                  READ_UNCOMMITTED):
        hits = np.flatnonzero(piece.timestamps.to_numpy() >= timestamp_ms)
        if len(hits):
            i = int(hits[0])
            return int(piece.offsets[i].as_py()), int(piece.timestamps[i].as_py())
    return None


def _resolve(log: Log, b: PartitionBounds, spec: PositionSpec, isolation_level: str,
             what: str) -> int:
    """One partition's position under ``spec``; ``what`` names the option in errors."""
    tp = (b.topic, b.partition)
    limit = b.limit(isolation_level)
    kind = spec.kind
    if kind == "earliest":
        return b.log_start
    if kind == "latest":
        return limit
    if kind == "offsets":
        if tp not in spec.offsets:
            return _resolve(log, b, PositionSpec(spec.default), isolation_level, what)
        offset = spec.offsets[tp]
        if offset == EARLIEST:
            return b.log_start
        if offset == LATEST:
            return limit
        if offset < 0:
            raise InvalidConfigError(
                f"{what}: offset {offset} for {b.topic}-{b.partition} is negative; use an "
                f"offset, {EARLIEST} (earliest) or {LATEST} (latest)")
        return offset
    if kind == "timestamp":
        assert spec.timestamp is not None
        ts = spec.timestamp
    else:
        if tp not in spec.timestamps:
            return _resolve(log, b, PositionSpec(spec.default), isolation_level, what)
        ts = spec.timestamps[tp]
    found = offset_for_timestamp(log, b.topic, b.partition, ts, isolation_level)
    if found is not None:
        return found[0]
    if spec.if_none == "latest":
        return limit
    raise OffsetOutOfRangeError(
        f"{what}: no record in {b.topic}-{b.partition} has a timestamp at or after {ts} ms "
        "(set startingOffsetsByTimestampStrategy to 'latest' to start at the end instead)")


def plan(log: Log, partitions: list[TopicPartition], start: PositionSpec,
         end: PositionSpec, isolation_level: str = READ_COMMITTED,
         fail_on_data_loss: bool = True, exact: bool = True) -> list[OffsetRange]:
    """Fix ``[start, end)`` for each partition, ``end`` capped at what the reader may see.

    Below the LSO every transaction's outcome is fixed, so a range planned
    here reads the same records however often and wherever it is read.
    A start past the visible end (or before the log start) is lost or
    not-yet-written data: an error with ``fail_on_data_loss``, else the
    range is clamped, as Spark's Kafka source does.

    With ``exact`` (a batch read), a per-partition map must name exactly the
    partitions read, as Spark requires: a partition left out would silently
    be read whole or not at all.  A stream passes False, so that partitions
    created later take the spec's default.
    """
    check_isolation_level(isolation_level)
    if exact:
        for spec, what in ((start, "starting"), (end, "ending")):
            check_named_partitions(spec, partitions, what)
    ranges = []
    for topic, partition in partitions:
        b = bounds(log, topic, partition)
        limit = b.limit(isolation_level)
        lo = _resolve(log, b, start, isolation_level, "starting position")
        hi = min(_resolve(log, b, end, isolation_level, "ending position"), limit)
        if lo < b.log_start or lo > limit:
            if fail_on_data_loss:
                raise OffsetOutOfRangeError(
                    f"starting offset {lo} of {topic}-{partition} is outside the readable "
                    f"offsets {b.log_start} to {limit} ({isolation_level}); set "
                    "failOnDataLoss to false to read what is there instead")
            lo = min(max(lo, b.log_start), limit)
        ranges.append(OffsetRange(topic, partition, b.topic_id, lo, max(hi, lo)))
    return ranges


def check_named_partitions(spec: PositionSpec, partitions: list[TopicPartition],
                           what: str) -> None:
    """Refuse a per-partition map of ``what`` ("starting"/"ending") that is not exactly ``partitions``."""
    named = set(spec.offsets) if spec.kind == "offsets" else \
        set(spec.timestamps) if spec.kind == "timestamps" else None
    if named is None or named == set(partitions):
        return

    def show(tps: set[TopicPartition]) -> str:
        return ", ".join(f"{t}-{p}" for t, p in sorted(tps)) or "none"

    option = f"{what}Offsets" + ("ByTimestamp" if spec.kind == "timestamps" else "")
    raise InvalidConfigError(
        f"option '{option}' must name every partition read and no other: read are "
        f"{show(set(partitions))}; missing from it: {show(set(partitions) - named)}; not read: "
        f"{show(named - set(partitions))}")


def split(ranges: list[OffsetRange], min_partitions: int | None = None,
          max_records: int | None = None) -> list[OffsetRange]:
    """Cut ranges so no piece exceeds ``max_records`` and there are ``min_partitions`` pieces.

    Pieces of one partition stay in offset order; large partitions get more
    pieces in proportion to their size (Spark's KafkaOffsetRangeCalculator
    does the same), so the work per task evens out.
    """
    pieces: list[OffsetRange] = []
    for r in ranges:
        parts = 1 if not max_records else max(-(-r.size // max_records), 1)
        pieces.extend(_cut(r, parts))
    total = sum(r.size for r in pieces)
    if min_partitions and len(pieces) < min_partitions and total > 0:
        out = []
        for r in pieces:
            parts = max(-(-r.size * min_partitions // total), 1)
            out.extend(_cut(r, parts))
        pieces = out
    return pieces


def _cut(r: OffsetRange, parts: int) -> list[OffsetRange]:
    parts = max(min(parts, r.size), 1)
    step, extra = divmod(r.size, parts)
    out, lo = [], r.start
    for i in range(parts):
        hi = lo + step + (1 if i < extra else 0)
        out.append(OffsetRange(r.topic, r.partition, r.topic_id, lo, hi))
        lo = hi
    return out


def read_range(log: Log, rng: OffsetRange, isolation_level: str = READ_COMMITTED,
               include_headers: bool = False, chunk_rows: int = CHUNK_ROWS
               ) -> Iterator[pa.RecordBatch]:
    """The records of a planned range as record batches in Spark's Kafka columns.

    Reads batch-aligned chunks of about ``chunk_rows`` records, so memory stays
    bounded for ranges of any size; aborted and control batches are dropped
    under read_committed.  A range planned against another incarnation of
    the topic is refused.
    """
    part = log.partition(rng.topic, rng.partition, topic_id=rng.topic_id)
    pos = rng.start
    while pos < rng.end:
        table, nxt = part.read(pos, _chunk_end(part, pos, rng.end, chunk_rows),
                               isolation_level, include_headers)
        if nxt <= pos:
            raise OffsetOutOfRangeError(
                f"{rng.topic}-{rng.partition}: offsets {pos} to {rng.end} were planned but the "
                f"partition can be read only up to {nxt} now")
        yield from table.to_batches()
        pos = nxt


def _chunk_end(part: PartitionLog, start: int, end: int, rows: int) -> int:
    """The first batch boundary at or after ``start + rows`` (``end`` at the most)."""
    if start + rows >= end:
        return end
    target = start + rows
    holding = part.batch_refs(target, target + 1)[0].base
    return min(holding if holding == target else part.header(holding).next_offset, end)
