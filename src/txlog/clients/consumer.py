"""The consumer: manual assignment, positions, and polls over the partition's reader.

Names follow kafka-python's KafkaConsumer.  ``poll`` reads each partition with
the vectorised reader and only then turns the pieces it returns into record
objects, without building Kafka's record columns in between.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import clock
from ..errors import IllegalStateError, InvalidConfigError, OffsetOutOfRangeError
from ..partition.isolation import READ_COMMITTED, check_isolation_level
from ..transactions.groups import commit_offsets
from ..transactions.stable_offsets import stable_offsets
from .metrics import (DEFAULT_NUM_SAMPLES, DEFAULT_SAMPLE_WINDOW_MS, METRIC_SETTINGS,
                      PREFIX_SETTING, ConsumerSensors, MetricConfig)
from .positions import lag_after_read, offset_for_timestamp, read_limit
from .settings import Setting, Settings, at_least, one_of

if TYPE_CHECKING:
    from ..api.log import Log
    from ..partition.reader import Piece

TopicPartition = tuple[str, int]


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
    *METRIC_SETTINGS,
    PREFIX_SETTING,
)


class Consumer:
    """Reads assigned partitions in offset order, committed-only by default."""

    def __init__(self, log: Log, *, isolation_level: str = READ_COMMITTED,
                 group_id: str | None = None, auto_offset_reset: str = "latest",
                 max_poll_records: int = 500, abort_expired_transactions: bool = False,
                 metrics_num_samples: int = DEFAULT_NUM_SAMPLES,
                 metrics_sample_window_ms: int = DEFAULT_SAMPLE_WINDOW_MS,
                 metric_group_prefix: str = "consumer") -> None:
        _SETTINGS.check(isolation_level=isolation_level, auto_offset_reset=auto_offset_reset,
                        max_poll_records=max_poll_records,
                        metrics_num_samples=metrics_num_samples,
                        metrics_sample_window_ms=metrics_sample_window_ms,
                        metric_group_prefix=metric_group_prefix)
        self._root = log.services
        self.isolation_level = isolation_level
        self.group_id = group_id
        self.auto_offset_reset = auto_offset_reset
        self.max_poll_records = max_poll_records
        self.abort_expired_transactions = abort_expired_transactions
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
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
        from these pieces and ``txlog.kafka`` builds kafka-python's.  Reads up
        to ``max_records`` records over ``partitions`` (default: every assigned
        partition; a paused one is left out by its caller), starting one
        partition further each call so that no partition starves, and
        advances each position past what it returns.
        """
        self._check_open()
        began_ms, started = clock.monotonic_ms(), time.perf_counter()
        budget = self.max_poll_records if max_records is None else max_records
        wanted = None if partitions is None else {(t, p) for t, p in partitions}
        chosen = self._assignment if wanted is None else \
            [tp for tp in self._assignment if tp in wanted]
        out: dict[TopicPartition, list[Piece]] = {}
        lags = []
        n = len(chosen)
        for i in range(n):
            if budget <= 0:
                break
            tp = chosen[(self._next + i) % n]
            pieces = self._fetch_partition(tp, budget)
            lags.append(lag_after_read(self._root, *tp, self._positions[tp],
                                       self.isolation_level))
            if pieces:
                out[tp] = pieces
                budget -= sum(len(p.offsets) for p in pieces)
        if n:
            self._next = (self._next + 1) % n
        got = [p for pieces in out.values() for p in pieces]
        self.sensors.fetch(sum(len(p.offsets) for p in got), sum(p.records.nbytes for p in got),
                           began_ms, (time.perf_counter() - started) * 1000, lags)
        return out

    def _fetch_partition(self, tp: TopicPartition, budget: int) -> list[Piece]:
        topic, partition = tp
        if self.abort_expired_transactions:
            self._root.coordinator.abort_expired_in(topic, partition)
        while True:
            start = self.position(topic, partition)
            try:
                pieces, next_position = self._root.partition(topic, partition).read(
                    start, start + budget, self.isolation_level)
            except OffsetOutOfRangeError as exc:
                # Kafka's consumer: a position retention deleted (or past the end)
                # is reset by auto_offset_reset; with 'none' the error surfaces.
                self._positions[tp] = self._reset_position(tp, exc)
                continue
            self._positions[tp] = next_position
            pieces = [p for p in pieces if len(p.offsets)]
            if next_position == start or pieces:
                return pieces  # nothing more to read, or a chunk delivered

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


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
