"""What a reader of a topic's table needs of its newest snapshot: files, schema and offsets.

Engines that read the table directly (Spark's Parquet reader, DuckDB) need its
data files and columns; a reader that goes on into the topic past the table
(``txlog.spark.read_table``, a stream continuing where the table ends) needs
the offsets the snapshot covers, and every partition the topic has now,
those added since the snapshot starting at 0.  All of it is read here, from
one snapshot, so the files and the offsets always belong together: the
snapshot holds exactly ``[0, offsets[p])`` read_committed of each partition
(less what its syncs recorded as skipped), and the topic continues at
``offsets[p]``.  A typed table's records past the snapshot get its typed
columns from the same parse as the sync's (values.py), with the table's
fields.  The engines' own calls live in their layers (txlog.spark)
or in the reader's code (docs/tables.md, "How each engine reads the table").
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import Table

from ..root.root import Root
from ..root.topics import TopicDescription
from .catalog import RootCatalog, table_identifier
from .evolution import plain
from .sync import check_topic_id, covered
from .values import VALUE_FIELDS


@dataclass(frozen=True)
class NewestSnapshot:
    """A topic's table as a reader sees it: the newest snapshot, and the topic now.

    ``metadata_location`` None: the topic has no table yet (no files, nothing
    covered, no schema).  ``files`` are URLs as the table's metadata names
    them (the root's URL and the path under it).
    """

    topic: str
    topic_id: str
    partitions: int
    metadata_location: str | None
    snapshot_id: int | None
    files: tuple[str, ...]
    schema: pa.Schema | None
    offsets: dict[int, int]
    value_fields: pa.StructType | None = None  # a typed table's struct, as values.py parses

    def starting_offsets(self) -> dict[int, int]:
        """Where the topic goes on past the snapshot, for every partition it has now: the
        snapshot's end offset, or 0 for a partition the snapshot does not cover."""
        return {p: self.offsets.get(p, 0) for p in range(self.partitions)}


def newest_snapshot(root: Root, topic: str) -> NewestSnapshot:
    """The table's newest snapshot and the topic's partitions; InconsistentTopicIdError if
    the table holds another incarnation of the topic (it was deleted and re-created)."""
    desc, table = _checked_table(root, topic)
    if table is None:
        return NewestSnapshot(topic, desc.topic_id, desc.partitions, None, None, (), None, {})
    snapshot = table.current_snapshot()
    files = () if snapshot is None else \
        tuple(task.file.file_path for task in table.scan().plan_files())
    schema = schema_to_pyarrow(table.schema(), include_field_ids=False)
    fields = plain(schema.field(VALUE_FIELDS).type) if VALUE_FIELDS in schema.names else None
    return NewestSnapshot(topic, desc.topic_id, desc.partitions, table.metadata_location,
                          None if snapshot is None else snapshot.snapshot_id, files, schema,
                          covered(table).offsets, fields)


def covered_offsets(root: Root, topic: str) -> dict[int, int]:
    """The offsets the newest snapshot of the topic's table covers ({} with no table yet),
    without planning its files; InconsistentTopicIdError for another incarnation's."""
    _, table = _checked_table(root, topic)
    return {} if table is None else covered(table).offsets


def _checked_table(root: Root, topic: str) -> tuple[TopicDescription, Table | None]:
    """The topic now, and its table (None: none yet), refused if another incarnation's."""
    desc = root.describe_topic(topic, refresh=True)
    try:
        table = RootCatalog(root.storage).load_table(table_identifier(topic))
    except NoSuchTableError:
        return desc, None
    check_topic_id(table, topic, desc.topic_id)
    return desc, table
