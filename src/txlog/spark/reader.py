"""Batch reads: offset ranges fixed on the driver, read as Arrow record batches on executors."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark.sql.datasource import (DataSourceReader, EqualTo, Filter, GreaterThan,
                                    GreaterThanOrEqual, In, InputPartition, LessThan,
                                    LessThanOrEqual)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType,
                               StructField, StructType, TimestampType)

from ..clients.positions import end_expired_transactions, offset_for_timestamp
from . import planning
from ..errors import InvalidConfigError
from ..integers import is_int
from ..root.root import Root
from .options import ReadOptions


def spark_schema(include_headers: bool) -> StructType:
    """Spark's Kafka source columns, the fixed schema of every txlog read.

    Built from types rather than parsed from DDL: parsing needs a JVM, and
    the reader is created in a Python worker that has none.
    """
    fields = [StructField("key", BinaryType()), StructField("value", BinaryType()),
              StructField("topic", StringType()), StructField("partition", IntegerType()),
              StructField("offset", LongType()), StructField("timestamp", TimestampType()),
              StructField("timestampType", IntegerType())]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


def arrow_schema(options: ReadOptions, schema: StructType) -> pa.Schema:
    """The Arrow schema read batches must have; refuses a user-specified schema."""
    expected = spark_schema(options.include_headers)
    if schema != expected:
        raise InvalidConfigError(
            f"the txlog source has a fixed schema ({expected.simpleString()}); a "
            f"user-specified schema ({schema.simpleString()}) cannot be used")
    return to_arrow_schema(schema, timezone="UTC")


@dataclass(frozen=True)
class TxlogInputPartition(InputPartition):
    """One task's offset ranges, fixed on the driver so a re-run task reads the same records."""

    ranges: tuple[planning.OffsetRange, ...]

    def __init__(self, ranges: tuple[planning.OffsetRange, ...]) -> None:
        object.__setattr__(self, "ranges", ranges)
        object.__setattr__(self, "value", None)


@dataclass
class _Pruning:
    """What pushed filters allow to skip: topics, partitions, an offset and a time window."""

    topics: set[str] | None = None
    partitions: set[int] | None = None
    min_partition: int = 0
    max_partition: int | None = None
    min_offset: int = 0
    max_offset: int | None = None  # inclusive
    min_timestamp_ms: int | None = None

    def keeps(self, tp: planning.TopicPartition) -> bool:
        topic, partition = tp
        return (self.topics is None or topic in self.topics) and \
            (self.partitions is None or partition in self.partitions) and \
            partition >= self.min_partition and \
            (self.max_partition is None or partition <= self.max_partition)

    def clip(self, r: planning.OffsetRange) -> planning.OffsetRange:
        lo = max(r.start, self.min_offset)
        hi = r.end if self.max_offset is None else min(r.end, self.max_offset + 1)
        return replace(r, start=min(lo, r.end), end=max(min(hi, r.end), min(lo, r.end)))


def _millis(value: object) -> int | None:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return int(value.timestamp() * 1000)
    return None


