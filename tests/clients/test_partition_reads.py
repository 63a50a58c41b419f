"""Reads of several partitions at once (issue 32, item 4): ``Log.read`` of many partitions,
and the consumer reading ahead of its positions, every partition at once.

The expectations come from what each test sent (and the offsets the producer
acknowledged), never from hard-coded results.  The storage is wrapped as if it
were remote (``remote = True``), which is what turns the concurrent paths on, so
that they run here without an object store's latency; tests/partition/test_cold_reads.py
counts the requests on S3.
"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

from txlog import InvalidConfigError, Log, UnknownPartitionError
from txlog.partition.isolation import READ_UNCOMMITTED
from txlog.storage.schemes import open_storage

from helpers_core import DelegatingStorage


class RemoteLike(DelegatingStorage):
    """Memory storage that says it waits on the network: the paths that overlap requests
    run, on threads, as on an object store."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.remote = True

    def publish_stream_if_absent(self, *args, **kwargs):
        return self.inner.publish_stream_if_absent(*args, **kwargs)

    def delete_tree(self, directory: str) -> None:
        self.inner.delete_tree(directory)


def remote_log() -> Log:
    return Log(RemoteLike(open_storage(f"memory://{uuid.uuid4().hex}", None)))


def fill(log: Log, topic: str, partitions: int, rounds: int = 4
         ) -> dict[int, list[tuple[int, bytes]]]:
    """``rounds`` transactions over every partition, every other one aborted, with a
    non-transactional batch between them; returns, per partition, the (offset, value)
    of every record a read_committed reader must see, in offset order."""
    log.create_topic(topic, partitions)
    committed: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    with log.producer(transactional_id=f"w-{topic}") as txn, log.producer() as plain:
        txn.init_transactions()
        for r in range(rounds):
            txn.begin_transaction()
            futures = [(p, v, txn.send(topic, v, partition=p))
                       for p in range(partitions) for v in (b"t%d-%d-%d" % (r, p, i)
                                                           for i in range(3 + p))]
            txn.flush()
            if r % 2:
                txn.abort_transaction()
            else:
                txn.commit_transaction()
                for p, v, f in futures:
                    committed[p].append((f.get().offset, v))
            for p in range(partitions):
                v = b"p%d-%d" % (r, p)
                committed[p].append((plain.send(topic, v, partition=p).get().offset, v))
    return {p: sorted(rows) for p, rows in committed.items()}


def pairs(table: pa.Table) -> list[tuple[int, int, bytes]]:
    return list(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(),
                    table.column("value").to_pylist(), strict=True))


@pytest.mark.parametrize("make", [remote_log, lambda: Log(f"memory://{uuid.uuid4().hex}")],
                         ids=["remote-like", "memory"])
def test_many_partitions_in_one_read_in_the_order_asked(make) -> None:
    log = make()
    expected = fill(log, "t", 3)
    fresh = Log(log.storage)  # a new Log: every partition cold

    everything = fresh.read("t")
    assert pairs(everything) == [(p, o, v) for p in range(3) for o, v in expected[p]]
    # A list is read in its own order; each partition stays in offset order.
    assert pairs(fresh.read("t", [2, 0])) == \
        [(p, o, v) for p in (2, 0) for o, v in expected[p]]
    # One partition, as before: the same rows as that partition's share of the whole read.
    assert pairs(fresh.read("t", 1)) == [(1, o, v) for o, v in expected[1]]
    assert fresh.read("t", []).num_rows == 0
    assert fresh.read("t", []).schema == everything.schema


def test_many_partitions_with_offsets_by_partition() -> None:
    log = remote_log()
    expected = fill(log, "t", 3)
    lo = {0: expected[0][2][0], 2: expected[2][1][0]}
    hi = {2: expected[2][-2][0]}
    got = Log(log.storage).read("t", start=lo, end=hi)
    want = [(p, o, v) for p in range(3) for o, v in expected[p]
            if o >= lo.get(p, 0) and o < hi.get(p, o + 1)]
    assert pairs(got) == want
    # One offset for every partition.
    start = min(expected[p][1][0] for p in range(3))
    assert pairs(log.read("t", None, start)) == \
        [(p, o, v) for p in range(3) for o, v in expected[p] if o >= start]
    # read_uncommitted also returns the aborted records, still in offset order.
    uncommitted = log.read("t", isolation_level=READ_UNCOMMITTED)
    for p in range(3):
        offsets = [o for q, o, _ in pairs(uncommitted) if q == p]
        assert offsets == sorted(offsets) and len(offsets) > len(expected[p])


