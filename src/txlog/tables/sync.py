"""A sync: append to a topic's table the records committed since its newest snapshot.

One attempt reads the table's newest snapshot and the offsets it covers, works
out consistent cuts (cuts.py), reads ``[offsets, cuts)`` of every partition
read_committed through the partition reader (no control records, never past
the LSO), writes the records as one Parquet data file with Kafka's record
columns (those ``format("txlog")`` reads; a json topic's typed values beside
them, values.py, its table's schema first following added fields,
evolution.py), and commits a snapshot whose
summary records the cuts, the topic id and any range lost before the sync.
The commit is pinned to the metadata the offsets came from (catalog.py): if
another sync committed first, this one deletes its file and starts again from
the new offsets.  docs/tables.md argues why that appends each committed
record exactly once.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError
from pyiceberg.table import Table, TableProperties

from ..clients.columns import to_spark_table
from ..errors import (CommitFailedError, InconsistentTopicIdError, OffsetOutOfRangeError,
                      StorageError)
from ..partition.isolation import READ_COMMITTED
from ..partition.partition_log import PartitionLog
from ..root.root import Root
from ..root.topics import TopicDescription
from ..root.value_schema import value_fields
from ..storage.paths import table_data_path
from .catalog import RootCatalog, table_identifier
from .cuts import PartitionSpans, committed_before, consistent_cuts, spans_of
from .evolution import follow_value_schema
from .layout import check_layout, deadline, new_table, split
from .values import ERRORS_KEY, error_count, typed_schema, with_typed_values

# Snapshot summary keys (docs/tables.md, "Layout"); Iceberg summaries hold strings.
TOPIC_ID_KEY = "txlog.topic-id"
OFFSETS_KEY = "txlog.offsets"  # JSON {partition: exclusive end offset}, every partition
SKIPPED_KEY = "txlog.skipped"  # JSON {partition: [from, to)} lost before this sync read them
# A table's own properties: which topic incarnation it holds, and pyiceberg's retry off
# (a conflicting commit must not be re-applied onto another sync's snapshot).
TABLE_PROPERTIES = {TableProperties.COMMIT_NUM_RETRIES: "0"}
# Attempts before a sync gives up: each lost one means another sync committed.
MAX_ATTEMPTS = 20

# Called at the named steps of an attempt ("state" after phase 1 read a partition's
# state, with its number; "resolved", "read", "commit"): tests interleave other
# writers and syncs there, deterministically.
Pause = Callable[[str, "int | None"], None]


@dataclass(frozen=True)
class SyncResult:
    """What one sync did: the snapshot it committed (None: nothing new) and its offsets."""

    topic: str
    topic_id: str
    snapshot_id: int | None
    metadata_location: str
    records: int
    previous: dict[int, int]
    offsets: dict[int, int]
    skipped: dict[int, tuple[int, int]] = field(default_factory=dict)
    conflicts: int = 0
    files: tuple[str, ...] = ()
    value_errors: int | None = None  # values that did not parse (None: untyped, or no commit)


@dataclass(frozen=True)
class Covered:
    """What a snapshot covers: the topic incarnation and each partition's end offset."""

    topic_id: str
    offsets: dict[int, int]


def covered(table: Table) -> Covered:
    """The offsets and topic id of the table's newest snapshot (none: nothing covered)."""
    snapshot = table.current_snapshot()
    topic_id = table.metadata.properties.get(TOPIC_ID_KEY, "")
    if snapshot is None or snapshot.summary is None:
        return Covered(topic_id, {})
    offsets = json.loads(snapshot.summary[OFFSETS_KEY] or "{}")
    return Covered(snapshot.summary[TOPIC_ID_KEY] or topic_id,
                   {int(p): int(o) for p, o in offsets.items()})


