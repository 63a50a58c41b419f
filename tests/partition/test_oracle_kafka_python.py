"""kafka-python as an independent oracle for what read_committed returns.

txlog's reader decides which records a read_committed consumer sees from its
own producer state (aborted ranges, LSO).  Here the same partition is shown
to kafka-python's consumer, which knows nothing of txlog: every batch file is
rewritten as a Kafka v2 record batch (data batches keep producer id, epoch,
base sequence and the transactional flag; markers become control batches),
the fetch response is built the way a Kafka broker builds it (records below
the LSO, plus the (producer id, first offset) of every aborted transaction
overlapping the fetched range), and kafka-python's own fetcher logic
(``Fetcher.PartitionRecords``) filters it.  The two must agree record for
record: offsets, keys, values, timestamps and headers.

The aborted-transaction list and the LSO are computed here from the raw batch
headers, not from txlog's ProducerState, so a bug there cannot cancel out.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

import pytest

from txlog import READ_COMMITTED, READ_UNCOMMITTED, Log
from txlog.format.batch import (ABORT, BatchHeader, decode_control, decode_header, decode_records,
                                payload_of)

kafka_fetcher = pytest.importorskip("kafka.consumer.fetcher")
from kafka.protocol.consumer import FetchResponse, IsolationLevel  # noqa: E402
from kafka.record import MemoryRecords  # noqa: E402
from kafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402
from kafka.structs import TopicPartition  # noqa: E402

TOPIC = "oracle"
PARTITIONS = 3
PartitionData = FetchResponse.FetchableTopicResponse.PartitionData
KAFKA_CONTROL_KEY = struct.Struct(">hh")  # version, type (0 abort, 1 commit)
KAFKA_CONTROL_VALUE = struct.Struct(">hi")  # version, coordinator epoch


class ControlBatchBuilder(DefaultRecordBatchBuilder):
    """kafka-python only builds data batches (brokers write markers): add the control bit."""

    __slots__ = ()

    def _get_attributes(self, include_compression_type=True):
        return super()._get_attributes(include_compression_type) | self.CONTROL_MASK


@dataclass
class RawBatch:
    header: BatchHeader
    records: list[tuple[bytes | None, bytes | None, int, list[tuple[str, bytes | None]]]]
    control_type: int | None = None
    coordinator_epoch: int = 0


def raw_partition(log: Log, partition: int) -> list[RawBatch]:
    """The partition's batch files in offset order, decoded with txlog.format.batch only."""
    part = log.partition(TOPIC, partition)
    batches = []
    offset = 0
    while log.storage.exists(part.batch_path(offset)):
        data = log.storage.read(part.batch_path(offset))
        header = decode_header(data, "oracle", offset)
        payload = payload_of(data, header, "oracle")
        if header.is_control:
            control = decode_control(payload, header, "oracle")
            batches.append(RawBatch(header, [], control.type, control.coordinator_epoch))
        else:
            cols = decode_records(payload, header, "oracle").to_pydict()
            records = [(k, v, ts, [(h["key"], h["value"]) for h in hs])
                       for k, v, ts, hs in zip(cols["key"], cols["value"], cols["timestamp"],
                                               cols["headers"], strict=True)]
            batches.append(RawBatch(header, records))
        offset = header.next_offset
    assert offset == log.end_offset(TOPIC, partition)  # gap-free, nothing unlisted
    return batches


