"""``txlog verify``: check a log's invariants without changing anything.

Each partition is replayed from its log start with a fresh producer state,
as a Kafka leader rebuilding its state would, and every rule a writer was
held to is checked again on what is stored: both checksums and the records
of every batch, offsets contiguous from the log start, no batch a duplicate
of an earlier one of its producer or out of sequence (what idempotence
promises), and every COMMIT marker backed by a decision that commits that
transaction (no reader could otherwise agree on what is committed).

Segments are held to what readers trust them for without looking at their
batches (docs/format.md, section 4): the offset index finds batches, the
time index answers timestamp lookups, the aborted list serves
read_committed and the snapshot is the producer state at their end.  So
every segment, read once, is walked batch by batch and each of those
sections is compared with what the walk found.

Where retention removed the start of the log, the state at the log start is
unknown: the first segment's batches are checked on their own and its
snapshot is taken as the state at its end, as every process does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..format.batch import ABORT, COMMIT
from .dump import BatchDump, SegmentDump, StrayDump, dump_partition
from ..errors import TxlogError
from ..partition.producer_state import PRODUCER_ID_EXPIRATION, ProducerState
from ..partition.state_manager import SNAPSHOT_FORMATS_READ
from ..root.root import Root

SHOWN_MISMATCHES = 3  # index entries named per segment; the rest are counted


@dataclass
class PartitionReport:
    topic: str
    partition: int
    batches: int = 0
    records: int = 0
    segments: int = 0
    strays: int = 0  # batch objects below the compacted end: not part of the log
    problems: list[str] = field(default_factory=list)


class _Replay:
    """The producer state replayed so far and the checks each batch is held to."""

    def __init__(self, root: Root, report: PartitionReport) -> None:
        self.root = root
        self.report = report
        self.state: ProducerState | None = None  # None before the first object
        self.known = True  # False while the state before the log start is unknown

    def start_at(self, offset: int) -> None:
        """Begin the replay at the log start: the first segment's base, else offset 0 (a
        partition without segments never lost its start, so its first batch must be 0)."""
        if self.state is None:
            self.state = ProducerState(offset, self.root.describe_topic(
                self.report.topic).setting(PRODUCER_ID_EXPIRATION))
            self.known = offset == 0

    def batch(self, d: BatchDump) -> bool:
        """Check and apply one batch; False when the offsets after it cannot be placed."""
        report, h = self.report, d.header
        report.batches += 1
        if d.problem is not None:
            report.problems.append(f"{d.where}: {d.problem}")
        if h is None:
            return False
        self.start_at(0)
        state = self.state
        assert state is not None
        if h.base_offset != state.end_offset:
            report.problems.append(
                f"{d.where}: starts at offset {h.base_offset}, but the batch before ends at "
                f"{state.end_offset} (offsets must be contiguous)")
            return False
        if d.control is not None:
            if d.control.type == COMMIT:
                decision = self.root.coordinator.decision(h.decision_id)
                if decision is None or not decision.commits(h.producer_id, h.producer_epoch - 1):
                    report.problems.append(
                        f"{d.where}: COMMIT marker of producer {h.producer_id} but decision "
                        f"{h.decision_id!r} does not commit it "
                        f"({'missing' if decision is None else 'it says otherwise'})")
        else:
            report.records += h.record_count
            duplicate = None
            if self.known:
                try:
                    duplicate = state.check_append(h)
                except TxlogError as exc:
                    report.problems.append(f"{d.where}: {exc}")
            if duplicate is not None:
                report.problems.append(
                    f"{d.where}: duplicates producer {h.producer_id}'s batch at offset "
                    f"{duplicate.base_offset} (sequences {h.base_sequence} to "
                    f"{h.last_sequence})")
        state.apply(h, d.control)
        return True

    def segment(self, s: SegmentDump) -> bool:
        """Check a segment, its batches and its sections; False when nothing after it
        can be placed."""
        report = self.report
        report.segments += 1
        report.problems.extend(f"{s.path}: {p}" for p in s.problems)
        head = s.head
        if head is None:
            return False
        if head.topic_id != self.root.describe_topic(report.topic).topic_id:
            report.problems.append(f"{s.path}: belongs to topic id {head.topic_id}, not this "
                                   "topic's")
        self.start_at(head.base_offset)
        assert self.state is not None
        if head.base_offset != self.state.end_offset:
            report.problems.append(
                f"{s.path}: starts at offset {head.base_offset}, but the object before ends "
                f"at {self.state.end_offset} (segments must be contiguous)")
            return False
        _check_offset_index(s, report.problems)
        _check_time_index(s, report.problems)
        aborted_before = len(self.state.aborted)
        known = self.known
        for d in s.batches:
            if not self.batch(d):
                return False
        self._check_aborted(s, aborted_before, known)
        return self._check_snapshot(s)

    def _check_aborted(self, s: SegmentDump, before: int, known: bool) -> None:
        """The aborted list must be the transactions whose ABORT marker lies in the segment."""
        if s.aborted is None:
            return
        assert self.state is not None
        stored = list(zip(s.aborted["producer_id"].tolist(), s.aborted["first"].tolist(),
                          s.aborted["last"].tolist()))
        if known:
            replayed = [(a.producer_id, a.first_offset, a.last_offset)
                        for a in self.state.aborted[before:]]
            if stored != replayed:
                self.report.problems.append(
                    f"{s.path}: aborted list {stored} differs from the ABORT markers in the "
                    f"segment {replayed} (producer id, first offset, marker offset)")
            return
        # The state before the log start is unknown: each entry must at least end at
        # an ABORT marker of its producer inside the segment.
        markers = {(d.header.producer_id, d.header.base_offset) for d in s.batches
                   if d.header is not None and d.control is not None and d.control.type == ABORT}
        bad = [a for a in stored if (a[0], a[2]) not in markers or a[1] > a[2]]
        if bad:
            self.report.problems.append(
                f"{s.path}: aborted list entries {bad} end at no ABORT marker of their "
                "producer in the segment")

    def _check_snapshot(self, s: SegmentDump) -> bool:
        """The snapshot must be the producer state at the segment's end; with the state
        before the log start unknown, it becomes the replay's state."""
        fields, head, state = s.snapshot, s.head, self.state
        assert head is not None and state is not None
        if fields is None:
            return True  # its checksum or decoding already failed: reported
        problems = self.report.problems
        if fields.get("v") not in SNAPSHOT_FORMATS_READ or \
                fields.get("topic_id") != head.topic_id:
            problems.append(f"{s.path}: snapshot is not a version "
                            f"{' or '.join(map(str, SNAPSHOT_FORMATS_READ))} snapshot of this "
                            "topic")
            return True
        if fields.get("end") != head.end_offset or state.end_offset != head.end_offset:
            problems.append(f"{s.path}: snapshot ends at {fields.get('end')}, the segment's "
                            f"header at {head.end_offset}, its batches at {state.end_offset}")
            return True
        last = s.batches[-1] if s.batches else None
        anchor = fields.get("last")
        if last is not None and last.header is not None and anchor != [
                last.header.base_offset, last.anchor]:
            problems.append(f"{s.path}: snapshot does not name the segment's last batch "
                            f"(offset {last.header.base_offset}) as the one it ends with")
        try:
            snapshot = ProducerState.from_dict(fields, entries=lambda: s.entries)
            snapshot.producers.load()
        except ValueError as exc:
            problems.append(f"{s.path}: snapshot is not a producer state: {exc}")
            return True
        if not self.known:
            self.state, self.known = snapshot, True
        elif snapshot.to_dict()["producers"] != state.to_dict()["producers"]:
            problems.append(f"{s.path}: snapshot's producers differ from the state replayed "
                            "up to the segment's end")
        return True


