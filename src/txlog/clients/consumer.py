"""The consumer: manual assignment, positions, and polls over the partition's reader.

Names follow kafka-python's KafkaConsumer.  ``poll`` reads each partition with
the vectorised reader and only then turns the pieces it returns into record
objects, without building Kafka's record columns in between.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import clock
from ..errors import (CorruptBatchError, IllegalStateError, InvalidConfigError,
                      OffsetOutOfRangeError)
from ..partition.isolation import READ_COMMITTED, check_isolation_level
from ..partition.partition_log import PartitionLog
from ..partition.reader import Piece
from ..transactions.groups import commit_offsets
from ..transactions.stable_offsets import stable_offsets
from .metrics import (DEFAULT_NUM_SAMPLES, DEFAULT_SAMPLE_WINDOW_MS, METRIC_SETTINGS,
                      PREFIX_SETTING, ConsumerSensors, MetricConfig)
from .partition_reads import each_partition
from .positions import lag_after_read, offset_for_timestamp, read_limit
from .settings import Setting, Settings, at_least, one_of

if TYPE_CHECKING:
    from ..api.log import Log

TopicPartition = tuple[str, int]

# Kafka's max.partition.fetch.bytes: what one fetch reads of a partition at most (at
# least one batch).
DEFAULT_MAX_PARTITION_FETCH_BYTES = 1 << 20


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int  # milliseconds since the epoch
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@dataclass(frozen=True)
class OffsetAndTimestamp:
    offset: int
    timestamp: int


# What Consumer.__init__ checks (its defaults are in its signature).
_SETTINGS = Settings(
    Setting("isolation_level", lambda name, value: check_isolation_level(value, name)),
    Setting("auto_offset_reset", one_of(
        ("earliest", "latest", "none"),
        "{name} must be 'earliest', 'latest' or 'none', not {value!r}")),
    # True has always passed as 1 here.
    Setting("max_poll_records", at_least(1, "{name} must be a positive int, not {value!r}",
                                         allow_bool=True)),
    Setting("max_partition_fetch_bytes",
            at_least(1, "{name} must be a positive int, not {value!r}")),
    *METRIC_SETTINGS,
    PREFIX_SETTING,
)


class Consumer:
    """Reads assigned partitions in offset order, committed-only by default."""

    def __init__(self, log: Log, *, isolation_level: str = READ_COMMITTED,
                 group_id: str | None = None, auto_offset_reset: str = "latest",
                 max_poll_records: int = 500, abort_expired_transactions: bool = False,
                 max_partition_fetch_bytes: int = DEFAULT_MAX_PARTITION_FETCH_BYTES,
                 metrics_num_samples: int = DEFAULT_NUM_SAMPLES,
                 metrics_sample_window_ms: int = DEFAULT_SAMPLE_WINDOW_MS,
                 metric_group_prefix: str = "consumer") -> None:
        _SETTINGS.check(isolation_level=isolation_level, auto_offset_reset=auto_offset_reset,
                        max_poll_records=max_poll_records,
                        max_partition_fetch_bytes=max_partition_fetch_bytes,
                        metrics_num_samples=metrics_num_samples,
                        metrics_sample_window_ms=metrics_sample_window_ms,
                        metric_group_prefix=metric_group_prefix)
        self._root = log.services
        self.isolation_level = isolation_level
        self.group_id = group_id
        self.auto_offset_reset = auto_offset_reset
        self.max_poll_records = max_poll_records
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.abort_expired_transactions = abort_expired_transactions
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._ahead: dict[TopicPartition, _ReadAhead] = {}  # read ahead of the positions
        self._next = 0  # round-robin start among assigned partitions
        self._closed = False
        self.sensors = ConsumerSensors(MetricConfig(metrics_num_samples, metrics_sample_window_ms),
                                       metric_group_prefix, lambda: len(self._assignment))

    def metrics(self, raw: bool = False) -> dict[Any, Any]:
        """kafka-python's ``{group: {name: value}}`` (clients/metrics.py); ``raw``:
        ``{MetricName: Metric}``."""
        return self.sensors.metrics.values(raw)

    # --- assignment and positions ------------------------------------------------------

    def assign(self, partitions: list[TopicPartition]) -> None:
        self._check_open()
        checked = []
        for tp in partitions:
            topic, partition = tp
            self._root.partition(topic, partition)  # raises for unknown topics and partitions
            checked.append((topic, partition))
        self._assignment = checked
        self._positions = {tp: o for tp, o in self._positions.items() if tp in checked}
        self._ahead = {tp: a for tp, a in self._ahead.items() if tp in checked}

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("the consumer is closed")

    def _check_assigned(self, tp: TopicPartition) -> TopicPartition:
        tp = (tp[0], tp[1])
        if tp not in self._assignment:
            raise IllegalStateError(f"partition {tp[0]}-{tp[1]} is not assigned to this consumer")
        return tp

    def seek(self, topic: str, partition: int, offset: int) -> None:
        tp = self._check_assigned((topic, partition))
        if not isinstance(offset, int) or offset < 0:
            raise InvalidConfigError(f"seek offset must be a non-negative int, not {offset!r}")
        self._positions[tp] = offset

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        starts = self.beginning_offsets(list(partitions or self._assignment))
        for tp, start in starts.items():
            self._positions[self._check_assigned(tp)] = start

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        ends = self.end_offsets(list(partitions or self._assignment))
        for tp, end in ends.items():
            self._positions[self._check_assigned(tp)] = end

    def position(self, topic: str, partition: int) -> int:
        tp = self._check_assigned((topic, partition))
        if tp not in self._positions:
            self._positions[tp] = self._initial_position(tp)
        return self._positions[tp]

    def positions(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """``position`` of each partition, those not known yet looked up at once (each is
        a committed offset or a partition's start or end: requests of its own)."""
        unknown = [self._root.partition(*self._check_assigned(tp)) for tp in partitions
                   if (tp[0], tp[1]) not in self._positions]
        each_partition(unknown, lambda part: self.position(part.topic, part.partition))
        return {(t, p): self.position(t, p) for t, p in partitions}

    def known_positions(self) -> dict[TopicPartition, int]:
        """The positions already set (by a read, a seek or a lookup), looking nothing up:
        what an auto-commit commits, as Kafka commits only partitions with a position."""
        return {tp: o for tp, o in self._positions.items() if tp in self._assignment}

    def _initial_position(self, tp: TopicPartition) -> int:
        if self.group_id is not None:
            committed = stable_offsets(self._root.coordinator, self.group_id, [tp])
            if tp in committed:
                return committed[tp]
        return self._reset_position(tp, IllegalStateError(
            f"no committed offset for {tp[0]}-{tp[1]} and auto_offset_reset='none'"))

    def _reset_position(self, tp: TopicPartition, otherwise: Exception) -> int:
        """Where ``auto_offset_reset`` puts a partition with no usable position."""
        if self.auto_offset_reset == "earliest":
            return self.beginning_offsets([tp])[tp]
        if self.auto_offset_reset == "latest":
            return self.end_offsets([tp])[tp]
        raise otherwise

    # --- offsets ------------------------------------------------------------------------

    def end_offsets(self, partitions: list[TopicPartition] | None = None
                    ) -> dict[TopicPartition, int]:
        """The LSO under read_committed, the log end offset otherwise (as Kafka)."""
        return {(topic, partition): read_limit(self._root, topic, partition, self.isolation_level)
                for topic, partition in partitions or self._assignment}

    def beginning_offsets(self, partitions: list[TopicPartition] | None = None
                          ) -> dict[TopicPartition, int]:
        """The log start offsets: 0 until retention deletes a partition's oldest segments."""
        return {(t, p): self._root.partition(t, p).log_start()
                for t, p in partitions or self._assignment}

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]
                          ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        result: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        for (topic, partition), ts in timestamps.items():
            found = offset_for_timestamp(self._root, topic, partition, ts, self.isolation_level)
            result[(topic, partition)] = None if found is None else OffsetAndTimestamp(*found)
        return result

    def committed(self, topic: str, partition: int) -> int | None:
        if self.group_id is None:
            raise IllegalStateError("committed() needs a group_id")
        return stable_offsets(self._root.coordinator, self.group_id, [(topic, partition)]).get(
            (topic, partition))

    def commit(self, offsets: dict[TopicPartition, int] | None = None) -> None:
        """Commit positions (or ``offsets``) for the group, outside any transaction."""
        if self.group_id is None:
            raise IllegalStateError("commit() needs a group_id")
        if offsets is None:
            offsets = {tp: self.position(*tp) for tp in self._assignment}
        started = time.perf_counter()
        commit_offsets(self._root.storage, self.group_id, offsets)
        self.sensors.commits.record((time.perf_counter() - started) * 1000)

    # --- polling -------------------------------------------------------------------------

    def poll(self, max_records: int | None = None) -> list[ConsumerRecord]:
        """Up to ``max_records`` records, in offset order within each partition."""
        return [record for tp, pieces in self.fetch(max_records).items()
                for record in _rows(tp[0], tp[1], pieces)]

    def fetch(self, max_records: int | None = None,
              partitions: list[TopicPartition] | None = None
              ) -> dict[TopicPartition, list[Piece]]:
        """What ``poll`` reads, as the reader's Arrow pieces per partition.

        The one read path of every consumer API: ``poll`` builds its records
        from these pieces and ``txlog.kafka`` builds kafka-python's.  Returns
        up to ``max_records`` records over ``partitions`` (default: every
        assigned partition; a paused one is left out by its caller), starting
        one partition further each call so that no partition starves, and
        advances each position past what it returns.

        As Kafka's fetcher, it reads ahead: each partition with nothing read
        ahead of its position is read up to ``max_partition_fetch_bytes`` (whole
        batches, at least one), all such partitions at once, and later calls
        hand out what was read before reading again.  A seek drops what was read
        ahead of the old position.
        """
        self._check_open()
        began_ms, started = clock.monotonic_ms(), time.perf_counter()
        budget = self.max_poll_records if max_records is None else max_records
        wanted = None if partitions is None else {(t, p) for t, p in partitions}
        chosen = self._assignment if wanted is None else \
            [tp for tp in self._assignment if tp in wanted]
        n = len(chosen)
        order = [chosen[(self._next + i) % n] for i in range(n)]
        self._read_ahead(self._to_read(order))
        out: dict[TopicPartition, list[Piece]] = {}
        lags = []
        for tp in order:
            if budget <= 0:
                break
            pieces = self._take(tp, budget)
            if tp in self._ahead:
                lags.append(self._ahead[tp].limit - self._positions[tp])
            if pieces:
                out[tp] = pieces
                budget -= sum(len(p.offsets) for p in pieces)
        if n:
            self._next = (self._next + 1) % n
        got = [p for pieces in out.values() for p in pieces]
        self.sensors.fetch(sum(len(p.offsets) for p in got), sum(p.records.nbytes for p in got),
                           began_ms, (time.perf_counter() - started) * 1000, lags)
        return out

    def _to_read(self, order: list[TopicPartition]) -> list[TopicPartition]:
        """The partitions this fetch reads: those with nothing read ahead, except, while
        another has records waiting, those whose last read reached what could be read
        then (caught up, they would only hold the waiting records back by a refresh;
        they are read again once nothing waits, as Kafka's fetcher never delays records
        it has for partitions that have none)."""
        empty = [tp for tp in order if not self._ahead_ready(tp)]
        if len(empty) == len(order):
            return empty
        return [tp for tp in empty if tp not in self._ahead or
                self._ahead[tp].end < self._ahead[tp].limit]

    def _ahead_ready(self, tp: TopicPartition) -> bool:
        """Whether records read ahead wait at the partition's position."""
        ahead = self._ahead.get(tp)
        return ahead is not None and bool(ahead.pieces) and \
            ahead.start == self._positions.get(tp)

    def _read_ahead(self, partitions: list[TopicPartition]) -> None:
        """Read each partition from its position, all at once on an object store (their
        requests overlap: partition_reads.py); each position is left where it was."""
        parts = [self._root.partition(*tp) for tp in partitions]
        for tp, ahead in zip(partitions, each_partition(parts, self._read_partition),
                             strict=True):
            self._ahead[tp] = ahead

    def _read_partition(self, part: PartitionLog) -> _ReadAhead:
        tp = (part.topic, part.partition)
        if self.abort_expired_transactions:
            self._root.coordinator.abort_expired_in(*tp)
        # Still behind the limit its last read saw, the partition needs no refresh
        # for the next one if that read was moments ago (docs/protocol.md 6.1).
        last = self._ahead.get(tp)
        behind = last is not None and last.end < last.limit
        upto: int | None = None
        while True:
            start = self.position(*tp)
            try:
                pieces, next_position = part.read(start, upto, self.isolation_level,
                                                  self.max_partition_fetch_bytes, behind)
            except OffsetOutOfRangeError as exc:
                # Kafka's consumer: a position retention deleted (or past the end)
                # is reset by auto_offset_reset; with 'none' the error surfaces.
                self._positions[tp] = self._reset_position(tp, exc)
                continue
            except CorruptBatchError as exc:
                # As Kafka's: the records before a damaged batch are handed out first;
                # the read that starts at it raises (nothing is ever skipped).
                if exc.offset is None or exc.offset <= start or upto is not None:
                    raise
                upto = exc.offset
                continue
            pieces = [p for p in pieces if len(p.offsets)]
            if pieces or next_position == start:  # a chunk, or nothing more to read
                limit = lag_after_read(self._root, *tp, next_position, self.isolation_level)
                return _ReadAhead(start, deque(pieces), next_position,
                                  limit + next_position)
            self._positions[tp] = next_position  # only aborted records or markers: skip

    def _take(self, tp: TopicPartition, budget: int) -> list[Piece]:
        """Up to ``budget`` records read ahead at the partition's position (the last
        piece split if needed), the position moved past them."""
        ahead = self._ahead.get(tp)
        if ahead is None or ahead.start != self._positions.get(tp):
            return []
        out: list[Piece] = []
        while ahead.pieces and budget > 0:
            piece = ahead.pieces.popleft()
            n = len(piece.offsets)
            if n > budget:
                ahead.pieces.appendleft(_sliced(piece, budget, n - budget))
                piece = _sliced(piece, 0, budget)
                n = budget
            out.append(piece)
            budget -= n
            ahead.start = piece.offsets[-1].as_py() + 1
        if not ahead.pieces:
            ahead.start = ahead.end  # past the markers and aborted batches read with them
        self._positions[tp] = ahead.start
        return out

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass
class _ReadAhead:
    """Pieces read ahead of a partition's position ``start``, up to ``end`` (the read's
    next position), and how far a reader could read when they were read."""

    start: int
    pieces: deque[Piece]
    end: int
    limit: int


def _sliced(piece: Piece, offset: int, length: int) -> Piece:
    return Piece(piece.records.slice(offset, length), piece.offsets.slice(offset, length),
                 piece.timestamps.slice(offset, length), piece.timestamp_type)


def _rows(topic: str, partition: int, pieces: list[Piece]) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    for piece in pieces:
        cols = piece.records.to_pydict()
        out.extend(
            ConsumerRecord(topic, partition, offset, ts, piece.timestamp_type, key, value,
                           [(h["key"], h["value"]) for h in headers])
            for offset, ts, key, value, headers in zip(
                piece.offsets.to_pylist(), piece.timestamps.to_pylist(), cols["key"],
                cols["value"], cols["headers"], strict=True))
    return out