def to_kafka(batch: RawBatch) -> bytes:
    """One batch as Kafka's v2 wire format, at its log offset."""
    h = batch.header
    if batch.control_type is not None:
        builder = ControlBatchBuilder(magic=2, compression_type=0, is_transactional=True,
                                      producer_id=h.producer_id, producer_epoch=h.producer_epoch,
                                      base_sequence=-1, batch_size=1 << 30)
        builder.append(0, timestamp=h.max_timestamp,
                       key=KAFKA_CONTROL_KEY.pack(0, batch.control_type),
                       value=KAFKA_CONTROL_VALUE.pack(0, batch.coordinator_epoch), headers=[])
    else:
        builder = DefaultRecordBatchBuilder(
            magic=2, compression_type=0, is_transactional=h.is_transactional,
            producer_id=h.producer_id, producer_epoch=h.producer_epoch,
            base_sequence=h.base_sequence, batch_size=1 << 30)
        for delta, (key, value, ts, headers) in enumerate(batch.records):
            builder.append(delta, timestamp=ts, key=key, value=value, headers=headers)
    wire = bytearray(builder.build())
    struct.pack_into(">q", wire, 0, h.base_offset)  # BaseOffset is outside the CRC
    return bytes(wire)


def broker_view(batches: list[RawBatch]) -> tuple[int, list[tuple[int, int, int]]]:
    """(LSO, aborted transactions as (producer id, first offset, marker offset)).

    What a Kafka partition leader derives from its log: a transaction opens
    at a producer's first transactional data batch and closes at its marker.
    """
    open_first: dict[int, int] = {}
    aborted = []
    end = 0
    for b in batches:
        h = b.header
        end = h.next_offset
        if b.control_type is not None:
            first = open_first.pop(h.producer_id, None)
            if first is not None and b.control_type == ABORT:
                aborted.append((h.producer_id, first, h.base_offset))
        elif h.is_transactional:
            open_first.setdefault(h.producer_id, h.base_offset)
    lso = min(open_first.values(), default=end)
    return lso, aborted


Row = tuple[int, bytes | None, bytes | None, int, list]


def kafka_fetch(batches: list[RawBatch], start: int, isolation: str) -> list[Row]:
    """What kafka-python's consumer returns for a fetch from ``start``."""
    lso, aborted = broker_view(batches)
    end = batches[-1].header.next_offset if batches else 0
    upper = lso if isolation == READ_COMMITTED else end
    wire = b"".join(to_kafka(b) for b in batches
                    if b.header.next_offset > start and b.header.base_offset < upper)
    # The broker lists the aborted transactions that overlap [start, upper).
    listed = [PartitionData.AbortedTransaction(producer_id=pid, first_offset=first)
              for pid, first, last in aborted if last >= start and first < upper]
    response = PartitionData(partition_index=0, error_code=0, high_watermark=end,
                             last_stable_offset=lso, log_start_offset=0,
                             aborted_transactions=listed, records=wire)
    level = IsolationLevel.READ_COMMITTED if isolation == READ_COMMITTED \
        else IsolationLevel.READ_UNCOMMITTED
    records = kafka_fetcher.Fetcher.PartitionRecords(
        start, TopicPartition(TOPIC, 0), MemoryRecords(response.records),
        isolation_level=level, aborted_transactions=response.aborted_transactions)
    return [(r.offset, r.key, r.value, r.timestamp, list(r.headers)) for r in records.take()]