def _check_offset_index(s: SegmentDump, problems: list[str]) -> None:
    """Each entry must name a walked batch: its base, its position, its exact size."""
    head, index = s.head, s.offset_index
    if index is None or head is None:
        return
    walked = [d for d in s.batches if d.header is not None]
    headers = [d.header for d in s.batches if d.header is not None]
    if len(walked) != len(s.batches) or len(index) != len(walked) or \
            head.batch_count != len(walked):
        problems.append(f"{s.path}: header and offset index say {head.batch_count} and "
                        f"{len(index)} batches, the segment holds {len(s.batches)}")
        return
    bases = np.fromiter((h.base_offset for h in headers), np.int64, len(walked))
    positions = np.fromiter((d.position for d in walked), np.int64, len(walked))
    sizes = np.fromiter((d.size for d in walked), np.int64, len(walked))
    wrong = np.flatnonzero((index["base"] != bases) | (index["position"] != positions)
                           | (index["size"] != sizes))
    for i in wrong[:SHOWN_MISMATCHES].tolist():
        problems.append(
            f"{s.path} offset {bases[i]} (position {positions[i]}): offset-index entry {i} "
            f"says base {index['base'][i]}, position {index['position'][i]}, size "
            f"{index['size'][i]}; the batch there is {sizes[i]} bytes")
    if len(wrong) > SHOWN_MISMATCHES:
        problems.append(f"{s.path}: {len(wrong) - SHOWN_MISMATCHES} more offset-index "
                        "entries disagree with their batches")