def open_table(root: Root, desc: TopicDescription, schema: pa.Schema | None = None) -> Table:
    """The table of the topic ``desc`` describes, created empty on first use (with
    ``schema``, by default Kafka's columns); refused if another incarnation's."""
    catalog = RootCatalog(root.storage)
    topic, topic_id = desc.name, desc.topic_id
    if not catalog.table_exists(table_identifier(topic)):
        columns, spec, layout = new_table(desc, schema)
        try:
            catalog.create_table(table_identifier(topic), columns, partition_spec=spec,
                                 properties={**layout, **TABLE_PROPERTIES,
                                             TOPIC_ID_KEY: topic_id})
        except TableAlreadyExistsError:
            pass  # another sync created it a moment ago: use theirs
    table = catalog.load_table(table_identifier(topic))
    check_topic_id(table, topic, topic_id)
    check_layout(table, desc)
    return table


def check_topic_id(table: Table, topic: str, topic_id: str) -> None:
    """Refuse a table built from another incarnation of ``topic`` than ``topic_id``'s: a
    sync never appends to it, and a reader never continues it with the new one's records."""
    held = covered(table).topic_id
    if held != topic_id:
        raise InconsistentTopicIdError(
            f"the table of topic {topic!r} holds topic id {held}, but the topic now has id "
            f"{topic_id}: it was deleted and re-created, and a table never mixes two "
            f"incarnations in one table (move tables/{topic} away to start a new one)")


def sync_table(root: Root, topic: str, pause: Pause | None = None) -> SyncResult:
    """Append what was committed since the table's newest snapshot (docs/tables.md)."""
    step = pause or (lambda name, partition: None)
    conflicts = 0
    for _ in range(MAX_ATTEMPTS):
        desc = root.describe_topic(topic, refresh=True)
        table = open_table(root, desc, typed_schema(value_fields(desc.config)))
        try:
            fields = follow_value_schema(table, desc,
                                         lambda: root.describe_topic(topic, refresh=True))
            result = _attempt(root, table, desc.topic_id, desc.partitions, step, fields)
        except CommitFailedException:
            conflicts += 1  # another sync committed first: again, from its offsets
            continue
        except (OffsetOutOfRangeError, FileNotFoundError):
            continue  # retention or delete-records moved the log start under the sync
        return replace(result, conflicts=conflicts)
    raise CommitFailedError(f"the sync of topic {topic!r} gave up after {MAX_ATTEMPTS} attempts "
                            f"({conflicts} lost to other syncs' commits, the others to log "
                            "starts moving under its reads)")


def _attempt(root: Root, table: Table, topic_id: str, partitions: int, step: Pause,
             fields: pa.StructType | None = None) -> SyncResult:
    """One try: cuts from the offsets ``table`` covers, the read, the pinned commit; values
    parsed into ``fields`` (values.py; None: not parsed)."""
    topic = table.name()[1]
    previous = covered(table).offsets
    parts = [root.partition(topic, p, topic_id) for p in range(partitions)]
    starts, skipped = _starts(parts, previous)
    cuts = _cuts(root, parts, starts, step)
    offsets = {**previous, **cuts}
    if all(o == previous.get(p, 0) for p, o in offsets.items()) and not skipped:
        return SyncResult(topic, topic_id, None, table.metadata_location, 0, previous, offsets)
    step("read", None)
    records = with_typed_values(pa.concat_tables([_read(part, starts[i], cuts[part.partition])
                                                  for i, part in enumerate(parts)]), fields)
    until = deadline()
    files = [_write(root, topic, piece) for piece in split(table, records)]
    summary = {TOPIC_ID_KEY: topic_id, OFFSETS_KEY: json.dumps({str(p): o for p, o in
                                                                  sorted(offsets.items())})}
    errors = None if fields is None else error_count(records)
    if errors is not None:
        summary[ERRORS_KEY] = str(errors)
    if skipped:
        summary[SKIPPED_KEY] = json.dumps({str(p): list(r) for p, r in sorted(skipped.items())})
    step("commit", None)
    committed = _commit(root, table, files, summary, until)
    snapshot = committed.current_snapshot()
    return SyncResult(topic, topic_id, None if snapshot is None else snapshot.snapshot_id,
                      committed.metadata_location, records.num_rows, previous, offsets,
                      skipped, files=tuple(files), value_errors=errors)