def txlog_read(log: Log, partition: int, start: int, isolation: str) -> list[Row]:
    table = log.read(TOPIC, partition, start, isolation_level=isolation, include_headers=True)
    cols = table.to_pydict()
    millis = [ts // 1000 for ts in table.column("timestamp").cast("int64").to_pylist()]
    return [(o, k, v, ts, [(h["key"], h["value"]) for h in hs])
            for o, k, v, ts, hs in zip(cols["offset"], cols["key"], cols["value"], millis,
                                       cols["headers"], strict=True)]


def txlog_consume(log: Log, partition: int, start: int, isolation: str) -> list[Row]:
    """The same through the Consumer, in small polls (exercises chunked reads)."""
    consumer = log.consumer(isolation_level=isolation, max_poll_records=3)
    consumer.assign([(TOPIC, partition)])
    consumer.seek(TOPIC, partition, start)
    limit = consumer.end_offsets()[(TOPIC, partition)]
    rows: list[Row] = []
    while consumer.position(TOPIC, partition) < limit:
        got = consumer.poll()
        assert got or consumer.position(TOPIC, partition) >= limit, "consumer made no progress"
        rows.extend((r.offset, r.key, r.value, r.timestamp, list(r.headers)) for r in got)
    return rows


# --- the log under test ------------------------------------------------------------------


def build_interleaved_log(log: Log, seed: int, steps: int = 140, leave_open: bool = True) -> None:
    """Interleaved transactions of three producers, plus plain and idempotent batches.

    Transactions span random partitions, are flushed in several batches,
    commit or abort at random.  With ``leave_open`` one transaction opened
    half-way never ends, so that the LSO sits well below the log end in the
    partitions it touched; otherwise every transaction is ended.
    """
    rng = random.Random(seed)
    log.create_topic(TOPIC, PARTITIONS)
    big_linger = 10**9  # batches close only on flush/commit: deterministic batching
    txns = [log.producer(transactional_id=f"oracle-{i}", linger_ms=big_linger)
            for i in range(3)]
    for t in txns:
        t.init_transactions()
    idempotent = log.producer(linger_ms=big_linger)
    plain = log.producer(enable_idempotence=False, linger_ms=big_linger)
    in_txn = [False] * len(txns)
    counter = 0

    def send(producer, tag: str) -> None:
        nonlocal counter
        counter += 1
        key = None if rng.random() < 0.3 else f"k{counter}".encode()
        headers = [("n", str(counter).encode())] if rng.random() < 0.5 else []
        if rng.random() < 0.1:
            headers.append(("none", None))
        producer.send(TOPIC, f"{tag}-{counter}".encode(), key=key,
                      partition=rng.randrange(PARTITIONS), headers=headers,
                      timestamp_ms=1_700_000_000_000 + counter)

    frozen: set[int] = set()
    for step in range(steps):
        if leave_open and step == steps // 2:
            # From here on producer 0 holds an open transaction that never ends:
            # everything committed after its first offset stays above the LSO.
            if in_txn[0]:
                txns[0].commit_transaction()
            txns[0].begin_transaction()
            for p in range(PARTITIONS - 1):
                txns[0].send(TOPIC, f"open-{p}".encode(), partition=p)
            txns[0].flush()
            frozen.add(0)
        roll = rng.random()
        if roll < 0.1:
            send(idempotent, "idem")
            idempotent.flush()
        elif roll < 0.18:
            send(plain, "plain")
            plain.flush()
        else:
            i = rng.choice([j for j in range(len(txns)) if j not in frozen])
            t = txns[i]
            if not in_txn[i]:
                t.begin_transaction()
                in_txn[i] = True
            action = rng.random()
            if action < 0.6:
                for _ in range(rng.randint(1, 4)):
                    send(t, f"t{i}")
                if rng.random() < 0.5:
                    t.flush()
            elif action < 0.8:
                t.commit_transaction()
                in_txn[i] = False
            else:
                t.abort_transaction()
                in_txn[i] = False
    for i, t in enumerate(txns):
        if in_txn[i] and i not in frozen:
            if rng.random() < 0.5:
                t.commit_transaction()
            else:
                t.abort_transaction()
    for i, t in enumerate(txns):
        if i not in frozen:
            t.flush()  # the last end's markers are written behind it: the raw view needs them


SEEDS = [1, 2, 3]


@pytest.mark.parametrize("seed", SEEDS)
def test_read_committed_matches_kafka_python(log: Log, seed: int) -> None:
    """read_committed from every start offset: txlog's reader == kafka-python's fetcher."""
    build_interleaved_log(log, seed)
    kinds = set()
    for p in range(PARTITIONS):
        batches = raw_partition(log, p)
        lso, aborted = broker_view(batches)
        assert log.last_stable_offset(TOPIC, p) == lso
        kinds |= {"aborted"} if aborted else set()
        kinds |= {"control"} if any(b.control_type is not None for b in batches) else set()
        kinds |= {"plain"} if any(b.header.producer_id == -1 for b in batches) else set()
        for start in range(lso + 1):
            expected = kafka_fetch(batches, start, READ_COMMITTED)
            assert txlog_read(log, p, start, READ_COMMITTED) == expected, (p, start)
        for start in (0, lso // 2, lso):
            assert txlog_consume(log, p, start, READ_COMMITTED) == \
                kafka_fetch(batches, start, READ_COMMITTED), (p, start)
    # The scenario really mixes what the filter has to tell apart.
    assert kinds == {"aborted", "control", "plain"}
    held_back = [p for p in range(PARTITIONS)
                 if log.last_stable_offset(TOPIC, p) < log.end_offset(TOPIC, p) - 10]
    assert held_back == list(range(PARTITIONS - 1))


@pytest.mark.parametrize("seed", SEEDS)
def test_read_uncommitted_matches_kafka_python(log: Log, seed: int) -> None:
    """read_uncommitted: everything but control batches, for kafka-python and txlog alike."""
    build_interleaved_log(log, seed)
    for p in range(PARTITIONS):
        batches = raw_partition(log, p)
        end = log.end_offset(TOPIC, p)
        for start in range(0, end + 1, 3):
            expected = kafka_fetch(batches, start, READ_UNCOMMITTED)
            assert txlog_read(log, p, start, READ_UNCOMMITTED) == expected, (p, start)
        assert txlog_consume(log, p, 0, READ_UNCOMMITTED) == \
            kafka_fetch(batches, 0, READ_UNCOMMITTED)
        committed = kafka_fetch(batches, 0, READ_COMMITTED)
        everything = kafka_fetch(batches, 0, READ_UNCOMMITTED)
        assert {r[0] for r in committed} <= {r[0] for r in everything}


def test_decided_transactions_read_as_kafka_reads_them_after_their_markers(log: Log) -> None:
    """A decision without markers already reads as Kafka reads the marked transaction.

    Two transactions over every partition (one COMMIT, one ABORT) get their
    decision published and nothing else, as if their process died at the
    commit point.  txlog's read_committed view at that moment (LSO at the log
    end, from every start offset) must equal kafka-python's view of the log
    once another process has rolled the markers forward.
    """
    build_interleaved_log(log, seed=4, steps=60, leave_open=False)
    crashed = {"crash-commit": True, "crash-abort": False}
    producers = []
    for name in crashed:
        producer = log.producer(transactional_id=name, linger_ms=10**9)
        producer.init_transactions()
        producer.begin_transaction()
        for p in range(PARTITIONS):
            producer.send(TOPIC, f"{name}-{p}".encode(), partition=p,
                          timestamp_ms=1_800_000_000_000 + p)
        producer.flush()
        producers.append(producer)
    # Both decided only now: a writer rolls decided transactions forward when it
    # meets them, and here nobody must get the chance.
    for producer, (name, commit) in zip(producers, crashed.items(), strict=True):
        log.coordinator.store.decide(log.coordinator.metadata(name).decision_id, commit,
                                     [(producer.producer_id, producer.epoch)], "test: crash")
    before = {}
    for p in range(PARTITIONS):
        end = log.end_offset(TOPIC, p)
        assert log.last_stable_offset(TOPIC, p) == end  # decided: nothing is held back
        assert not any(b.control_type is not None and b.header.transactional_id in crashed
                       for b in raw_partition(log, p))
        before[p] = {s: txlog_read(log, p, s, READ_COMMITTED) for s in range(end + 1)}

    for name in crashed:
        Log(log.root).coordinator.complete(name)
    for p in range(PARTITIONS):
        batches = raw_partition(log, p)
        assert sum(b.control_type is not None and b.header.transactional_id in crashed
                   for b in batches) == 2
        assert broker_view(batches)[0] == log.end_offset(TOPIC, p)
        for start, rows in before[p].items():
            assert rows == kafka_fetch(batches, start, READ_COMMITTED), (p, start)
        values = {r[2] for r in before[p][0]}
        assert f"crash-commit-{p}".encode() in values
        assert f"crash-abort-{p}".encode() not in values
