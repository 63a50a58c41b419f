"""Planning and reading offset ranges: how the Spark source reads.

A read is planned once (where does it start and end in each partition, capped
at what the isolation level lets a reader see) and then executed range by
range, possibly in other processes.  The positions and limits a plan stands
on are the core's (clients/positions.py, partition/isolation.py), so that
"earliest", "latest", a timestamp or the LSO mean here what they mean to the
consumer and the ``txlog`` command.

A planned range carries its topic's id: a range planned against one
incarnation of a topic is never read from another (KIP-516).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import pyarrow as pa

from ..clients.columns import to_spark_table
from ..clients.positions import PartitionBounds, bounds_all, offset_for_timestamp
from ..errors import InvalidConfigError, OffsetOutOfRangeError, UnknownTopicError
from ..integers import is_int
from ..partition.isolation import READ_COMMITTED, check_isolation_level
from ..root.root import Root
from ..storage.names import validate_name

if TYPE_CHECKING:
    from ..partition.partition_log import PartitionLog

logger = logging.getLogger(__name__)

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
            if not is_int(p) or p < 0:
                raise InvalidConfigError(
                    f"assign: partition {p!r} of topic {t!r} must be a non-negative integer")
        return Subscription("assign", assignment=tuple(dict.fromkeys(assignment)))

    def partitions(self, root: Root) -> list[TopicPartition]:
        """The topic partitions this subscription covers now, sorted."""
        if self.kind == "assign":
            for topic, partition in self.assignment:
                root.partition(topic, partition)  # raises for unknown topics and partitions
            return sorted(self.assignment)
        if self.kind == "pattern":
            regex = re.compile(self.pattern)
            topics = [t for t in root.topics() if regex.fullmatch(t)]
        else:
            topics = list(self.topics)
            missing = [t for t in topics if t not in root.topics()]
            if missing:
                raise UnknownTopicError(
                    f"subscribe: topic(s) {', '.join(map(repr, missing))} do not exist in "
                    f"{root.url}")
        return sorted((t, p) for t in topics
                      for p in range(root.describe_topic(t, refresh=True).partitions))


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


def _resolve(root: Root, b: PartitionBounds, spec: PositionSpec, isolation_level: str,
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
            return _resolve(root, b, PositionSpec(spec.default), isolation_level, what)
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
            return _resolve(root, b, PositionSpec(spec.default), isolation_level, what)
        ts = spec.timestamps[tp]
    found = offset_for_timestamp(root, b.topic, b.partition, ts, isolation_level)
    if found is not None:
        return found[0]
    if spec.if_none == "latest":
        return limit
    raise OffsetOutOfRangeError(
        f"{what}: no record in {b.topic}-{b.partition} has a timestamp at or after {ts} ms "
        "(set startingOffsetsByTimestampStrategy to 'latest' to start at the end instead)")


def plan(root: Root, partitions: list[TopicPartition], start: PositionSpec,
         end: PositionSpec, isolation_level: str = READ_COMMITTED,
         fail_on_data_loss: bool = True, exact: bool = True,
         topic_ids: Mapping[str, str] | None = None) -> list[OffsetRange]:
    """Fix ``[start, end)`` for each partition, ``end`` capped at what the reader may see.

    Below the LSO every transaction's outcome is fixed, so a range planned
    here reads the same records however often and wherever it is read.
    A start past the visible end (or before the log start), or an explicit
    end past the visible end, is lost or not-yet-readable data: an error
    with ``fail_on_data_loss``, else the range is clamped (with a warning
    for the end), as Spark's Kafka source does for offsets out of range.

    With ``exact`` (a batch read), a per-partition map must name exactly the
    partitions read, as Spark requires: a partition left out would silently
    be read whole or not at all.  A stream passes False, so that partitions
    created later take the spec's default.

    ``topic_ids``: the incarnation each topic named there must be (the ``topicIds``
    option); a topic deleted and re-created since is InconsistentTopicIdError.
    """
    check_isolation_level(isolation_level)
    if exact:
        for spec, what in ((start, "starting"), (end, "ending")):
            check_named_partitions(spec, partitions, what)
    ranges = []
    bounds = bounds_all(root, partitions, topic_ids)
    for (topic, partition), b in zip(partitions, bounds, strict=True):
        limit = b.limit(isolation_level)
        lo = _resolve(root, b, start, isolation_level, "starting position")
        hi = _resolve(root, b, end, isolation_level, "ending position")
        if hi > limit:
            # Only an explicit ending offset can lie past the cap; a shorter range
            # must not come back without a word (Spark's Kafka source fails or warns).
            message = (f"ending offset {hi} of {topic}-{partition} is past the readable "
                       f"offsets {b.log_start} to {limit} ({isolation_level}"
                       + (f"; the last stable offset is held at {limit} by an open "
                          "transaction" if limit < b.end else "") + ")")
            if fail_on_data_loss:
                raise OffsetOutOfRangeError(
                    f"{message}; set failOnDataLoss to false to read up to {limit} instead")
            logger.warning("%s; reading up to %d", message, limit)
            hi = limit
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


def read_range(root: Root, rng: OffsetRange, isolation_level: str = READ_COMMITTED,
               include_headers: bool = False, chunk_rows: int = CHUNK_ROWS
               ) -> Iterator[pa.RecordBatch]:
    """The records of a planned range as record batches in Spark's Kafka columns.

    Reads batch-aligned chunks of about ``chunk_rows`` records, so memory stays
    bounded for ranges of any size; aborted and control batches are dropped
    under read_committed.  A range planned against another incarnation of
    the topic is refused.
    """
    part = root.partition(rng.topic, rng.partition, topic_id=rng.topic_id)
    pos = rng.start
    while pos < rng.end:
        pieces, nxt = part.read(pos, _chunk_end(part, pos, rng.end, chunk_rows), isolation_level)
        table = to_spark_table(pieces, rng.topic, rng.partition, include_headers)
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
