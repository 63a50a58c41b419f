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
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import pyarrow as pa

from .errors import InvalidConfigError, OffsetOutOfRangeError, UnknownTopicError
from .names import validate_name

if TYPE_CHECKING:
    from .log import Log

# Kafka's ListOffsets sentinels, as Spark's Kafka source takes them in JSON offsets.
EARLIEST = -2
LATEST = -1

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
        return sorted((t, p) for t in topics for p in range(log.describe_topic(t).partitions))


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