def _check_time_index(s: SegmentDump, problems: list[str]) -> None:
    """The time index must be the running maximum of the data batches' max timestamps."""
    head, index = s.head, s.time_index
    if index is None or head is None or any(d.header is None for d in s.batches):
        return
    data = [h for d in s.batches if (h := d.header) is not None and not h.is_control]
    if len(index) != len(data):
        problems.append(f"{s.path}: time index has {len(index)} entries, the segment holds "
                        f"{len(data)} data batches")
        return
    bases = np.fromiter((h.base_offset for h in data), np.int64, len(data))
    running = np.maximum.accumulate(
        np.fromiter((h.max_timestamp for h in data), np.int64, len(data))) \
        if data else np.zeros(0, np.int64)
    wrong = np.flatnonzero((index["base"] != bases) | (index["max_timestamp"] != running))
    if len(wrong):
        i = int(wrong[0])
        problems.append(
            f"{s.path} offset {bases[i]}: time-index entry {i} says base {index['base'][i]}, "
            f"max timestamp {index['max_timestamp'][i]}; the running maximum there is "
            f"{running[i]}" + (f" ({len(wrong) - 1} more entries disagree)"
                               if len(wrong) > 1 else ""))


def verify_partition(root: Root, topic: str, partition: int) -> PartitionReport:
    report = PartitionReport(topic, partition)
    replay = _Replay(root, report)
    placed = True
    for item in dump_partition(root, topic, partition, with_records=True):
        if isinstance(item, StrayDump):
            report.strays += 1
        elif not placed:
            continue  # offsets past an unreadable or misplaced object cannot be placed
        elif isinstance(item, SegmentDump):
            placed = replay.segment(item)
        else:
            placed = replay.batch(item)
    return report


def verify(root: Root, topics: list[str] | None = None,
           progress: Callable[[int, int], None] | None = None) -> list[PartitionReport]:
    """Reports for every partition of ``topics`` (default: every topic); ``progress`` is
    told (partitions done, partitions in all) as it goes."""
    partitions = [(topic, p) for topic in topics or root.topics()
                  for p in range(root.describe_topic(topic, refresh=True).partitions)]
    reports = []
    for tp in partitions:
        reports.append(verify_partition(root, *tp))
        if progress is not None:
            progress(len(reports), len(partitions))
    return reports
