"""What waits to become a batch: records pending per partition, and tables made ready.

The producer publishes nothing behind its caller's back, so records wait
here until ``batch_size``, ``linger_ms``, ``flush()`` or a future's ``get()``
drains them; ``send_table``'s Arrow tables are checked and brought to the
batch schema here, with the per-row size estimate that cuts them into
batches as ``send`` would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidConfigError
from ..format.arrays import repeat
from ..format.batch import HEADER_TYPE, RECORD_SCHEMA

if TYPE_CHECKING:
    from ..partition.appender import AppendResult

RECORD_OVERHEAD = 24  # rough per-record Arrow overhead, for batch sizing only


class _Drains(Protocol):
    """The producer as its futures see it: ``get()`` publishes the record's batch."""

    def _drain(self, tp: tuple[str, int]) -> None: ...


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int
    timestamp: int


class FutureRecordMetadata:
    """Result of ``send``; ``get()`` publishes the record's batch if still pending."""

    def __init__(self, producer: _Drains, topic: str, partition: int) -> None:
        self._producer = producer
        self.topic = topic
        self.partition = partition
        self._value: RecordMetadata | None = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[RecordMetadata], Any]] = []
        self._errbacks: list[Callable[[BaseException], Any]] = []

    def is_done(self) -> bool:
        return self._value is not None or self._error is not None

    def succeeded(self) -> bool:
        return self._value is not None

    def failed(self) -> bool:
        return self._error is not None

    def exception(self) -> BaseException | None:
        return self._error

    def get(self, timeout: float | None = None) -> RecordMetadata:
        if not self.is_done():
            self._producer._drain((self.topic, self.partition))
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value

    def add_callback(self, fn: Callable[[RecordMetadata], Any]) -> FutureRecordMetadata:
        if self._value is not None:
            fn(self._value)
        else:
            self._callbacks.append(fn)
        return self

    def add_errback(self, fn: Callable[[BaseException], Any]) -> FutureRecordMetadata:
        if self._error is not None:
            fn(self._error)
        else:
            self._errbacks.append(fn)
        return self

    def _resolve(self, value: RecordMetadata) -> None:
        self._value = value
        for fn in self._callbacks:
            fn(value)

    def _fail(self, error: BaseException) -> None:
        self._error = error
        for fn in self._errbacks:
            fn(error)


@dataclass
class Pending:
    """One partition's records waiting to become a batch, and their futures."""

    tp: tuple[str, int]
    created: float
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    headers: list[list[dict[str, Any]]] = field(default_factory=list)
    futures: list[FutureRecordMetadata] = field(default_factory=list)
    size: int = 0

    def records(self) -> pa.Table:
        """The records as RECORD_SCHEMA, ready to encode."""
        return pa.Table.from_arrays([
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.array(self.timestamps, pa.int64()),
            pa.array(self.headers, HEADER_TYPE),
        ], schema=RECORD_SCHEMA)

    def resolve(self, result: AppendResult) -> None:
        """The batch is in the log: each future learns its offset (and the log's time,
        for a LogAppendTime topic)."""
        topic, partition = self.tp
        for i, f in enumerate(self.futures):
            timestamp = result.log_append_time if result.log_append_time >= 0 \
                else self.timestamps[i]
            f._resolve(RecordMetadata(topic, partition, result.base_offset + i, timestamp))

    def fail(self, error: BaseException) -> None:
        for f in self.futures:
            f._fail(error)


