"""A table kept in shape: small files compacted, purges, snapshots expired with their files.

pyiceberg 0.12 has no ``rewrite_data_files``, so compaction and purge are
built here on one rewrite: read some data files of the newest snapshot as
Arrow, write what is to stay through ``layout.split``, and commit an
overwrite that deletes the old files and adds the new ones, pinned to the
metadata the files were chosen from, exactly as a sync's commit is
(catalog.py).  Every rewrite snapshot carries the txlog summary
(``txlog.offsets``, ``txlog.topic-id``) of its parent unchanged, so the next
sync reads from the same offsets.  A rewrite that loses its commit deletes
its files and plans again.  Manifests are merged by pyiceberg's merge-append
(``commit.manifest-merge.enabled``), which each sync's append runs.

Expiry removes snapshots superseded longer than the table's age bound ago,
then every file of the table that no retained snapshot names and that is
older than the bound, and the pointer versions whose successor is older
than it.  docs/tables.md ("Upkeep") argues why no reader, sync or rewrite
loses a file it needs.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, EqualTo, LessThan, Or
from pyiceberg.io.pyarrow import ArrowScan, parquet_file_to_data_file
from pyiceberg.manifest import DataFile
from pyiceberg.table import FileScanTask, Table, TableProperties
from pyiceberg.types import LongType

from ..errors import CommitFailedError, OffsetOutOfRangeError
from ..root.root import Root
from .catalog import RootCatalog, table_identifier
from .layout import (DEFAULT_MIN_FILES, MIN_FILES_KEY, deadline, int_property, split,
                     target_file_bytes)
from .sync import MAX_ATTEMPTS, OFFSETS_KEY, TOPIC_ID_KEY, _write, covered

# A file below this share of the target size is small: compaction's input (Iceberg's
# rewrite takes the same three quarters by default).
SMALL_SHARE = 0.75
# A run leaves out its oldest file while that file is more than this many times the size
# of the run's newer files: a partition's growing file is rewritten once the new files
# add up to half its size, not with every batch of them (``small_groups``).
TIER_RATIO = 2
REWRITE_KEY = "txlog.rewrite"  # "compact" or "purge": why a snapshot rewrote files
PURGED_KEY = "txlog.purged"  # JSON {partition: offset}: a purge's records below these went

# Called before a rewrite's commit ("commit"): tests interleave a sync there.
Pause = Callable[[str], None]


@dataclass(frozen=True)
class Rewritten:
    """What one compaction or purge did: its snapshot (None: nothing to do) and files."""

    topic: str
    snapshot_id: int | None
    removed: tuple[str, ...] = ()  # data files, paths under the root
    added: tuple[str, ...] = ()
    records: int = 0  # rows read from the removed files
    kept: int = 0  # rows written to the added ones
    conflicts: int = 0


# Chooses the groups of data files to rewrite (one group's new files hold its rows) and
# what of their rows stays.
Plan = Callable[[Table], list[list[FileScanTask]]]
Keep = Callable[[pa.Table], pa.Table]


def compact_table(root: Root, topic: str, min_files: int | None = None,
                  target_bytes: int | None = None, pause: Pause | None = None) -> Rewritten:
    """Rewrite each spec partition's small files into files of about the target size,
    once a partition has ``min_files`` of them (the table's ``txlog.compact.min-files``
    by default)."""
    def plan(table: Table) -> list[list[FileScanTask]]:
        return small_groups(table, min_files or int_property(table, MIN_FILES_KEY,
                                                              DEFAULT_MIN_FILES),
                            target_bytes or target_file_bytes(table))
    return _rewrite(root, topic, plan, lambda rows: rows, {REWRITE_KEY: "compact"}, pause,
                    target_bytes)


def small_groups(table: Table, min_files: int, target: int) -> list[list[FileScanTask]]:
    """Runs of small files of one spec partition, each run at most about ``target`` bytes
    and of at least two files, from partitions with at least ``min_files`` small files."""
    by_partition: dict[tuple[int, tuple[object, ...]], list[FileScanTask]] = defaultdict(list)
    for task in table.scan().plan_files():
        f = task.file
        if f.file_size_in_bytes < target * SMALL_SHARE:
            by_partition[(f.spec_id, tuple(f.partition._data))].append(task)
    offset_id = table.schema().find_field("offset").field_id

    def first_offset(task: FileScanTask) -> int:
        low = (task.file.lower_bounds or {}).get(offset_id)
        return -1 if low is None else int(from_bytes(LongType(), low))

    groups: list[list[FileScanTask]] = []
    for tasks in by_partition.values():
        if len(tasks) < max(2, min_files):
            continue
        # In offset order: each new file then holds one stretch of offsets, which a purge
        # (whose plan prunes files by their offset bounds) finds in few files.
        run: list[FileScanTask] = []
        for task in sorted(tasks, key=first_offset):
            size = task.file.file_size_in_bytes
            if run and sum(t.file.file_size_in_bytes for t in run) + size > target:
                groups.append(run)
                run = []
            run.append(task)
        groups.append(run)
    return [g for g in map(_tiered, groups) if len(g) >= 2]


def _tiered(run: list[FileScanTask]) -> list[FileScanTask]:
    """``run`` without its oldest files while each is more than ``TIER_RATIO`` times the
    newer files together.  Rewriting a partition's growing file with every batch of small
    files would write it again each pass: quadratic bytes in its size (5.8 GB left
    under tables/ for 10 MB named after 10,000 syncs, benchmarks/README.md).  Left out until the newer
    files are half its size, each byte is rewritten a logarithmic number of times, and
    a partition keeps a few files of falling sizes; the run stays one stretch of
    offsets."""
    sizes = [t.file.file_size_in_bytes for t in run]
    newer = sum(sizes)
    for i, size in enumerate(sizes):
        newer -= size
        if size <= TIER_RATIO * newer:
            return run[i:]
    return []


def purge_table(root: Root, topic: str, before: dict[int, int],
                pause: Pause | None = None) -> Rewritten:
    """Remove from the table every record of partition ``p`` below ``before[p]``, by
    rewriting the files that hold any (never a delete file).  Refused past the offsets
    the table covers: the next sync would append the records again."""
    table = RootCatalog(root.storage).load_table(table_identifier(topic))
    held = covered(table).offsets
    for p, offset in before.items():
        if offset > held.get(p, 0):
            raise OffsetOutOfRangeError(
                f"purge of {topic}-{p} below offset {offset}: the table holds that partition "
                f"only below {held.get(p, 0)}, and a later sync would append the rest again "
                f"(purge below at most {held.get(p, 0)}; delete-records removes records "
                "from the topic)")
    # (pyiceberg's predicates take the term and literal positionally; its pydantic base
    # hides that from mypy)
    wanted = [And(EqualTo("partition", p), LessThan("offset", o))  # type: ignore[call-arg, arg-type]
              for p, o in before.items()]
    if not wanted:
        return Rewritten(topic, None)
    matching: BooleanExpression = wanted[0] if len(wanted) == 1 else Or(*wanted)

    def plan(table: Table) -> list[list[FileScanTask]]:
        return [[t] for t in table.scan(row_filter=matching).plan_files()]

    def keep(rows: pa.Table) -> pa.Table:
        top = max(before) + 1
        cuts = pa.array([before.get(p, -1) for p in range(top)], pa.int64())
        partition = rows["partition"]
        cut = pc.if_else(pc.less(partition, top), pc.take(cuts, pc.min_element_wise(
            partition, top - 1)), -1)
        return rows.filter(pc.greater_equal(rows["offset"], cut))

    summary = {REWRITE_KEY: "purge",
               PURGED_KEY: json.dumps({str(p): o for p, o in sorted(before.items())})}
    return _rewrite(root, topic, plan, keep, summary, pause)


def _rewrite(root: Root, topic: str, plan: Plan, keep: Keep, extra: dict[str, str],
             pause: Pause | None, target_bytes: int | None = None) -> Rewritten:
    """Plan, read, write and commit pinned; plan again after a lost commit."""
    catalog = RootCatalog(root.storage)
    for conflicts in range(MAX_ATTEMPTS):
        table = catalog.load_table(table_identifier(topic))
        snapshot = table.current_snapshot()
        groups = plan(table) if snapshot is not None else []
        if not groups:
            return Rewritten(topic, None, conflicts=conflicts)
        until = deadline()
        added: list[str] = []
        read = kept = 0
        for group in groups:  # one group in memory at a time
            rows = _read(table, group)
            stay = keep(rows)
            read, kept = read + rows.num_rows, kept + stay.num_rows
            added += [_write(root, topic, piece) for piece in split(table, stay, target_bytes)]
        held = snapshot.summary or {}  # type: ignore[union-attr]
        summary = {k: str(held[k]) for k in (TOPIC_ID_KEY, OFFSETS_KEY) if k in held}
        summary.update(extra)
        if pause is not None:
            pause("commit")
        removed = [t.file for g in groups for t in g]
        try:
            committed = _commit(root, table, removed, added, summary, until)
        except (CommitFailedException, ValidationException):
            continue  # a sync or another rewrite moved the table: plan again
        new = committed.current_snapshot()
        return Rewritten(topic, None if new is None else new.snapshot_id,
                         tuple(catalog.relative(f.file_path) for f in removed), tuple(added),
                         read, kept, conflicts)
    raise CommitFailedError(f"the rewrite of topic {topic!r}'s table gave up after "
                            f"{MAX_ATTEMPTS} commits lost to other writers")


def _read(table: Table, tasks: list[FileScanTask]) -> pa.Table:
    """The files' rows in the table's current schema: pyiceberg's reader fills a field
    added since a file was written with nulls (the typed values' schema only grows)."""
    return ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table(tasks)


def _commit(root: Root, table: Table, removed: list[DataFile], added: list[str],
            summary: dict[str, str], until: float) -> Table:
    """One overwrite snapshot onto exactly ``table``'s metadata; the new files deleted
    when it does not land (ValidationException: pyiceberg's retry, where a table's
    properties turn it on, found the table changed; it did not commit either)."""
    catalog = RootCatalog(root.storage, pinned=table.metadata_location)
    catalog.deadline = until
    pinned = catalog.pinned_table(table)
    try:
        tx = pinned.transaction()
        if TableProperties.MANIFEST_MERGE_ENABLED not in table.metadata.properties:
            # a table created before merging was on: its syncs merge manifests from now
            tx.set_properties({TableProperties.MANIFEST_MERGE_ENABLED: "true"})
        with tx.update_snapshot(snapshot_properties=summary).overwrite() as overwrite:
            for f in removed:
                overwrite.delete_data_file(f)
            for path in added:
                overwrite.append_data_file(parquet_file_to_data_file(
                    table.io, tx.table_metadata, catalog.location(path)))
        return tx.commit_transaction()
    except (CommitFailedException, ValidationException):
        for path in added:
            root.storage.delete(path)
        raise