def test_bad_partition_choices_are_refused_before_reading(memlog: Log) -> None:
    memlog.create_topic("t", 2)
    with pytest.raises(InvalidConfigError, match="partition 1 is listed twice"):
        memlog.read("t", [1, 0, 1])
    with pytest.raises(UnknownPartitionError, match="partition 2 does not exist"):
        memlog.read("t", [0, 2])
    with pytest.raises(InvalidConfigError, match="an int, a list of ints or None"):
        memlog.read("t", "0")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError, match="start names partition 1, which"):
        memlog.read("t", [0], start={1: 0})


def drain(consumer, total: int, max_records: int | None = None
          ) -> dict[int, list[tuple[int, bytes]]]:
    got: dict[int, list[tuple[int, bytes]]] = {}
    while sum(len(v) for v in got.values()) < total:
        records = consumer.poll(max_records)
        assert records, f"the consumer stopped after {got}"
        for r in records:
            got.setdefault(r.partition, []).append((r.offset, r.value))
    assert consumer.poll() == []
    return got


@pytest.mark.parametrize("fetch_bytes", [1, 1 << 20])
def test_the_consumer_reads_ahead_every_partition_at_once_in_order(fetch_bytes: int) -> None:
    """Whole batches up to max_partition_fetch_bytes per partition (1 byte: one batch per
    read), handed out a few records at a time: per partition the records come in offset
    order, and under read_committed exactly the committed ones."""
    log = remote_log()
    expected = fill(log, "t", 3)
    consumer = Log(log.storage).consumer(auto_offset_reset="earliest",
                                         max_partition_fetch_bytes=fetch_bytes)
    consumer.assign([("t", p) for p in range(3)])
    got = drain(consumer, sum(len(v) for v in expected.values()), max_records=2)
    assert got == expected
    # Positions end past the last batch read (markers included), as a plain read's.
    for p in range(3):
        assert consumer.position("t", p) == log.partition("t", p).last_stable_offset()


def test_a_seek_drops_what_was_read_ahead() -> None:
    log = remote_log()
    expected = fill(log, "t", 2)
    consumer = Log(log.storage).consumer(auto_offset_reset="earliest")
    consumer.assign([("t", 0), ("t", 1)])
    first = consumer.poll(1)  # reads both partitions ahead, hands out one record
    assert [(r.offset, r.value) for r in first] == [expected[0][0]]
    target = expected[1][3][0]
    consumer.seek("t", 1, target)
    consumer.seek("t", 0, expected[0][0][0])
    got = drain(consumer, len(expected[0]) + len(expected[1]) - 3)
    assert got[0] == expected[0]
    assert got[1] == [(o, v) for o, v in expected[1] if o >= target]


def test_the_consumer_reads_what_was_committed_after_its_read_ahead() -> None:
    """A record appended after the consumer read a partition ahead is read next time, once
    what was read ahead is handed out."""
    log = remote_log()
    expected = fill(log, "t", 2, rounds=1)
    consumer = Log(log.storage).consumer(auto_offset_reset="earliest")
    consumer.assign([("t", 0), ("t", 1)])
    got = drain(consumer, sum(len(v) for v in expected.values()))
    with log.producer() as producer:
        late = producer.send("t", b"late", partition=1).get().offset
    assert [(r.partition, r.offset, r.value) for r in consumer.poll()] == [(1, late, b"late")]
    assert got == expected


def test_bad_max_partition_fetch_bytes_is_refused(memlog: Log) -> None:
    with pytest.raises(InvalidConfigError, match="max_partition_fetch_bytes must be a positive"):
        memlog.consumer(max_partition_fetch_bytes=0)


def test_read_ahead_stops_at_an_open_transaction_until_it_commits() -> None:
    """Under read_committed nothing past the LSO is read ahead: the records after an open
    transaction come only once it is decided, in offset order with the rest."""
    log = remote_log()
    expected = fill(log, "t", 2, rounds=1)
    consumer = Log(log.storage).consumer(auto_offset_reset="earliest")
    consumer.assign([("t", 0), ("t", 1)])
    with log.producer(transactional_id="open") as txn, log.producer() as plain:
        txn.init_transactions()
        txn.begin_transaction()
        held = [txn.send("t", b"held-%d" % i, partition=1) for i in range(3)]
        txn.flush()
        after = plain.send("t", b"after", partition=1).get().offset
        got = drain(consumer, sum(len(v) for v in expected.values()))
        assert got == expected  # nothing of partition 1 past the open transaction
        txn.commit_transaction()
    rest = [(r.offset, r.value) for r in consumer.poll()]
    assert rest == [(f.get().offset, b"held-%d" % i) for i, f in enumerate(held)] + \
        [(after, b"after")]