class RecordAccumulator:
    """The records of ``send`` waiting per partition (Kafka's RecordAccumulator): the
    producer drains a partition into a staged batch when it is full, lingered, flushed
    or waited on."""

    def __init__(self) -> None:
        self._pending: dict[tuple[str, int], Pending] = {}

    def append(self, tp: tuple[str, int], key: bytes | None, value: bytes | None,
               timestamp_ms: int, headers: list[dict[str, Any]],
               future: FutureRecordMetadata) -> int:
        """Add one record to ``tp``'s batch; returns the batch's size estimate."""
        pending = self._pending.get(tp)
        if pending is None:
            pending = self._pending[tp] = Pending(tp, time.monotonic())
        pending.keys.append(key)
        pending.values.append(value)
        pending.timestamps.append(timestamp_ms)
        pending.headers.append(headers)
        pending.futures.append(future)
        pending.size += RECORD_OVERHEAD + len(key or b"") + len(value or b"") + sum(
            len(h["key"]) + len(h["value"] or b"") for h in headers)
        return pending.size

    def pop(self, tp: tuple[str, int]) -> Pending | None:
        return self._pending.pop(tp, None)

    def partitions(self) -> list[tuple[str, int]]:
        return list(self._pending)

    def lingering(self, now: float, linger_ms: float) -> list[tuple[str, int]]:
        """The partitions whose batch began ``linger_ms`` or more before ``now``."""
        return [tp for tp, pending in self._pending.items()
                if (now - pending.created) * 1000 >= linger_ms]

    def created(self) -> list[float]:
        """When (``time.monotonic()``) each waiting batch began."""
        return [p.created for p in self._pending.values()]

    def fail_all(self, error: BaseException) -> None:
        """Drop every waiting record, failing its future with ``error`` (an abort)."""
        for pending in self._pending.values():
            pending.fail(error)
        self._pending.clear()


def as_bytes(value: Any, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes or None (or set {what}_serializer), "
                    f"got {type(value).__name__}")


def _binary_column(table: pa.Table, name: str) -> pa.ChunkedArray:
    column = table.column(name)
    kind = column.type
    if pa.types.is_binary(kind):
        return column
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or \
            pa.types.is_large_binary(kind) or pa.types.is_null(kind):
        return column.cast(pa.binary())
    raise InvalidConfigError(f"send_table: column {name!r} must be binary or string, not {kind}")


