"""Kafka's record columns, as Spark's Kafka source shows them: a projection, not the core's form.

Spark's Kafka source hands every row its topic, partition, offset, a
microsecond timestamp and the timestamp type; ``Log.read`` answers in the
same columns.  The core reads records and the offsets and millisecond
timestamps of each batch (partition/reader.py) and never builds these
columns itself.  The constant columns are built here, once per read, from
Arrow kernels rather than per record, so the projection costs little next
to decoding.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ..format.arrays import counting, repeat
from ..format.batch import HEADER_TYPE
from ..partition.reader import Piece

SPARK_TIMESTAMP = pa.timestamp("us", tz="UTC")


def spark_schema(include_headers: bool) -> pa.Schema:
    """The columns of Spark's Kafka source, as Arrow types Spark accepts for them."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", SPARK_TIMESTAMP),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", HEADER_TYPE))
    return pa.schema(fields)


def empty_table(include_headers: bool) -> pa.Table:
    return spark_schema(include_headers).empty_table()


def _constant_strings(value: str, n: int) -> pa.Array | pa.ChunkedArray:
    raw = value.encode("utf-8")
    per_chunk = max((2**31 - 1) // max(len(raw), 1), 1)  # string offsets are int32
    if n > per_chunk:
        sizes = [per_chunk] * (n // per_chunk) + ([n % per_chunk] if n % per_chunk else [])
        return pa.chunked_array([_constant_strings(value, k) for k in sizes], pa.string())
    offsets = pc.multiply(counting(pa.int32(), n + 1), pa.scalar(len(raw), pa.int32()))
    return pa.StringArray.from_buffers(n, offsets.buffers()[1], pa.py_buffer(raw * n))


def to_spark_table(pieces: list[Piece], topic: str, partition: int,
                   include_headers: bool) -> pa.Table:
    """Spark's Kafka columns around the pieces read from batches (none: an empty table)."""
    if not pieces:
        return empty_table(include_headers)
    records = pa.concat_tables([p.records for p in pieces])
    n = records.num_rows
    kinds = {p.timestamp_type for p in pieces}
    if len(kinds) == 1:
        ts_types: pa.Array | pa.ChunkedArray = repeat(pa.int32(), kinds.pop(), n)
    else:
        ts_types = pa.chunked_array([repeat(pa.int32(), p.timestamp_type, p.records.num_rows)
                                     for p in pieces])
    millis = pa.chunked_array([p.timestamps for p in pieces], pa.int64())
    columns = [
        records.column("key"),
        records.column("value"),
        _constant_strings(topic, n),
        repeat(pa.int32(), partition, n),
        pa.chunked_array([p.offsets for p in pieces], pa.int64()),
        pc.multiply(millis, pa.scalar(1000, pa.int64())).cast(SPARK_TIMESTAMP),
        ts_types,
    ]
    if include_headers:
        columns.append(records.column("headers"))
    return pa.Table.from_arrays(columns, schema=spark_schema(include_headers))
