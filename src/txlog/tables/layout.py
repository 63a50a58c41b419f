"""A table's layout: its partition spec, the size of its files, and its upkeep settings.

The spec is the Kafka partition (identity) and a time bucket of the record
timestamp (hour, day or none; the topic config ``txlog.table.time-bucket``,
day when unset), chosen once, when a sync creates the table.  A table
created before specs existed is unpartitioned and stays so.  Changing the
bucket of an existing table is refused rather than evolved: compaction,
purge and the readers would each have to handle files of two specs at once,
for a choice made once per topic (docs/tables.md, "Layout").

A sync, a compaction and a purge all write through ``split``: one Parquet
file per spec partition, several where that partition's records exceed
``write.target-file-size-bytes`` (Iceberg's property; measured in Arrow
bytes, so the Parquet files come out at or below it).
"""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table, TableProperties
from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform, Transform

from ..clients.columns import spark_schema
from ..errors import InvalidConfigError
from ..root.topics import TABLE_TIME_BUCKET, TopicDescription

DEFAULT_TIME_BUCKET = "day"
DEFAULT_TARGET_FILE_BYTES = 128 << 20
# Snapshots superseded longer ago, and files no retained snapshot names that are older,
# are removed by expiry (upkeep.py).  Iceberg's name for the snapshot bound; here it bounds
# the orphans too, so it must exceed COMMIT_WINDOW_S by a margin for clocks, as gc's
# data_age_s exceeds the claim window.
MAX_SNAPSHOT_AGE_KEY = "history.expire.max-snapshot-age-ms"
DEFAULT_MAX_SNAPSHOT_AGE_MS = 3600 * 1000
# Expiry keeps at most this many snapshots in the metadata, whatever their age: an append
# writes and copies the whole metadata (expiry.py).  Their files stay for the age bound.
MAX_SNAPSHOTS_KEY = "txlog.expire.max-snapshots"
DEFAULT_MAX_SNAPSHOTS = 20
# Compaction rewrites a spec partition once it has this many small files.
MIN_FILES_KEY = "txlog.compact.min-files"
DEFAULT_MIN_FILES = 5
# A writer (sync, compaction, purge) commits only within this long of starting to write
# its files: expiry deletes files no snapshot names only once they are older than the age
# bound, so a commit never names a file expiry took for an orphan.
COMMIT_WINDOW_S = 600.0
assert DEFAULT_MAX_SNAPSHOT_AGE_MS / 1000 > COMMIT_WINDOW_S

_MICROS = {"hour": 3600 * 10**6, "day": 86400 * 10**6}
_TRANSFORMS: dict[str, Transform] = {"hour": HourTransform(), "day": DayTransform()}
_FIELD_IDS = 1000  # Iceberg's first partition field id


def new_table(desc: TopicDescription, columns: pa.Schema | None = None
              ) -> tuple[Schema, PartitionSpec, dict[str, str]]:
    """The schema (``columns``, by default Kafka's), spec and upkeep properties of a table
    created now for ``desc``: the spec names the schema's field ids, so they are assigned
    here (as create_table would, in the same order)."""
    schema = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(
        columns or spark_schema(True)))
    bucket = desc.config.get(TABLE_TIME_BUCKET, DEFAULT_TIME_BUCKET)
    fields = [PartitionField(schema.find_field("partition").field_id, _FIELD_IDS,
                             IdentityTransform(), "partition")]
    if bucket in _TRANSFORMS:
        fields.append(PartitionField(schema.find_field("timestamp").field_id, _FIELD_IDS + 1,
                                     _TRANSFORMS[bucket], f"timestamp_{bucket}"))
    # The metadata log (previous metadata files, 100 by default) is written and copied with
    # the rest of the metadata at each append (expiry.py); nothing here reads it.
    properties = {TableProperties.WRITE_TARGET_FILE_SIZE_BYTES: str(DEFAULT_TARGET_FILE_BYTES),
                  TableProperties.MANIFEST_MERGE_ENABLED: "true",
                  TableProperties.METADATA_PREVIOUS_VERSIONS_MAX: "10"}
    return schema, PartitionSpec(*fields), properties


def time_bucket(table: Table) -> str:
    """The time bucket of the table's spec: hour, day, or none."""
    for f in table.spec().fields:
        for name, transform in _TRANSFORMS.items():
            if f.transform == transform:
                return name
    return "none"


def check_layout(table: Table, desc: TopicDescription) -> None:
    """Refuse a topic whose configured time bucket is not the one its table has."""
    wanted = desc.config.get(TABLE_TIME_BUCKET)
    if wanted is not None and wanted != time_bucket(table):
        raise InvalidConfigError(
            f"topic {desc.name!r} sets {TABLE_TIME_BUCKET}={wanted}, but its table was "
            f"created with {time_bucket(table)} (a table's partition spec is fixed when it "
            f"is created): set the config back, or move tables/{desc.name} away to start a "
            "new table")


def int_property(table: Table, key: str, default: int) -> int:
    value = table.metadata.properties.get(key)
    try:
        return default if value is None else int(value)
    except ValueError:
        raise InvalidConfigError(f"table property {key} must be an integer, not {value!r}"
                                 ) from None


def target_file_bytes(table: Table) -> int:
    return max(1, int_property(table, TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
                               DEFAULT_TARGET_FILE_BYTES))


def split(table: Table, records: pa.Table, target_bytes: int | None = None) -> list[pa.Table]:
    """``records`` cut into the pieces one file each holds: one spec partition per piece
    (ordered by partition, bucket and offset), none above the target size."""
    if records.num_rows == 0:
        return []
    target = target_bytes or target_file_bytes(table)
    keys: list[str] = []
    computed: list[str] = []
    for f in table.spec().fields:
        name = table.schema().find_column_name(f.source_id) or ""
        if f.transform == IdentityTransform():
            keys.append(name)
            continue
        micros = _MICROS[next(n for n, t in _TRANSFORMS.items() if t == f.transform)]
        ts = pc.cast(records[name], pa.int64())  # microseconds since the epoch, UTC
        bucket = pc.floor(pc.divide(pc.cast(ts, pa.float64()), float(micros)))
        records = records.append_column(f.name, pc.cast(bucket, pa.int64()))
        keys.append(f.name)
        computed.append(f.name)
    records = records.take(pc.sort_indices(records, [(k, "ascending") for k in
                                                     [*keys, "offset"]]))
    runs = _runs(records, keys)
    records = records.drop_columns(computed)
    pieces, start = [], 0
    for count in runs:  # a loop per spec partition
        group = records.slice(start, count)
        rows = max(1, int(target * count / max(1, group.nbytes)))
        pieces += [group.slice(i, rows) for i in range(0, count, rows)]
        start += count
    return pieces


def _runs(records: pa.Table, keys: list[str]) -> list[int]:
    """The lengths of the runs of equal ``keys`` in ``records`` (sorted by them)."""
    n = records.num_rows
    change = None
    for k in keys:
        column = records[k]
        differs = pc.not_equal(column.slice(1), column.slice(0, n - 1))
        change = differs if change is None else pc.or_(change, differs)
    bounds = [0, n] if change is None else \
        [0, *(i + 1 for i in pc.indices_nonzero(change).to_pylist()), n]
    return [end - begin for begin, end in zip(bounds, bounds[1:])]


def deadline() -> float:
    """The monotonic time by which a writer that starts writing files now must commit."""
    return time.monotonic() + COMMIT_WINDOW_S