def normalise_table(table: pa.Table | pa.RecordBatch, now_ms: int
                    ) -> tuple[pa.Table, np.ndarray | None, np.ndarray, np.ndarray]:
    """The rows as RECORD_SCHEMA, the requested partitions (-1 for none), each row's
    size estimate (as ``send`` counts it, for cutting batches) and its key and value
    bytes (the producer's record-size metrics)."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    if not isinstance(table, pa.Table):
        raise InvalidConfigError(f"send_table needs a pyarrow Table, not {type(table).__name__}")
    names = set(table.column_names)
    unknown = names - {"key", "value", "headers", "timestamp", "partition"}
    if "value" not in names:
        raise InvalidConfigError(f"send_table: the table has no 'value' column "
                                 f"(columns: {table.column_names})")
    if unknown:
        raise InvalidConfigError(f"send_table: unknown column(s) {sorted(unknown)} (known: "
                                 "key, value, headers, timestamp, partition)")
    n = table.num_rows
    value = _binary_column(table, "value")
    key = _binary_column(table, "key") if "key" in names else pa.nulls(n, pa.binary())
    ts = _timestamps(table, now_ms) if "timestamp" in names else \
        pa.chunked_array([repeat(pa.int64(), now_ms, n)])
    headers = _headers(table) if "headers" in names else \
        pa.chunked_array([_empty_lists(n)], HEADER_TYPE)
    chosen = _chosen_partitions(table) if "partition" in names else None
    records = pa.Table.from_arrays([key, value, ts, headers], schema=RECORD_SCHEMA)
    key_value = _lengths(key) + _lengths(value)
    sizes = RECORD_OVERHEAD + key_value
    if "headers" in names and n:
        flat = pc.list_flatten(headers)
        header_bytes = _lengths(pc.struct_field(flat, [0])) + _lengths(pc.struct_field(flat, [1]))
        offsets = np.concatenate([[0], np.cumsum(
            pc.fill_null(pc.list_value_length(headers), 0).to_numpy())])
        summed = np.concatenate([[0], np.cumsum(header_bytes)])
        sizes = sizes + summed[offsets[1:]] - summed[offsets[:-1]]
    return records, chosen, sizes, key_value


def _timestamps(table: pa.Table, now_ms: int) -> pa.ChunkedArray:
    """The ``timestamp`` column as int64 milliseconds, null meaning now."""
    ts = table.column("timestamp")
    if pa.types.is_timestamp(ts.type):
        ts = ts.cast(pa.timestamp("ms", tz=ts.type.tz), safe=False).cast(pa.int64())
    elif pa.types.is_integer(ts.type):
        ts = ts.cast(pa.int64())
    else:
        raise InvalidConfigError(f"send_table: column 'timestamp' must be int64 ms or a "
                                 f"timestamp, not {ts.type}")
    ts = pc.fill_null(ts, now_ms)
    if table.num_rows and pc.min(ts).as_py() < 0:
        raise InvalidConfigError("send_table: timestamps must not be negative")
    return ts


def _headers(table: pa.Table) -> pa.ChunkedArray:
    """The ``headers`` column as HEADER_TYPE, null meaning none."""
    try:
        headers = table.column("headers").cast(HEADER_TYPE)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InvalidConfigError(
            f"send_table: column 'headers' must be {HEADER_TYPE}, not "
            f"{table.column('headers').type} ({exc})") from None
    return pc.fill_null(headers, pa.scalar([], HEADER_TYPE)) if headers.null_count else headers


def _chosen_partitions(table: pa.Table) -> np.ndarray:
    """The ``partition`` column as int64, -1 where the partitioner chooses."""
    column = table.column("partition")
    if not pa.types.is_integer(column.type):
        raise InvalidConfigError(f"send_table: column 'partition' must be int32 or int64, "
                                 f"not {column.type}")
    lowest = pc.min(column).as_py()
    if lowest is not None and lowest < 0:
        raise InvalidConfigError(f"send_table: partition {lowest} does not exist")
    return pc.fill_null(column.cast(pa.int64()), -1).to_numpy()


def runs(bounds: np.ndarray, n: int) -> list[tuple[int, int]]:
    """The ``[lo, hi)`` runs of ``range(n)`` that ``bounds`` (ascending cut points) cut
    it into, as Python ints (np.r_ cost more than the rest of a small send)."""
    cuts = [0, *bounds.tolist(), n]
    return list(zip(cuts[:-1], cuts[1:]))


def by_partition(parts: np.ndarray, num_partitions: int
                 ) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """The row order that groups rows per partition, keeping their input order within
    one, and each group as ``(partition, lo, hi)`` in that order."""
    # A stable sort; numpy's is a radix sort for 16-bit keys, over three times as fast
    # as for int32 ones.
    order = np.argsort(parts.astype(np.int16) if num_partitions <= 1 << 15 else parts,
                       kind="stable")
    sorted_parts = parts[order]
    bounds = np.flatnonzero(np.diff(sorted_parts)) + 1
    return order, [(int(sorted_parts[lo]), lo, hi) for lo, hi in runs(bounds, len(parts))]


def in_partition_order(records: pa.Table, order: np.ndarray, given: Collection[str]
                       ) -> pa.Table:
    """``records`` in ``order`` (``by_partition``'s), copying only the columns named in
    ``given`` (the caller's table): one that normalise_table filled in holds the same
    value in every row (no key, the time of the send, no headers), so any order of it is
    itself."""
    indices = pa.array(order)
    return pa.Table.from_arrays(
        [column.take(indices) if name in given else column
         for name, column in zip(records.column_names, records.columns, strict=True)],
        schema=records.schema)


def batch_runs(row_sizes: np.ndarray, times: np.ndarray, batch_size: int
               ) -> list[tuple[int, int, int, int]]:
    """One partition's rows cut into batches of ``batch_size`` bytes, as ``send`` would
    cut them: ``(lo, hi, first timestamp, last timestamp)`` of each."""
    starts = np.cumsum(row_sizes) - row_sizes
    cuts = np.flatnonzero(np.diff(starts // batch_size)) + 1
    # Every batch's lowest and highest timestamp at once (a min_max call per batch cost
    # more than the rest of its staging).
    heads = np.concatenate(([0], cuts))  # where each run starts
    lows = np.minimum.reduceat(times, heads).tolist()
    highs = np.maximum.reduceat(times, heads).tolist()
    return [(lo, hi, low, high) for (lo, hi), low, high
            in zip(runs(cuts, len(row_sizes)), lows, highs, strict=True)]


def _lengths(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return pc.fill_null(pc.binary_length(column), 0).to_numpy().astype(np.int64)


def _empty_lists(n: int) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)),
                                    pa.array([], HEADER_TYPE.value_type), type=HEADER_TYPE)