class TxlogBatchReader(DataSourceReader):
    """Plans on the driver (``partitions``) and reads on executors (``read``)."""

    def __init__(self, options: ReadOptions, arrow_schema: pa.Schema) -> None:
        self.options = options
        self.arrow_schema = arrow_schema
        self.pruning = _Pruning()

    @classmethod
    def create(cls, options: ReadOptions, schema: StructType) -> TxlogBatchReader:
        return cls(options, arrow_schema(options, schema))

    # Spark refuses every read of a reader that overrides pushFilters while
    # spark.sql.python.filterPushdown.enabled is off (its default), telling one
    # from the other by whether ``reader.pushFilters.__func__`` is the base
    # class's function.  Reads must work with the setting off (unpruned) and
    # prune with it on, so the attribute Spark inspects presents the base
    # function while calling it runs ``_push_filters``.
    @property
    def pushFilters(self) -> _PushFilters:
        return _PushFilters(self)

    def _push_filters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Prune the plan by the filters; return those Spark must still evaluate."""
        return [f for f in filters if not self._prune(f)]

    def _prune(self, f: Filter) -> bool:
        """Narrow the plan by ``f``; True when the narrowing is exact (Spark may drop ``f``)."""
        # Not has a child filter, no attribute: it narrows nothing here, Spark evaluates it.
        attribute: tuple[str, ...] = getattr(f, "attribute", ())
        column = attribute[0] if len(attribute) == 1 else None
        p = self.pruning
        if column == "topic":
            if isinstance(f, EqualTo) and isinstance(f.value, str):
                p.topics = {f.value} if p.topics is None else p.topics & {f.value}
                return True
            if isinstance(f, In) and all(isinstance(v, str) for v in f.value):
                p.topics = set(f.value) if p.topics is None else p.topics & set(f.value)
                return True
            return False
        if column in ("partition", "offset"):
            lo, hi, values = _int_bounds(f)
            if lo is None and hi is None and values is None:
                return False
            if column == "partition":
                if values is not None:
                    p.partitions = values if p.partitions is None else p.partitions & values
                if lo is not None:
                    p.min_partition = max(p.min_partition, lo)
                if hi is not None:
                    p.max_partition = hi if p.max_partition is None else min(p.max_partition, hi)
                return True
            if values is not None:
                # An offset set prunes to its span; the set itself is left to Spark.
                lo, hi = (min(values), max(values)) if values else (0, -1)
            if lo is not None:
                p.min_offset = max(p.min_offset, lo)
            if hi is not None:
                p.max_offset = hi if p.max_offset is None else min(p.max_offset, hi)
            return values is None
        if column == "timestamp" and isinstance(f, (GreaterThan, GreaterThanOrEqual)):
            ms = _millis(f.value)
            if ms is not None:
                # Records before the first one at or after this time are all earlier:
                # start there.  Later records may still be earlier (CreateTime is not
                # monotonic), so Spark keeps evaluating the filter.
                p.min_timestamp_ms = ms if p.min_timestamp_ms is None else max(
                    p.min_timestamp_ms, ms)
        return False

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        root = Root(o.path, storage_options=o.storage_options, create=False)
        subscribed = o.subscription.partitions(root)
        assert o.ending is not None  # ReadOptions has one for every batch read
        for spec, what in ((o.starting, "starting"), (o.ending, "ending")):
            planning.check_named_partitions(spec, subscribed, what)
        ids = dict(o.topic_ids)
        unread = sorted(set(ids) - {t for t, _ in subscribed})
        if unread:
            raise InvalidConfigError(f"option topicIds names {', '.join(map(repr, unread))}, "
                                     "which this read does not read (not subscribed, or deleted since)")
        tps = [tp for tp in subscribed if self.pruning.keeps(tp)]
        if o.abort_expired_transactions and o.isolation_level == planning.READ_COMMITTED:
            end_expired_transactions(root, tps)
        ranges = planning.plan(root, tps, o.starting, o.ending, o.isolation_level,
                           o.fail_on_data_loss, exact=False, topic_ids=ids)
        ranges = [self._clip(root, r) for r in ranges]
        pieces = planning.split([r for r in ranges if r.size > 0], o.min_partitions,
                            o.max_records_per_partition)
        if not pieces:
            return [TxlogInputPartition(())]
        return [TxlogInputPartition((r,)) for r in pieces]

    def _clip(self, root: Root, r: planning.OffsetRange) -> planning.OffsetRange:
        r = self.pruning.clip(r)
        ms = self.pruning.min_timestamp_ms
        if ms is not None and r.size > 0:
            found = offset_for_timestamp(root, r.topic, r.partition, ms,
                                         self.options.isolation_level)
            start = r.end if found is None else max(r.start, min(found[0], r.end))
            r = replace(r, start=start)
        return r

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TxlogInputPartition)
        return read_ranges(self.options, self.arrow_schema, partition.ranges)


def read_ranges(options: ReadOptions, schema: pa.Schema, ranges: Sequence[planning.OffsetRange]
                ) -> Iterator[pa.RecordBatch]:
    """A task's planned ranges as record batches of exactly Spark's ``schema``."""
    if not ranges:
        return
    from .worker_logs import worker_log  # executors only: it imports the whole Log

    root = worker_log(options.path, options.storage_options, create=False).services
    for r in ranges:
        for batch in planning.read_range(root, r, options.isolation_level, options.include_headers):
            # Only the headers' list and struct field names and nullability differ
            # from the stored type; the cast touches no data buffers.
            yield batch if batch.schema.equals(schema) else batch.cast(schema)


class _PushFilters:
    """``reader.pushFilters`` as Spark sees it: see TxlogBatchReader.pushFilters."""

    __slots__ = ("_reader",)
    __func__ = staticmethod(DataSourceReader.pushFilters)  # the function itself, not bound

    def __init__(self, reader: TxlogBatchReader) -> None:
        self._reader = reader

    def __call__(self, filters: list[Filter]) -> Iterable[Filter]:
        return self._reader._push_filters(filters)


def _int_bounds(f: Filter) -> tuple[int | None, int | None, set[int] | None]:
    """(inclusive low, inclusive high, value set) that an integer filter implies."""
    v = getattr(f, "value", None)
    if isinstance(f, In):
        if all(isinstance(x, int) for x in f.value):
            return None, None, set(f.value)
        return None, None, None
    if not is_int(v):
        return None, None, None
    if isinstance(f, EqualTo):
        return v, v, None
    if isinstance(f, GreaterThan):
        return v + 1, None, None
    if isinstance(f, GreaterThanOrEqual):
        return v, None, None
    if isinstance(f, LessThan):
        return None, v - 1, None
    if isinstance(f, LessThanOrEqual):
        return None, v, None
    return None, None, None
