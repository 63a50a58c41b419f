"""The accumulator on its own: records waiting per partition and their futures, and
send_table's tables brought to the batch schema and cut as ``send`` would cut them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from txlog.clients.accumulator import (RECORD_OVERHEAD, FutureRecordMetadata, RecordAccumulator,
                                       RecordMetadata, batch_runs, by_partition,
                                       in_partition_order, normalise_table, runs)
from txlog.errors import InvalidConfigError
from txlog.format.batch import HEADER_TYPE
from txlog.partition.appender import AppendResult

TP = ("t", 0)


class Drainer:
    """What a future asks to publish its batch: here, the accumulator's batch settled
    at ``base_offset``."""

    def __init__(self, accumulator: RecordAccumulator, base_offset: int) -> None:
        self.accumulator = accumulator
        self.base_offset = base_offset
        self.drained: list[tuple[str, int]] = []

    def _drain(self, tp: tuple[str, int]) -> None:
        self.drained.append(tp)
        pending = self.accumulator.pop(tp)
        assert pending is not None
        count = len(pending.futures)
        pending.resolve(AppendResult(self.base_offset, self.base_offset + count - 1))


def test_records_wait_per_partition_with_a_size_estimate() -> None:
    accumulator = RecordAccumulator()
    drainer = Drainer(accumulator, 0)
    size = accumulator.append(TP, b"k", b"value", 5, [], FutureRecordMetadata(drainer, *TP))
    assert size == RECORD_OVERHEAD + 1 + 5
    headers = [{"key": "h", "value": b"vv"}]
    size = accumulator.append(TP, None, None, 6, headers, FutureRecordMetadata(drainer, *TP))
    assert size == 2 * RECORD_OVERHEAD + 6 + 3
    other = accumulator.append(("t", 1), None, b"x", 7, [], FutureRecordMetadata(drainer, "t", 1))
    assert other == RECORD_OVERHEAD + 1
    assert accumulator.partitions() == [TP, ("t", 1)]
    pending = accumulator.pop(TP)
    assert pending is not None and accumulator.partitions() == [("t", 1)]
    table = pending.records()
    assert table.column("key").to_pylist() == [b"k", None]
    assert table.column("value").to_pylist() == [b"value", None]
    assert table.column("timestamp").to_pylist() == [5, 6]
    assert table.column("headers").to_pylist() == [[], [{"key": "h", "value": b"vv"}]]
    assert accumulator.pop(TP) is None


def test_lingering_batches_are_those_older_than_linger_ms() -> None:
    accumulator = RecordAccumulator()
    drainer = Drainer(accumulator, 0)
    accumulator.append(TP, None, b"a", 1, [], FutureRecordMetadata(drainer, *TP))
    created = accumulator.created()
    assert len(created) == 1
    assert accumulator.lingering(created[0] + 0.004, 5) == []
    assert accumulator.lingering(created[0] + 0.006, 5) == [TP]


def test_a_future_drains_its_batch_and_learns_its_offset() -> None:
    accumulator = RecordAccumulator()
    drainer = Drainer(accumulator, 40)
    futures = [FutureRecordMetadata(drainer, *TP) for _ in range(3)]
    for i, future in enumerate(futures):
        accumulator.append(TP, None, b"v", 100 + i, [], future)
    seen: list[RecordMetadata] = []
    futures[2].add_callback(seen.append)
    assert not futures[1].is_done()
    assert futures[1].get() == RecordMetadata("t", 0, 41, 101)
    assert drainer.drained == [TP]  # one drain settled the whole batch
    assert futures[0].get() == RecordMetadata("t", 0, 40, 100)
    assert seen == [RecordMetadata("t", 0, 42, 102)] and drainer.drained == [TP]


def test_a_log_append_time_batch_gives_every_record_the_logs_time() -> None:
    accumulator = RecordAccumulator()
    futures = [FutureRecordMetadata(Drainer(accumulator, 0), *TP) for _ in range(2)]
    for future in futures:
        accumulator.append(TP, None, b"v", 1, [], future)
    pending = accumulator.pop(TP)
    assert pending is not None
    pending.resolve(AppendResult(7, 8, log_append_time=999))
    assert [f.get().timestamp for f in futures] == [999, 999]
    assert [f.get().offset for f in futures] == [7, 8]


def test_fail_all_fails_every_waiting_future() -> None:
    accumulator = RecordAccumulator()
    drainer = Drainer(accumulator, 0)
    futures = [FutureRecordMetadata(drainer, "t", p) for p in (0, 1, 0)]
    for future in futures:
        accumulator.append((future.topic, future.partition), None, b"v", 1, [], future)
    errors: list[BaseException] = []
    futures[1].add_errback(errors.append)
    error = RuntimeError("aborted")
    accumulator.fail_all(error)
    assert all(f.failed() and f.exception() is error for f in futures)
    assert errors == [error] and accumulator.partitions() == []
    with pytest.raises(RuntimeError, match="aborted"):
        futures[0].get()
    assert drainer.drained == []  # a settled future publishes nothing


def test_runs_cut_a_range_at_its_bounds() -> None:
    assert runs(np.array([2, 5]), 7) == [(0, 2), (2, 5), (5, 7)]
    assert runs(np.array([], dtype=np.int64), 3) == [(0, 3)]
    assert all(isinstance(lo, int) for lo, _ in runs(np.array([1]), 2))


def test_rows_group_by_partition_keeping_their_order() -> None:
    parts = np.array([1, 0, 1, 2, 0, 1], dtype=np.int32)
    order, groups = by_partition(parts, 3)
    assert order.tolist() == [1, 4, 0, 2, 5, 3]
    assert groups == [(0, 0, 2), (1, 2, 5), (2, 5, 6)]
    wide = np.array([70_000, 3, 70_000], dtype=np.int32)  # past int16: sorted as int32
    order, groups = by_partition(wide, 80_000)
    assert order.tolist() == [1, 0, 2] and groups == [(3, 0, 1), (70_000, 1, 3)]


def test_regrouping_copies_the_given_columns_and_keeps_the_filled_in_ones() -> None:
    """The columns send_table filled in (no key, the send's time, no headers) hold one
    value in every row: they are kept as they are, not copied in partition order."""
    values = [b"v0", b"v1", b"v2", b"v3"]
    order = np.array([2, 0, 3, 1])
    records = normalise_table(pa.table({"value": values}), 1234)[0]
    grouped = in_partition_order(records, order, ["value"])
    assert grouped.schema.equals(records.schema)
    assert grouped.column("value").to_pylist() == [b"v2", b"v0", b"v3", b"v1"]
    for name in ("key", "timestamp", "headers"):
        assert grouped.column(name).chunk(0).buffers() == records.column(name).chunk(0).buffers()
    assert grouped.column("timestamp").to_pylist() == [1234] * 4
    given = normalise_table(pa.table({"value": values, "key": [b"k0", None, b"k2", b"k3"],
                                      "timestamp": pa.array([10, 11, 12, 13], pa.int64()),
                                      "headers": pa.array([[], [{"key": "h", "value": b"1"}],
                                                           [], []], HEADER_TYPE)}), 0)[0]
    grouped = in_partition_order(given, order, given.column_names)
    assert grouped.to_pylist() == [given.to_pylist()[i] for i in order]


def test_batches_are_cut_at_batch_size_with_their_timestamp_span() -> None:
    sizes = np.array([40, 40, 40, 40, 40])
    times = np.array([5, 3, 9, 1, 2])
    # Rows start at 0, 40, 80, 120, 160 bytes: batches of 100 bytes hold rows 0-2, 3-4.
    assert batch_runs(sizes, times, 100) == [(0, 3, 3, 9), (3, 5, 1, 2)]
    assert batch_runs(sizes, times, 1 << 20) == [(0, 5, 1, 9)]
    assert batch_runs(sizes, times, 1) == [(i, i + 1, t, t) for i, t in enumerate(times)]


def test_a_table_is_brought_to_the_record_schema() -> None:
    table = pa.table({"value": ["a", None], "key": [b"k", None],
                      "timestamp": pa.array([None, 7], pa.int64()),
                      "headers": pa.array([[{"key": "h", "value": b"xy"}], None],
                                          pa.list_(pa.struct([("key", pa.string()),
                                                              ("value", pa.binary())]))),
                      "partition": pa.array([None, 1], pa.int32())})
    records, chosen, sizes, key_value = normalise_table(table, 1000)
    assert records.column("value").to_pylist() == [b"a", None]
    assert records.column("timestamp").to_pylist() == [1000, 7]  # null means now
    assert records.column("headers").to_pylist() == [[{"key": "h", "value": b"xy"}], []]
    assert chosen is not None and chosen.tolist() == [-1, 1]
    assert sizes.tolist() == [RECORD_OVERHEAD + 1 + 1 + 1 + 2, RECORD_OVERHEAD]
    assert key_value.tolist() == [1 + 1, 0]  # the record-size metrics count these only
    plain, chosen, _, _ = normalise_table(pa.table({"value": [b"v"]}).to_batches()[0], 5)
    assert chosen is None and plain.column("timestamp").to_pylist() == [5]
    assert plain.column("headers").to_pylist() == [[]]


@pytest.mark.parametrize("table, message", [
    (pa.table({"key": [b"k"]}), "no 'value' column"),
    (pa.table({"value": [b"v"], "extra": [1]}), "unknown column"),
    (pa.table({"value": [1]}), "column 'value' must be binary or string"),
    (pa.table({"value": [b"v"], "timestamp": [1.5]}), "column 'timestamp' must be int64"),
    (pa.table({"value": [b"v"], "timestamp": [-1]}), "must not be negative"),
    (pa.table({"value": [b"v"], "headers": [1]}), "column 'headers' must be"),
    (pa.table({"value": [b"v"], "partition": ["0"]}), "column 'partition' must be"),
    (pa.table({"value": [b"v"], "partition": [-2]}), "partition -2 does not exist"),
])
def test_a_table_that_cannot_be_sent_is_refused(table: pa.Table, message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        normalise_table(table, 0)
