"""What waits to become a batch: records pending per partition, and tables made ready.

The producer publishes nothing behind its caller's back, so records wait
here until ``batch_size``, ``linger_ms``, ``flush()`` or a future's ``get()``
drains them; ``send_table``'s Arrow tables are checked and brought to the
batch schema here, with the per-row size estimate that cuts them into
batches as ``send`` would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidConfigError
from ..format.arrays import repeat
from ..format.batch import HEADER_TYPE, RECORD_SCHEMA

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
    created: float
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    headers: list[list[dict[str, Any]]] = field(default_factory=list)
    futures: list[FutureRecordMetadata] = field(default_factory=list)
    size: int = 0


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
                     ) -> tuple[pa.Table, np.ndarray | None, np.ndarray]:
    """The rows as RECORD_SCHEMA, the requested partitions (-1 for none) and each row's
    size estimate (as ``send`` counts it, for cutting batches)."""
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
    if "timestamp" in names:
        ts = table.column("timestamp")
        if pa.types.is_timestamp(ts.type):
            ts = ts.cast(pa.timestamp("ms", tz=ts.type.tz), safe=False).cast(pa.int64())
        elif pa.types.is_integer(ts.type):
            ts = ts.cast(pa.int64())
        else:
            raise InvalidConfigError(f"send_table: column 'timestamp' must be int64 ms or a "
                                     f"timestamp, not {ts.type}")
        ts = pc.fill_null(ts, now_ms)
        if n and pc.min(ts).as_py() < 0:
            raise InvalidConfigError("send_table: timestamps must not be negative")
    else:
        ts = pa.chunked_array([repeat(pa.int64(), now_ms, n)])
    if "headers" in names:
        try:
            headers = table.column("headers").cast(HEADER_TYPE)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidConfigError(
                f"send_table: column 'headers' must be {HEADER_TYPE}, not "
                f"{table.column('headers').type} ({exc})") from None
        headers = pc.fill_null(headers, pa.scalar([], HEADER_TYPE)) \
            if headers.null_count else headers
    else:
        headers = pa.chunked_array([_empty_lists(n)], HEADER_TYPE)
    chosen = None
    if "partition" in names:
        column = table.column("partition")
        if not pa.types.is_integer(column.type):
            raise InvalidConfigError(f"send_table: column 'partition' must be int32 or int64, "
                                     f"not {column.type}")
        lowest = pc.min(column).as_py()
        if lowest is not None and lowest < 0:
            raise InvalidConfigError(f"send_table: partition {lowest} does not exist")
        chosen = pc.fill_null(column.cast(pa.int64()), -1).to_numpy()
    records = pa.Table.from_arrays([key, value, ts, headers], schema=RECORD_SCHEMA)
    sizes = RECORD_OVERHEAD + _lengths(key) + _lengths(value)
    if "headers" in names and n:
        flat = pc.list_flatten(headers)
        header_bytes = _lengths(pc.struct_field(flat, [0])) + _lengths(pc.struct_field(flat, [1]))
        offsets = np.concatenate([[0], np.cumsum(
            pc.fill_null(pc.list_value_length(headers), 0).to_numpy())])
        summed = np.concatenate([[0], np.cumsum(header_bytes)])
        sizes = sizes + summed[offsets[1:]] - summed[offsets[:-1]]
    return records, chosen, sizes


def _lengths(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return pc.fill_null(pc.binary_length(column), 0).to_numpy().astype(np.int64)


def _empty_lists(n: int) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)),
                                    pa.array([], HEADER_TYPE.value_type), type=HEADER_TYPE)