def _starts(parts: list[PartitionLog], previous: dict[int, int]
            ) -> tuple[list[int], dict[int, tuple[int, int]]]:
    """Where each partition's read begins: the offset the table covers, or the log start
    where retention or delete-records removed records before any sync read them."""
    starts, skipped = [], {}
    for part in parts:
        start = previous.get(part.partition, 0)
        log_start = part.log_start()
        if log_start > start:
            skipped[part.partition] = (start, log_start)
            start = log_start
        starts.append(start)
    return starts, skipped


def _cuts(root: Root, parts: list[PartitionLog], starts: list[int], step: Pause
          ) -> dict[int, int]:
    """The two phases of cuts.py: states, resolution, states again; then the fixed point."""
    first = []
    for part in parts:
        first.append(part.state(listing=True))
        step("state", part.partition)
    known = committed_before(parts, first, starts, root.coordinator.resolve)
    step("resolved", None)
    spans: list[PartitionSpans] = [spans_of(part, part.state(listing=True), start, known)
                                   for part, start in zip(parts, starts)]
    return consistent_cuts(spans)


def _read(part: PartitionLog, start: int, end: int) -> pa.Table:
    """Records ``[start, end)`` read_committed as Kafka's record columns."""
    pieces, upto = part.read(start, end, READ_COMMITTED)
    if upto != end:
        # The cut rule keeps every cut at or below the LSO (docs/tables.md): a read that
        # stops short means that argument failed, and nothing may be committed on it.
        raise StorageError(f"{part.topic}-{part.partition}: read_committed stopped at {upto}, "
                           f"below the cut {end}")
    return to_spark_table(pieces, part.topic, part.partition, include_headers=True)


def _write(root: Root, topic: str, records: pa.Table) -> str:
    """One Parquet data file, published under a fresh name; its path under the root."""
    sink = pa.BufferOutputStream()
    pq.write_table(records, sink)
    path = table_data_path(topic, uuid.uuid4().hex)
    if not root.storage.publish_if_absent(path, sink.getvalue().to_pybytes()):
        raise StorageError(f"data file {path} exists already")
    return path


def _commit(root: Root, table: Table, files: list[str], summary: dict[str, str],
            until: float | None = None) -> Table:
    """Commit ``files`` onto exactly ``table``'s metadata, by ``until`` (layout.deadline).
    When the commit did not land (CommitFailedException: pinned elsewhere, the pointer
    moved, or too late) the files are deleted, no snapshot naming them; after any other
    error they may be named, and stay."""
    catalog = RootCatalog(root.storage, pinned=table.metadata_location)
    catalog.deadline = until
    pinned = catalog.pinned_table(table)
    try:
        tx = pinned.transaction()
        if files:
            tx.add_files([catalog.location(f) for f in files], snapshot_properties=summary,
                         check_duplicate_files=False)
        else:  # offsets moved over aborted or lost records only: a snapshot without files
            tx.update_snapshot(snapshot_properties=summary).fast_append().commit()
        return tx.commit_transaction()
    except CommitFailedException:
        for f in files:
            root.storage.delete(f)
        raise


@dataclass(frozen=True)
class TableDescription:
    """Where other engines find a topic's table: its newest metadata file and data files."""

    topic: str
    metadata_location: str
    snapshot_id: int | None
    covered: Covered
    records: int
    files: tuple[str, ...]


def describe_table(root: Root, topic: str) -> TableDescription:
    """The newest snapshot of the topic's table (NoSuchTableError: none yet)."""
    table = RootCatalog(root.storage).load_table(table_identifier(topic))
    snapshot = table.current_snapshot()
    tasks = list(table.scan().plan_files()) if snapshot is not None else []
    return TableDescription(topic, table.metadata_location,
                            None if snapshot is None else snapshot.snapshot_id, covered(table),
                            sum(t.file.record_count for t in tasks),
                            tuple(t.file.file_path for t in tasks))
