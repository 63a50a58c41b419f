"""The figures an operator's monitoring scrapes (``txlog metrics``): per partition its
bounds and size, per group its committed offsets and lag, and the undecided
transactions counted and aged rather than listed, so that the number of series
does not grow with the number of transactional ids.

Computed with the operations the other commands use (the producer state, the
listing that sizes a partition, the groups' newest versions, the
coordinator's find-hanging), each read once per gathering: on an object store
a partition costs its state refresh (two small reads while nothing was
appended) and one listing, a group one listing and one read, and only the
partitions an undecided transaction holds back cost more (docs/cli.md,
"txlog metrics").
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import clock
from ..clients.positions import PartitionBounds, bounds_of
from ..errors import InconsistentTopicIdError, UnknownTopicError
from ..root.root import Root
from ..transactions.groups import every_group_offsets


@dataclass(frozen=True)
class PartitionFigures:
    bounds: PartitionBounds
    size_bytes: int  # segments and batch objects, as ``txlog topics describe`` sizes them


@dataclass(frozen=True)
class GroupFigures:
    group: str
    topic: str
    partition: int
    committed: int
    lag: int  # log end minus committed, as ``txlog groups describe`` and Kafka's tool


@dataclass(frozen=True)
class TransactionFigures:
    open: int  # undecided transactions holding some partition's LSO back
    hanging: int  # of those, the ones nobody will end (find-hanging's verdict)
    oldest_age_ms: int  # the oldest open one's age; 0 with none open


@dataclass(frozen=True)
class Figures:
    partitions: list[PartitionFigures]
    groups: list[GroupFigures]
    transactions: TransactionFigures


def gather(root: Root) -> Figures:
    """Every figure of the root now (see the module's docstring for what it reads)."""
    partitions = [f for topic in root.topics() for f in _topic_figures(root, topic)]
    found = {(f.bounds.topic, f.bounds.partition): f.bounds for f in partitions}
    held = [tp for tp, b in found.items() if b.stable < b.end]
    return Figures(partitions, _group_figures(root, found), _transaction_figures(root, held))


def _topic_figures(root: Root, topic: str) -> list[PartitionFigures]:
    """Its partitions' figures; none if it was deleted since the topics were listed (a
    long-running endpoint keeps serving: the next listing no longer names it)."""
    try:
        return [_partition_figures(root, topic, p)
                for p in range(root.describe_topic(topic, refresh=True).partitions)]
    except (UnknownTopicError, InconsistentTopicIdError):  # re-created: seen next time
        return []


def _partition_figures(root: Root, topic: str, partition: int) -> PartitionFigures:
    part = root.partition(topic, partition)
    state = part.state()
    _, segment_bytes, _, batch_bytes = part.stored(state)  # its listing also finds the log start
    return PartitionFigures(bounds_of(part, state, part.listed_log_start()),
                            segment_bytes + batch_bytes)


def _group_figures(root: Root, found: dict[tuple[str, int], PartitionBounds]
                   ) -> list[GroupFigures]:
    figures = []
    for group, offsets in every_group_offsets(root.storage).items():
        for (topic, partition), committed in sorted(offsets.items()):
            b = found.get((topic, partition))
            if b is None:
                continue  # not a partition (a stream sink's batch key), or deleted since
            figures.append(GroupFigures(group, topic, partition, committed,
                                        b.lag(committed)))
    return figures


def _transaction_figures(root: Root, held: list[tuple[str, int]]) -> TransactionFigures:
    """Counted per transaction, not per partition: one spanning three partitions is one."""
    now = clock.now_ms()
    undecided = root.coordinator.undecided_transactions(held, now)
    by_txn = {(t.producer_id, t.epoch): t for t in undecided}
    hanging = {(t.producer_id, t.epoch) for t in undecided if t.reason}
    starts = [t.start_ms for t in by_txn.values() if t.start_ms >= 0]
    return TransactionFigures(len(by_txn), len(hanging),
                              max(now - min(starts), 0) if starts else 0)
