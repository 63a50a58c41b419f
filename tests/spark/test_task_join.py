"""A Spark writer task joins its job while it takes Spark's first batches, without a JVM.

The join (the lease, the job's index entry, InitProducerId) is a few durable
steps; a stream's first batch only arrives once the source's task has read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pyarrow as pa
import pytest

from txlog import Log
from txlog.exactly_once.shared_transaction import SharedTransaction
from txlog.spark.options import WriteOptions
from txlog.spark.writer import TxlogBatchWriter, _coalesced


def spark_batches(taken: threading.Event, count: int) -> Iterator[pa.RecordBatch]:
    for i in range(count):
        taken.set()  # Spark has handed batch ``i`` over
        yield pa.record_batch({"key": pa.array([b"k%d" % i] * 3),
                               "value": pa.array([b"v%d-%d" % (i, j) for j in range(3)])})


def test_a_task_takes_sparks_batches_while_it_joins(memlog: Log,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    memlog.create_topic("t", 2)
    job = SharedTransaction.start(memlog, "tasks", 60_000)
    options = WriteOptions.parse({"path": memlog.root, "topic": "t"}, streaming=False)
    taken = threading.Event()
    joined_after_a_batch: list[bool] = []
    join = SharedTransaction.join

    def slow_join(self: SharedTransaction, log: Log, key: str, **config: object):  # type: ignore[no-untyped-def]
        # Before, the join ran first and nothing was taken from Spark until it ended.
        joined_after_a_batch.append(taken.wait(timeout=10))
        return join(self, log, key, **config)

    monkeypatch.setattr(SharedTransaction, "join", slow_join)
    message = TxlogBatchWriter(options, job)._write_in(job, "0-0", spark_batches(taken, 4),
                                                      memlog)
    assert joined_after_a_batch == [True]
    assert message.records == 12 and message.member is not None
    job.commit(memlog, [message.member])
    values = sorted(v for p in range(2) for v in memlog.read("t", p).column("value").to_pylist())
    assert values == sorted(b"v%d-%d" % (i, j) for i in range(4) for j in range(3))


def test_a_failed_join_fails_the_task_and_sends_nothing(memlog: Log,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    memlog.create_topic("t", 1)
    job = SharedTransaction.start(memlog, "tasks", 60_000)
    options = WriteOptions.parse({"path": memlog.root, "topic": "t"}, streaming=False)

    def refused(self: SharedTransaction, log: Log, key: str, **config: object):  # type: ignore[no-untyped-def]
        raise RuntimeError("join refused")

    monkeypatch.setattr(SharedTransaction, "join", refused)
    with pytest.raises(RuntimeError, match="join refused"):
        TxlogBatchWriter(options, job)._write_in(job, "0-0",
                                                 spark_batches(threading.Event(), 4), memlog)
    assert memlog.end_offset("t", 0) == 0


def test_sparks_batches_are_gathered_up_to_the_target_never_past_it() -> None:
    """A gathered table's share of a few-partition topic stays within one producer batch
    (past it, a partition's share was cut into a full batch and a small one); a batch
    larger than the target goes alone; every row, in order."""
    def batch(first: int, n: int) -> pa.RecordBatch:
        return pa.record_batch({"value": pa.array([b"%09d" % i for i in range(first, first + n)])})

    batches = [batch(0, 10), batch(10, 10), batch(20, 10), batch(30, 100), batch(130, 10)]
    size = batches[0].nbytes
    gathered = list(_coalesced(iter(batches), int(2.5 * size)))
    assert [t.num_rows for t in gathered] == [20, 10, 100, 10]
    assert all(t.nbytes <= 2.5 * size for t in gathered if t.num_rows != 100)
    assert [v for t in gathered for v in t.column("value").to_pylist()] == \
        [b"%09d" % i for i in range(140)]
