"""A topic read through its table: Spark's Parquet scan of the newest snapshot, then the topic.

PySpark's Python data source cannot go below its own floor (about twice
``spark.read.parquet``'s time, benchmarks/README.md); Spark's JVM Parquet
reader can.  So ``read_table`` reads the records a topic's table holds with
``spark.read.parquet``, the table's schema passed in (Spark infers nothing, and
the timestamp stays a timestamp with a time zone: a ``timestamp_ntz`` column
would be shifted by the session's zone in the union), and only what was
committed since the snapshot through ``format("txlog")``.  Which files and
which offsets is txlog.tables.readers' answer, from one snapshot; this module
only builds the DataFrames (docs/tables.md, "What read_table promises").

pyiceberg (the tables extra) is imported when a function here is called, so
``import txlog.spark`` does not need it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa

from ..errors import InvalidConfigError
from ..partition.isolation import READ_COMMITTED
from ..root.root import Root
from .options import ReadOptions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from ..tables.readers import NewestSnapshot

# What read_table decides itself: the root and topic, and where the topic's part starts
# and ends.
_DECIDED = ("path", "subscribe", "subscribePattern", "assign", "startingOffsets", "startingTimestamp",
            "startingOffsetsByTimestamp", "endingOffsets", "endingTimestamp",
            "endingOffsetsByTimestamp", "topicIds")


def read_table(spark: SparkSession, root: str, topic: str, **options: str) -> DataFrame:
    """Every committed record of ``topic``: its table's newest snapshot, read by Spark's
    Parquet reader, and the records committed since, read by ``format("txlog")`` from the
    snapshot's offsets (a partition added since from 0) up to the latest.

    ``options`` are ``format("txlog")``'s read options, for its part of the read and for
    the columns (``includeHeaders``; the same columns, in the same order, as
    ``format("txlog")`` gives), the storage options (``txlog.storage.*``) and
    ``failOnDataLoss``; a typed table's two columns follow them.  The root, the topic and
    the positions are read_table's to set, and the read is read_committed (what a table
    holds).  No table yet: the whole topic, from offset 0.  A table built from another
    incarnation of the topic (deleted and re-created): InconsistentTopicIdError, here, or
    at an action on the DataFrame if the topic is re-created after this call.
    """
    snapshot = _newest_snapshot(root, topic, options)
    # Pinned to the incarnation the snapshot was checked against: the tail is planned at
    # each action, perhaps after the topic was deleted and re-created.
    tail = (spark.read.format("txlog").options(**options).option("path", root)
            .option("subscribe", topic)
            .option("startingOffsets", _offsets_json(snapshot))
            .option("topicIds", json.dumps({topic: snapshot.topic_id})).load())
    if snapshot.value_fields is not None:
        tail = _typed(tail, snapshot.value_fields)
    if not snapshot.files:
        return tail
    from pyspark.sql.pandas.types import from_arrow_schema

    assert snapshot.schema is not None  # a table has a schema
    files = spark.read.schema(from_arrow_schema(snapshot.schema)).parquet(*snapshot.files)
    return files.select(*tail.columns).unionByName(tail)


def _typed(records: DataFrame, fields: pa.StructType) -> DataFrame:
    """``records`` with a typed table's two columns, parsed as a sync parses them: the same
    Arrow function (txlog.tables.values) on each batch, so both parts agree value for value."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StringType, StructField, StructType

    from ..tables.values import VALUE_ERROR, VALUE_FIELDS, with_typed_values

    def parse(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield from with_typed_values(pa.Table.from_batches([batch]), fields).to_batches()

    # A new StructType: add() would change the DataFrame's own (cached) schema in place.
    schema = StructType([*records.schema.fields,
                         StructField(VALUE_FIELDS, from_arrow_type(fields)),
                         StructField(VALUE_ERROR, StringType())])
    return records.mapInArrow(parse, schema)


def table_starting_offsets(root: str, topic: str, **options: str) -> str:
    """The ``startingOffsets`` option (JSON) at which ``format("txlog")`` goes on where
    ``topic``'s table ends: the newest snapshot's offsets, and 0 for every partition the
    topic has now that the snapshot does not cover (all of them with no table yet).

    A batch read must name every partition it reads; a stream started with it reads
    partitions created later from their beginning.  ``options``: the storage options
    (``txlog.storage.*``), as ``format("txlog")`` takes them.
    """
    return _offsets_json(_newest_snapshot(root, topic, options))


def _newest_snapshot(root: str, topic: str, options: Mapping[str, str]) -> NewestSnapshot:
    """The table's newest snapshot, read through the root ``options`` open, once they are
    checked as ``format("txlog")`` would check them."""
    from ..tables.readers import newest_snapshot

    decided = sorted(k for k in options if k.lower() in {d.lower() for d in _DECIDED})
    if decided:
        raise InvalidConfigError(
            f"read_table reads topic {topic!r} of root {root!r} from its table's offsets to "
            f"the latest; it takes no {', '.join(map(repr, decided))} option (read "
            "format('txlog') itself for other topics or positions)")
    parsed = ReadOptions.parse({**options, "path": root, "subscribe": topic}, streaming=False)
    if parsed.isolation_level != READ_COMMITTED:
        raise InvalidConfigError(
            f"read_table reads read_committed, as the table holds only committed records; "
            f"got isolation level {parsed.isolation_level!r}")
    return newest_snapshot(Root(parsed.path, storage_options=parsed.storage_options,
                                create=False), topic)


def _offsets_json(snapshot: NewestSnapshot) -> str:
    """Spark's Kafka ``startingOffsets`` form: ``{"topic": {"<partition>": offset}}``."""
    return json.dumps({snapshot.topic: {str(p): o for p, o in
                                        sorted(snapshot.starting_offsets().items())}})
