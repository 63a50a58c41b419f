"""Maintenance that runs itself: compaction, retention and gc on jittered intervals.

An operator should not have to schedule three commands per topic from cron,
nor worry about two schedules overlapping.  ``Maintainer`` runs the three
steps, each on its own interval, and any number of maintainers may run at
once on one root without a lock: every step already changes storage only by
publish-if-absent and whole-object deletes, and two runs of a step agree on
what to do or one of them finds nothing left (docs/protocol.md, section 7.2,
argues each step).  The intervals are jittered so that maintainers started
together (a fleet's cron, a restarted deployment) drift apart instead of
racing for the same work on every pass.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from .. import clock
from ..errors import TxlogError
from ..partition.compaction import DEFAULT_BUFFER_BYTES
from ..root.root import Root
from ..root.topics import TABLE_SYNC
from . import upkeep
from .gc import (DEFAULT_CHAIN_AGE_S, DEFAULT_DATA_AGE_S, DEFAULT_DECISION_AGE_S,
                 DEFAULT_TEMP_AGE_S, DEFAULT_TXN_ID_EXPIRATION_MS, collect)

DEFAULT_COMPACT_INTERVAL_S = 60.0
DEFAULT_RETENTION_INTERVAL_S = 300.0  # Kafka's log.retention.check.interval.ms
DEFAULT_GC_INTERVAL_S = 3600.0
DEFAULT_JITTER = 0.2  # each interval is drawn from [1 - jitter, 1 + jitter] times itself
STEPS = ("compact", "retention", "gc")  # in this order within a pass


@dataclass(frozen=True)
class MaintenanceSettings:
    """What a maintainer does and how often (seconds; jitter as a fraction)."""

    topics: tuple[str, ...] | None = None  # None: every topic, listed again on each pass
    compact_interval_s: float = DEFAULT_COMPACT_INTERVAL_S
    retention_interval_s: float = DEFAULT_RETENTION_INTERVAL_S
    gc_interval_s: float = DEFAULT_GC_INTERVAL_S
    jitter: float = DEFAULT_JITTER
    lag: int = 0  # offsets per partition compaction leaves as batch objects
    min_batches: int = 2
    compaction_buffer_bytes: int = DEFAULT_BUFFER_BYTES  # memory of one compaction
    chain_age_s: float = DEFAULT_CHAIN_AGE_S
    decision_age_s: float = DEFAULT_DECISION_AGE_S
    temp_age_s: float = DEFAULT_TEMP_AGE_S
    data_age_s: float = DEFAULT_DATA_AGE_S
    txn_id_expiration_ms: int = DEFAULT_TXN_ID_EXPIRATION_MS

    def interval(self, step: str) -> float:
        return {"compact": self.compact_interval_s, "retention": self.retention_interval_s,
                "gc": self.gc_interval_s}[step]


@dataclass
class PassReport:
    """One pass: which steps ran, what they did, and the partitions' objects after it."""

    number: int
    started_ms: int
    steps: list[str]
    duration_ms: int = 0
    segments_made: int = 0
    batches_merged: int = 0
    bytes_compacted: int = 0
    segments_merged: int = 0  # merged segments made (each replaced a run of small ones)
    segments_deleted: int = 0
    bytes_deleted: int = 0
    records_synced: int = 0  # appended to topics' tables (TABLE_SYNC) before retention
    offsets_lost: int = 0  # removed before any sync read them (docs/tables.md)
    table_files_compacted: int = 0  # small data files of tables rewritten into larger ones
    table_files_expired: int = 0  # tables' files no retained snapshot names, deleted
    gc_removed: int = 0
    objects: dict[str, int] = field(default_factory=dict)  # "topic-p": segments + batch objects
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class Maintainer:
    """Runs compaction, retention and gc on ``root`` on their intervals, jittered.

    ``progress(step, done, total)`` is told how far a step has got through
    its partitions (for a terminal).  A step that fails on one partition is
    reported in the pass's ``errors`` and the others go on: a maintainer is
    long-lived, and one damaged partition must not stop the rest.
    """

    def __init__(self, root: Root, settings: MaintenanceSettings,
                 rng: random.Random | None = None,
                 progress: Callable[[str, int, int], None] | None = None) -> None:
        if not 0 <= settings.jitter < 1:
            raise ValueError(f"jitter must be at least 0 and below 1, not {settings.jitter}")
        self.root = root
        self.settings = settings
        self._rng = rng or random.Random()
        self._progress = progress or (lambda step, done, total: None)
        self._next_due = {step: 0.0 for step in STEPS}  # the first pass runs every step
        self.passes = 0

    def _jittered(self, interval: float) -> float:
        j = self.settings.jitter
        return interval * self._rng.uniform(1 - j, 1 + j)

    def due(self, now: float) -> list[str]:
        return [s for s in STEPS if self._next_due[s] <= now]

    def seconds_to_next(self, now: float) -> float:
        return max(0.0, min(self._next_due.values()) - now)

    def run_pass(self, steps: list[str] | None = None) -> PassReport:
        """Run ``steps`` (default: those due now) once, and schedule each step's next run."""
        now = time.monotonic()
        steps = self.due(now) if steps is None else steps
        self.passes += 1
        report = PassReport(self.passes, clock.now_ms(), list(steps))
        started = time.monotonic()
        partitions = self._partitions(report)
        for step in steps:
            getattr(self, f"_{step}")(partitions, report)
            self._next_due[step] = time.monotonic() + self._jittered(self.settings.interval(step))
        for topic, p in partitions:
            try:
                segments, _, batches, _ = self.root.partition(topic, p).stored()
                report.objects[f"{topic}-{p}"] = segments + batches
            except (TxlogError, OSError):
                continue  # deleted meanwhile: nothing to count
        report.duration_ms = int((time.monotonic() - started) * 1000)
        return report

    def run(self, passes: int | None, on_pass: Callable[[PassReport], None],
            sleep: Callable[[float], None] = time.sleep) -> None:
        """Run passes until ``passes`` have run (None: forever), sleeping between them."""
        while passes is None or self.passes < passes:
            wait = self.seconds_to_next(time.monotonic())
            if wait > 0:
                sleep(wait)
            on_pass(self.run_pass())

    def _partitions(self, report: PassReport) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        try:
            topics = list(self.settings.topics) if self.settings.topics else self.root.topics()
        except (TxlogError, OSError) as exc:
            report.errors.append(f"listing topics: {exc}")
            return []
        for topic in topics:
            try:
                count = self.root.describe_topic(topic, refresh=True).partitions
            except (TxlogError, OSError) as exc:
                report.errors.append(f"topic {topic}: {exc}")
                continue
            out.extend((topic, p) for p in range(count))
        return out

    def _each(self, step: str, partitions: list[tuple[str, int]], report: PassReport,
              work: Callable[[str, int], None]) -> None:
        for i, (topic, p) in enumerate(partitions):
            try:
                work(topic, p)
            except (TxlogError, OSError) as exc:
                report.errors.append(f"{step} {topic}-{p}: {exc}")
            self._progress(step, i + 1, len(partitions))

    def _compact(self, partitions: list[tuple[str, int]], report: PassReport) -> None:
        s = self.settings

        def work(topic: str, p: int) -> None:
            for made in upkeep.compact(self.root, topic, [p], s.min_batches, s.lag,
                                       s.compaction_buffer_bytes, merge=False)[p]:
                report.segments_made += 1
                report.batches_merged += made.batches
                report.bytes_compacted += made.bytes
            report.segments_merged += len(
                upkeep.merge_segments(self.root, topic, [p], s.compaction_buffer_bytes)[p])
        self._each("compact", partitions, report, work)

    def _retention(self, partitions: list[tuple[str, int]], report: PassReport) -> None:
        unsynced = self._sync_tables(partitions, report)
        partitions = [(t, p) for t, p in partitions if t not in unsynced]

        def work(topic: str, p: int) -> None:
            done = upkeep.apply_retention(self.root, topic, [p])[p]
            report.segments_deleted += done.segments_deleted
            report.bytes_deleted += done.bytes_deleted
        self._each("retention", partitions, report, work)

    def _sync_tables(self, partitions: list[tuple[str, int]], report: PassReport) -> set[str]:
        """Sync the table of every topic whose config asks for it, before retention may
        delete what it has not read; returns the topics whose sync failed, whose
        retention then waits for the next pass."""
        failed: set[str] = set()
        for topic in dict.fromkeys(t for t, _ in partitions):
            try:
                if self.root.describe_topic(topic).setting(TABLE_SYNC) != "true":
                    continue
                from ..tables.sync import sync_table  # pyiceberg: the tables extra
                result = sync_table(self.root, topic)
            except Exception as exc:  # noqa: BLE001 - pyiceberg's errors share no base class
                # but Exception; a long-lived maintainer reports them and goes on.
                report.errors.append(f"table sync {topic}: {type(exc).__name__}: {exc}")
                failed.add(topic)
                continue
            report.records_synced += result.records
            report.offsets_lost += sum(to - start for start, to in result.skipped.values())
            self._table_upkeep(topic, report)
        return failed

    def _table_upkeep(self, topic: str, report: PassReport) -> None:
        """Compact the synced table's small files and expire it, by its own properties
        (docs/tables.md, "Upkeep").  A failure here is reported but holds no retention:
        the records are in the table already."""
        try:
            from ..tables.expiry import expire_table
            from ..tables.upkeep import compact_table
            report.table_files_compacted += len(compact_table(self.root, topic).removed)
            report.table_files_expired += len(expire_table(self.root, topic).files)
        except Exception as exc:  # noqa: BLE001 - as in _sync_tables
            report.errors.append(f"table upkeep {topic}: {type(exc).__name__}: {exc}")

    def _gc(self, partitions: list[tuple[str, int]], report: PassReport) -> None:
        s = self.settings
        try:
            removed = collect(self.root, chain_age_s=s.chain_age_s,
                              decision_age_s=s.decision_age_s, temp_age_s=s.temp_age_s,
                              data_age_s=s.data_age_s, txn_id_expiration_ms=s.txn_id_expiration_ms)
            report.gc_removed = sum(len(paths) for paths in removed.removed.values())
        except (TxlogError, OSError) as exc:
            report.errors.append(f"gc: {exc}")
