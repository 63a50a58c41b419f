"""Streaming reads: micro-batch ends chosen on the driver under Spark's read limits.

Offsets travel through Spark's checkpoint as ``{"topic": {"partition": offset}}``,
the JSON Spark's Kafka source uses, so a checkpoint can be read by a person.
Every end is at most the LSO under read_committed: below it every
transaction's outcome is fixed, so a micro-batch that Spark replays after a
crash reads exactly the records it read the first time.

The driver-side object lives as long as the query runs in one process
(Spark's Python streaming source runner), so it may remember the initial
offsets, the AvailableNow target and the last trigger time; ``read`` runs on
pickled copies on executors and uses nothing but its partition and options.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxBytes,
                                              ReadMaxRows, ReadMinRows,
                                              SupportsTriggerAvailableNow)

from .. import clock
from ..clients.positions import bounds, end_expired_transactions, read_limit
from . import planning
from ..errors import OffsetOutOfRangeError, UnknownTopicError
from ..root.root import Root
from ..transactions.groups import commit_offsets
from . import admission
from .options import ReadOptions
from .reader import TxlogInputPartition, read_ranges

Positions = dict[planning.TopicPartition, int]
logger = logging.getLogger(__name__)


def to_json(positions: Positions) -> dict:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(positions.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def from_json(offsets: dict) -> Positions:
    return {(topic, int(p)): int(o) for topic, parts in offsets.items() for p, o in parts.items()}


class TxlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: ReadOptions, arrow_schema: pa.Schema) -> None:
        self.options = options
        self.arrow_schema = arrow_schema
        self._initial: dict | None = None
        self._target: Positions | None = None  # Trigger.AvailableNow: never read past it
        self._last_trigger_ms = clock.monotonic_ms()

    def _root(self) -> Root:
        root = getattr(self, "_cached_root", None)
        if root is None:
            root = self._cached_root = Root(self.options.path, create=False,
                                            storage_options=self.options.storage_options)
        return root

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_cached_root", None)
        return state

    # --- the driver -------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        """Where a new query starts (``startingOffsets``, default latest).

        Spark asks twice on a fresh query and both answers must agree, even
        if records arrive in between: the first answer is kept.
        """
        if self._initial is None:
            o = self.options
            root = self._root()
            tps = o.subscription.partitions(root)
            ranges = planning.plan(root, tps, o.starting, planning.PositionSpec("latest"),
                               o.isolation_level, o.fail_on_data_loss, exact=False)
            self._initial = to_json({(r.topic, r.partition): r.start for r in ranges})
        return self._initial

    def _available(self) -> Positions:
        """How far each subscribed partition can be read now (LSO or log end)."""
        root = self._root()
        o = self.options
        tps = o.subscription.partitions(root)
        if o.abort_expired_transactions and o.isolation_level == planning.READ_COMMITTED:
            end_expired_transactions(root, tps)
        return {tp: read_limit(root, *tp, o.isolation_level) for tp in tps}

    def _checked_start(self, start: Positions, available: Positions) -> Positions:
        """``start`` for every partition read now; new partitions start at their beginning.

        A start the log cannot serve any more (its topic or partition was
        deleted, or it is past what the log holds now) is data loss: an error
        with failOnDataLoss, else the partition is skipped or clamped.
        """
        out: Positions = {}
        for tp, end in available.items():
            offset = start.get(tp, 0)
            if offset > end and tp in start and self._lost(
                    f"{tp[0]}-{tp[1]}: the query has read up to offset {offset} but the "
                    f"partition now ends at {end} (was the topic deleted and re-created?)"):
                offset = end
            out[tp] = offset
        for tp in start.keys() - available.keys():
            self._lost(f"{tp[0]}-{tp[1]}: the partition the query was reading is gone "
                       "(its topic was deleted)")
        return out

    def _lost(self, message: str) -> bool:
        if self.options.fail_on_data_loss:
            raise OffsetOutOfRangeError(
                f"{message}; set failOnDataLoss to false to skip what is lost and go on")
        return True

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        available = self._available()
        begin = self._checked_start(from_json(start), available)
        end = dict(available)
        if self._target is not None:
            end = {tp: max(min(e, self._target.get(tp, begin[tp])), begin[tp])
                   for tp, e in end.items()}
        if not isinstance(limit, ReadAllAvailable):
            end = self._admit(begin, end, limit)
        return to_json(end)

    def _admit(self, begin: Positions, end: Positions, limit: ReadLimit) -> Positions:
        """``end`` under every limit the options set; the one Spark passes wins for its kind
        (Spark hands back the default limit, or one it chose for the trigger)."""
        o = self.options
        min_rows = limit.min_rows if isinstance(limit, ReadMinRows) else o.min_offsets_per_trigger
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else o.max_offsets_per_trigger
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else o.max_bytes_per_trigger
        if min_rows is not None and self._target is None:
            waiting = sum(admission.backlog(begin, end).values())
            delay = o.max_trigger_delay_ms or 0
            if waiting < min_rows and clock.monotonic_ms() - self._last_trigger_ms < delay:
                return begin
        if max_rows is not None:
            end = admission.limit_rows(begin, end, max_rows)
        if max_bytes is not None:
            end = admission.limit_bytes(self._root(), begin, end, max_bytes)
        if end != begin:
            self._last_trigger_ms = clock.monotonic_ms()
        return end

    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.options
        if o.max_offsets_per_trigger is not None:
            return ReadMaxRows(o.max_offsets_per_trigger)
        if o.max_bytes_per_trigger is not None:
            return ReadMaxBytes(o.max_bytes_per_trigger)
        if o.min_offsets_per_trigger is not None:
            return ReadMinRows(o.min_offsets_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict | None:
        return to_json(self._available())

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._available()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ends = from_json(end)
        starts = from_json(start)
        root = self._root()
        ranges = []
        for tp, hi in sorted(ends.items()):
            lo = starts.get(tp, 0)
            if hi <= lo:
                continue
            try:
                topic_id = bounds(root, *tp).topic_id
            except UnknownTopicError:
                if self._lost(f"{tp[0]}-{tp[1]}: offsets {lo} to {hi} were planned but the "
                              "topic is gone"):
                    continue
            ranges.append(planning.OffsetRange(tp[0], tp[1], topic_id, lo, hi))
        pieces = planning.split(ranges, self.options.min_partitions,
                            self.options.max_records_per_partition)
        return [TxlogInputPartition((r,)) for r in pieces]

    def commit(self, end: dict) -> None:
        """Record ``end`` in the reader's ``groupId``, whatever the sink, so ``txlog groups
        describe`` shows the query's lag.

        Spark calls this once a micro-batch is in its commit log (when it
        plans the next one), so the group never runs ahead of what the sink
        holds.  A plain offset commit: the positions are Spark's to replay
        from, the group only shows them, so a failure to record them is
        logged and the query goes on (the next micro-batch records them again).
        """
        group = self.options.group_id
        if group is None:
            return
        try:
            commit_offsets(self._root().storage, group, from_json(end))
        except Exception:  # progress for display only: never fail the query for it
            logger.warning("recording the query's offsets in group %s failed", group,
                           exc_info=True)

    # --- executors ----------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TxlogInputPartition)
        return read_ranges(self.options, self.arrow_schema, partition.ranges)

