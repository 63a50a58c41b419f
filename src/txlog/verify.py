"""``txlog verify``: check a log's invariants without changing anything.

Each partition is replayed from its first batch with a fresh producer state,
as a Kafka leader rebuilding its state would, and every rule a writer was
held to is checked again on what is stored: both checksums and the records
of every batch, offsets contiguous from 0, no batch a duplicate of an earlier
one of its producer or out of sequence (what idempotence promises), and
every COMMIT marker backed by a decision that commits that transaction (no
reader could otherwise agree on what is committed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .batch import COMMIT
from .dump import dump_partition
from .errors import TxlogError
from .log import Log
from .producer_state import ProducerState


@dataclass
class PartitionReport:
    topic: str
    partition: int
    batches: int = 0
    records: int = 0
    problems: list[str] = field(default_factory=list)


def verify_partition(log: Log, topic: str, partition: int) -> PartitionReport:
    report = PartitionReport(topic, partition)
    state = ProducerState()
    for d in dump_partition(log, topic, partition, with_records=True):
        report.batches += 1
        h = d.header
        if d.problem is not None or h is None:
            report.problems.append(f"{d.path}: {d.problem}")
            return report  # offsets past an unreadable batch cannot be placed
        if h.base_offset != state.end_offset:
            report.problems.append(
                f"{d.path}: starts at offset {h.base_offset}, but the batch before ends at "
                f"{state.end_offset} (offsets must be contiguous)")
            return report
        if d.control is not None:
            if d.control.type == COMMIT:
                decision = log.coordinator.decision(h.decision_id)
                if decision is None or not decision.commits(h.producer_id, h.producer_epoch - 1):
                    report.problems.append(
                        f"{d.path}: COMMIT marker of producer {h.producer_id} but decision "
                        f"{h.decision_id!r} does not commit it "
                        f"({'missing' if decision is None else 'it says otherwise'})")
        else:
            report.records += h.record_count
            try:
                duplicate = state.check_append(h)
            except TxlogError as exc:
                report.problems.append(f"{d.path}: {exc}")
                duplicate = None
            if duplicate is not None:
                report.problems.append(
                    f"{d.path}: duplicates producer {h.producer_id}'s batch at offset "
                    f"{duplicate.base_offset} (sequences {h.base_sequence} to "
                    f"{h.last_sequence})")
        state.apply(h, d.control)
    return report


def verify(log: Log, topics: list[str] | None = None,
           progress: Callable[[int, int], None] | None = None) -> list[PartitionReport]:
    """Reports for every partition of ``topics`` (default: every topic); ``progress`` is
    told (partitions done, partitions in all) as it goes."""
    partitions = [(topic, p) for topic in topics or log.topics()
                  for p in range(log.describe_topic(topic, refresh=True).partitions)]
    reports = []
    for tp in partitions:
        reports.append(verify_partition(log, *tp))
        if progress is not None:
            progress(len(reports), len(partitions))
    return reports
