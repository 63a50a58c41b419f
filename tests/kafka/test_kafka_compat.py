"""txlog.kafka against kafka-python 3.0: names, signatures, behaviour, and ported programs.

kafka-python itself (the test extra installs it) is the oracle where it can
be one without a broker: its method signatures, its configuration keys and
its default partitioner.  The rest checks behaviour on a real log: what a
kafka-python program observes (dicts of TopicPartition, deserialized
records, timeouts honoured, commits) and that errors are catchable by
kafka-python's names and by txlog's.  The two ported programs at the end are
kafka-python programs run with only their imports and bootstrap_servers
changed.
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
import sys
import threading
import time
import uuid

import pytest

import txlog
from txlog import Log, Producer
from txlog.kafka import (ConsumerGroupMetadata, ConsumerRebalanceListener, ConsumerRecord,
                         KafkaConsumer, KafkaProducer, OffsetAndMetadata, OffsetAndTimestamp,
                         RecordMetadata, TopicPartition)
from txlog.kafka import errors
from txlog.kafka.config import ACCEPTED, CONSUMER_CONFIG, PRODUCER_CONFIG, REFUSED, USED

from conftest import REPO, run_python

kafka = pytest.importorskip("kafka", reason="kafka-python is the oracle: pip install -e '.[test]'")

TOPIC = "orders"


@pytest.fixture
def root() -> str:
    url = f"memory://{uuid.uuid4().hex}"
    Log(url).create_topic(TOPIC, partitions=3)
    return url


def producer(root: str, **config) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=root, **config)


def consumer(root: str, **config) -> KafkaConsumer:
    config.setdefault("auto_offset_reset", "earliest")
    return KafkaConsumer(bootstrap_servers=root, **config)


def all_partitions(n: int = 3) -> list[TopicPartition]:
    return [TopicPartition(TOPIC, p) for p in range(n)]


def drain(c: KafkaConsumer) -> list[ConsumerRecord]:
    out = []
    while batch := c.poll(timeout_ms=0):
        for records in batch.values():
            out.extend(records)
    return out


# --- names and signatures: kafka-python is the oracle -------------------------------------


METHODS = {
    KafkaProducer: ["__init__", "send", "flush", "close", "partitions_for", "init_transactions",
                    "begin_transaction", "send_offsets_to_transaction", "commit_transaction",
                    "abort_transaction", "metrics", "bootstrap_connected"],
    KafkaConsumer: ["__init__", "poll", "assign", "assignment", "subscribe", "subscription",
                    "unsubscribe", "seek", "seek_to_beginning", "seek_to_end", "position",
                    "committed", "commit", "commit_async", "beginning_offsets", "end_offsets",
                    "offsets_for_times", "pause", "resume", "paused", "partitions_for_topic",
                    "topics", "close", "highwater", "group_metadata", "metrics",
                    "bootstrap_connected"],
}


@pytest.mark.parametrize("ours", [KafkaProducer, KafkaConsumer], ids=lambda c: c.__name__)
def test_methods_have_kafka_pythons_parameters_in_its_order_with_its_defaults(ours) -> None:
    theirs = getattr(kafka, ours.__name__)
    for name in METHODS[ours]:
        mine = inspect.signature(getattr(ours, name)).parameters
        original = inspect.signature(getattr(theirs, name)).parameters
        assert [(p.name, p.kind, p.default) for p in mine.values()] == \
            [(p.name, p.kind, p.default) for p in original.values()], name


def test_value_types_have_kafka_pythons_fields_and_defaults() -> None:
    from kafka.consumer.fetcher import ConsumerRecord as KConsumerRecord
    from kafka.producer.future import RecordMetadata as KRecordMetadata

    pairs = [(TopicPartition, kafka.TopicPartition), (OffsetAndMetadata, kafka.OffsetAndMetadata),
             (OffsetAndTimestamp, kafka.structs.OffsetAndTimestamp),
             (ConsumerGroupMetadata, kafka.ConsumerGroupMetadata),
             (ConsumerRecord, KConsumerRecord), (RecordMetadata, KRecordMetadata)]
    for ours, theirs in pairs:
        assert ours._fields == theirs._fields, ours.__name__
        assert ours._field_defaults == theirs._field_defaults, ours.__name__


def test_every_error_name_exists_in_kafka_errors_with_the_same_error_code() -> None:
    ours = {n: c for n, c in vars(errors).items()
            if isinstance(c, type) and issubclass(c, errors.KafkaError)}
    assert len(ours) > 30
    for name, cls in ours.items():
        theirs = getattr(kafka.errors, name)
        assert getattr(cls, "errno", None) == getattr(theirs, "errno", None), name
        assert cls.retriable == theirs.retriable, name


@pytest.mark.parametrize("table,theirs", [(PRODUCER_CONFIG, "KafkaProducer"),
                                          (CONSUMER_CONFIG, "KafkaConsumer")])
def test_the_config_table_decides_every_kafka_python_key(table, theirs) -> None:
    keys = set(getattr(kafka, theirs).DEFAULT_CONFIG)
    assert keys - set(table) == set(), "kafka-python keys the table does not decide"
    assert set(table) - keys == {"storage_options"}, "keys kafka-python does not have"
    assert {s.handling for s in table.values()} <= {USED, ACCEPTED, REFUSED}


def test_docs_clients_md_shows_the_config_table_as_the_code_has_it() -> None:
    from txlog.kafka.config import markdown_table

    assert markdown_table() in (REPO / "docs" / "clients.md").read_text()


def test_keyed_records_go_where_kafka_pythons_default_partitioner_puts_them(root) -> None:
    from kafka.partitioner.default import murmur2

    with producer(root, key_serializer=str.encode) as p:
        futures = {f"user-{i}": p.send(TOPIC, b"v", key=f"user-{i}") for i in range(40)}
        for key, f in futures.items():
            expected = (murmur2(key.encode()) & 0x7FFFFFFF) % 3
            assert f.get(timeout=10).partition == expected, key


# --- configuration ------------------------------------------------------------------------


def test_unknown_and_refused_keys_are_refused_by_name(root) -> None:
    with pytest.raises(errors.KafkaConfigurationError, match="unrecognized.*'lingerms'"):
        producer(root, lingerms=5)
    with pytest.raises(errors.KafkaConfigurationError, match="security_protocol='SASL_SSL'"):
        consumer(root, security_protocol="SASL_SSL")
    with pytest.raises(errors.KafkaConfigurationError, match="ssl_cafile"):
        producer(root, ssl_cafile="/etc/ca.pem")
    with pytest.raises(errors.KafkaConfigurationError, match="partitioner"):
        producer(root, partitioner=lambda *a: 0)
    with pytest.raises(errors.KafkaConfigurationError, match="gzip"):
        producer(root, compression_type="gzip")
    with pytest.raises(errors.KafkaConfigurationError, match="acks=2"):
        producer(root, acks=2)
    with pytest.raises(errors.KafkaConfigurationError, match="no brokers"):
        KafkaProducer(bootstrap_servers=[root, root])
    with pytest.raises(errors.KafkaConfigurationError, match="list of Kafka brokers"):
        KafkaConsumer(bootstrap_servers="kafka1:9092,kafka2:9092")
    with pytest.raises(errors.KafkaConfigurationError, match="isolation_level"):
        consumer(root, isolation_level="read_some")
    # accepted, documented keys pass, and kafka-python's defaults pass explicitly
    producer(root, acks="all", retries=5, api_version=(2, 8, 0), request_timeout_ms=1000,
             security_protocol="PLAINTEXT", max_request_size=1 << 20).close()
    KafkaConsumer(check_crcs=False, fetch_max_wait_ms=100, client_id="x",
                  bootstrap_servers=[root]).close()


# --- the producer -------------------------------------------------------------------------


def test_send_takes_kafka_pythons_positional_order_and_serializers(root) -> None:
    class Upper(kafka.serializer.Serializer):  # kafka-python's Serializer interface
        def serialize(self, topic, headers, data):
            return f"{topic}:{data}".upper().encode()

    with producer(root, key_serializer=Upper(),
                  value_serializer=lambda v: json.dumps(v).encode()) as p:
        md = p.send(TOPIC, {"n": 1}, "k", [("h", b"1")], 2, 1_700_000_000_000).get(timeout=10)
    assert (md.topic, md.partition, md.offset, md.timestamp) == (TOPIC, 2, 0, 1_700_000_000_000)
    assert md.topic_partition == TopicPartition(TOPIC, 2)
    assert (md.serialized_key_size, md.serialized_value_size, md.serialized_header_size) == \
        (len(b"ORDERS:K"), len(b'{"n": 1}'), 2)
    c = consumer(root, key_deserializer=bytes.decode, value_deserializer=json.loads)
    c.assign([TopicPartition(TOPIC, 2)])
    (record,) = drain(c)
    assert (record.key, record.value, record.headers, record.offset) == \
        ("ORDERS:K", {"n": 1}, [("h", b"1")], 0)
    assert (record.serialized_key_size, record.serialized_header_size, record.leader_epoch) == \
        (8, 2, -1)


def test_send_checks_its_arguments_as_kafka_python_does(root) -> None:
    with producer(root) as p:
        with pytest.raises(ValueError, match="key or value"):
            p.send(TOPIC)
        with pytest.raises(TypeError, match="headers"):
            p.send(TOPIC, b"v", headers=[("h", "not bytes")])
        with pytest.raises(TypeError, match="serialized value"):
            p.send(TOPIC, "a str without a serializer")
        with pytest.raises(ValueError, match="partition"):  # KafkaConfigurationError is one
            p.send(TOPIC, b"v", partition=7)
        Log(root).alter_root_config({"auto.create.topics.enable": False})
        with pytest.raises(errors.UnknownTopicOrPartitionError,
                           match="'no-such-topic' .*auto.create.topics.enable is false"):
            p.send("no-such-topic", b"v")
    with pytest.raises(errors.IllegalStateError, match="closed"):
        p.send(TOPIC, b"v")


def test_get_honours_its_timeout_while_the_write_is_slow(root) -> None:
    p = producer(root, linger_ms=60_000)
    release = threading.Event()
    original = p._core._sender.write_staged

    def slow_publish(*args, **kwargs):
        release.wait(30)
        return original(*args, **kwargs)

    p._core._sender.write_staged = slow_publish
    future = p.send(TOPIC, b"v", partition=0)
    started = time.monotonic()
    with pytest.raises(errors.KafkaTimeoutError, match="0.3 secs"):
        future.get(timeout=0.3)
    waited = time.monotonic() - started
    assert 0.3 <= waited < 10  # far below the 30 s the write is held for
    with pytest.raises(errors.KafkaTimeoutError):
        p.flush(timeout=0.1)
    release.set()
    assert future.get(timeout=10).offset == 0
    p.close()


def test_the_sender_publishes_lingering_records_without_a_flush(root) -> None:
    p = producer(root, linger_ms=20)
    future = p.send(TOPIC, b"v", partition=1)
    log = Log(root)
    deadline = time.monotonic() + 10
    while log.end_offset(TOPIC, 1) == 0:
        assert time.monotonic() < deadline, "the record was never published"
        time.sleep(0.01)
    assert future.get(timeout=0).offset == 0  # done: no wait, no publish needed
    p.close()


@pytest.fixture
def fast_switching():
    """Threads switch every microsecond instead of every 5 ms, so that races show."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_one_producer_shared_by_threads_writes_each_record_once_in_order(root, fast_switching
                                                                       ) -> None:
    p = producer(root, linger_ms=2)
    threads, per_thread = 8, 150
    futures: dict[int, list] = {}

    def work(t: int) -> None:
        futures[t] = [p.send(TOPIC, f"{t}:{i}".encode(), key=f"thread-{t}".encode())
                      for i in range(per_thread)]

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    p.flush()
    positions = {(md.partition, md.offset) for fs in futures.values()
                 for md in (f.get(timeout=0) for f in fs)}
    assert len(positions) == threads * per_thread  # every record has its own offset
    c = consumer(root)
    c.assign(all_partitions())
    values = [r.value.decode() for r in drain(c)]
    assert sorted(values) == sorted(f"{t}:{i}" for t in range(threads) for i in range(per_thread))
    for t in range(threads):  # one key, one partition: each thread's order is kept
        mine = [int(v.split(":")[1]) for v in values if v.startswith(f"{t}:")]
        assert mine == list(range(per_thread))
    p.close()


def test_records_sent_without_flush_or_close_are_written_at_exit(tmp_path) -> None:
    """kafka-python closes its producers at interpreter exit; a script that only sends
    must not lose its records."""
    root = str(tmp_path / "log")
    Log(root).create_topic(TOPIC, partitions=1)
    script = ("import sys\nfrom txlog.kafka import KafkaProducer\n"
              "producer = KafkaProducer(bootstrap_servers=sys.argv[1], linger_ms=60_000)\n"
              "for i in range(3):\n    producer.send('orders', b'%d' % i)\n")
    run_python(["-c", script, root], env={"JAVA_HOME": os.environ.get("JAVA_HOME", "")},
               timeout=60)
    c = consumer(root)
    c.assign([TopicPartition(TOPIC, 0)])
    assert [r.value for r in drain(c)] == [b"0", b"1", b"2"]


def test_callbacks_and_errbacks(root) -> None:
    got, failed = [], []
    with producer(root) as p:
        p.send(TOPIC, b"v", partition=0).add_callback(got.append).add_errback(failed.append)
        p.flush()
    assert [md.offset for md in got] == [0] and failed == []


def test_transactions_with_offsets_commit_or_abort_together(root) -> None:
    p = producer(root, transactional_id="etl-1")
    with pytest.raises(errors.IllegalStateError):
        p.begin_transaction()  # before init_transactions
    p.init_transactions()
    p.begin_transaction()
    p.send(TOPIC, b"committed", partition=0)
    p.send_offsets_to_transaction({TopicPartition("input", 0): OffsetAndMetadata(42, "", -1)},
                                  ConsumerGroupMetadata(group_id="etl"))
    p.commit_transaction()
    p.begin_transaction()
    p.send(TOPIC, b"aborted", partition=0).get(timeout=10)  # written, then aborted
    p.send_offsets_to_transaction({TopicPartition("input", 0): OffsetAndMetadata(99, "", -1)},
                                  "etl")
    p.abort_transaction()
    with pytest.raises(errors.KafkaConfigurationError, match="metadata='note'"):
        p.begin_transaction()
        p.send_offsets_to_transaction({TopicPartition("input", 0): OffsetAndMetadata(5, "note")},
                                      "etl")
    p.abort_transaction()
    assert Log(root).committed("etl") == {("input", 0): 42}
    committed = consumer(root, isolation_level="read_committed")
    committed.assign([TopicPartition(TOPIC, 0)])
    assert [r.value for r in drain(committed)] == [b"committed"]
    uncommitted = consumer(root)  # kafka-python's default isolation: read_uncommitted
    uncommitted.assign([TopicPartition(TOPIC, 0)])
    assert [r.value for r in drain(uncommitted)] == [b"committed", b"aborted"]
    # a newer instance fences this one: catchable by kafka-python's name and txlog's
    newer = producer(root, transactional_id="etl-1")
    newer.init_transactions()
    p.begin_transaction()
    with pytest.raises(errors.ProducerFencedError) as fenced:  # joining the partition fails
        p.send(TOPIC, b"zombie", partition=0)
        p.commit_transaction()
    assert isinstance(fenced.value, txlog.ProducerFencedError)
    newer.close()


def test_close_fails_the_records_of_an_open_transaction(root) -> None:
    p = producer(root, transactional_id="etl-2", linger_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    future = p.send(TOPIC, b"never", partition=0)
    p.close()
    with pytest.raises(errors.KafkaError, match="closed before"):
        future.get(timeout=0)
    assert Log(root).end_offset(TOPIC, 0) == 0


def test_producer_without_transactional_id_refuses_transactions(root) -> None:
    with producer(root) as p:
        with pytest.raises(errors.IllegalStateError, match="transactional_id"):
            p.init_transactions()


# --- the consumer -------------------------------------------------------------------------


def fill(root: str, per_partition: int = 5) -> None:
    with producer(root) as p:
        for part in range(3):
            for i in range(per_partition):
                p.send(TOPIC, f"{part}-{i}".encode(), partition=part,
                       timestamp_ms=1_000_000 + 1000 * i)


def test_poll_returns_a_dict_of_records_per_partition_and_honours_its_arguments(root) -> None:
    fill(root)
    c = consumer(root)
    c.assign(all_partitions())
    batch = c.poll(timeout_ms=1000, max_records=4)
    assert sum(len(rs) for rs in batch.values()) == 4
    for tp, records in batch.items():
        assert isinstance(tp, TopicPartition)
        assert all(r.topic == tp.topic and r.partition == tp.partition for r in records)
        assert [r.offset for r in records] == list(range(records[0].offset,
                                                         records[0].offset + len(records)))
    assert len(drain(c)) == 11
    started = time.monotonic()
    assert c.poll(timeout_ms=300) == {}  # waits for records, then gives up
    assert time.monotonic() - started >= 0.3
    with pytest.raises(ValueError):
        c.poll(timeout_ms=-1)
    with pytest.raises(TypeError):
        c.poll(max_records="10")
    with pytest.raises(ValueError):
        c.poll(max_records=0)
    c.close()
    with pytest.raises(errors.IllegalStateError, match="closed"):
        c.poll()


def test_poll_returns_records_written_while_it_waits(root) -> None:
    c = consumer(root)
    c.assign([TopicPartition(TOPIC, 0)])
    timer = threading.Timer(0.2, lambda: producer(root).send(TOPIC, b"late", partition=0)
                            .get(timeout=10))
    timer.start()
    batch = c.poll(timeout_ms=10_000)
    timer.join()
    assert [r.value for r in batch[TopicPartition(TOPIC, 0)]] == [b"late"]


def test_positions_seeks_and_offsets(root) -> None:
    fill(root)
    tp = TopicPartition(TOPIC, 1)
    c = consumer(root)
    c.assign([tp])
    assert c.position(tp) == 0
    c.seek(tp, 3)
    assert [r.offset for r in drain(c)] == [3, 4]
    c.seek_to_beginning()
    assert c.position(tp) == 0
    c.seek_to_end(tp)
    assert c.position(tp) == 5
    assert c.beginning_offsets([tp]) == {tp: 0}
    assert c.end_offsets(all_partitions()) == {t: 5 for t in all_partitions()}
    found = c.offsets_for_times({tp: 1_002_500, TopicPartition(TOPIC, 0): 9_999_999})
    assert found == {tp: OffsetAndTimestamp(3, 1_003_000, -1), TopicPartition(TOPIC, 0): None}
    with pytest.raises(ValueError, match="negative"):
        c.offsets_for_times({tp: -1})
    with pytest.raises(TypeError):
        c.seek((TOPIC, 1), 0)  # kafka-python insists on TopicPartition
    with pytest.raises(ValueError, match="Unassigned"):
        c.seek(TopicPartition(TOPIC, 0), 0)
    with pytest.raises(ValueError, match="Offset"):
        c.seek(tp, -1)
    with pytest.raises(errors.IllegalStateError, match="not assigned"):
        c.position(TopicPartition(TOPIC, 2))
    with pytest.raises(ValueError, match="Unassigned"):
        c.seek_to_end(TopicPartition(TOPIC, 2))


def test_read_committed_end_offsets_stop_at_an_open_transaction(root) -> None:
    fill(root, per_partition=2)
    p = producer(root, transactional_id="open")
    p.init_transactions()
    p.begin_transaction()
    p.send(TOPIC, b"pending", partition=0).get(timeout=10)
    tp = TopicPartition(TOPIC, 0)
    assert consumer(root, isolation_level="read_committed").end_offsets([tp]) == {tp: 2}
    assert consumer(root).end_offsets([tp]) == {tp: 3}
    p.abort_transaction()


def test_read_committed_moves_past_a_dead_producers_transaction_after_its_timeout(root
                                                                                  ) -> None:
    """Kafka's coordinator aborts an expired transaction; here the reader does."""
    timeout_s = 1.5
    dead = producer(root, transactional_id="dead", transaction_timeout_ms=int(timeout_s * 1000))
    dead.init_transactions()
    dead.begin_transaction()
    began = time.monotonic()
    dead.send(TOPIC, b"never visible", partition=0).get(timeout=10)  # then it "dies"
    with producer(root) as p:  # (a producer also ends expired transactions where it writes)
        p.send(TOPIC, b"after", partition=0).get(timeout=10)
    c = consumer(root, isolation_level="read_committed")
    c.assign([TopicPartition(TOPIC, 0)])
    held = c.poll(timeout_ms=0)
    if time.monotonic() - began < timeout_s:  # not expired yet (unless the machine stalled)
        assert held == {}  # so what ends the transaction below is this consumer's sweep
    batch = held or c.poll(timeout_ms=10_000)  # the timeout passes while it waits
    assert [r.value for r in batch[TopicPartition(TOPIC, 0)]] == [b"after"]


def test_a_callback_may_wait_on_another_record_and_flush(root) -> None:
    """Callbacks run in the sender thread: a get() or flush() there must not wait for it."""
    p = producer(root, linger_ms=60_000)
    other = p.send(TOPIC, b"other", partition=1)
    seen = []
    p.send(TOPIC, b"first", partition=0).add_callback(
        lambda md: seen.append((other.get(timeout=5).offset, p.flush(timeout=5))))
    p.flush(timeout=10)
    assert seen == [(0, None)]
    p.close()


def test_manual_commits_committed_and_commit_async(root) -> None:
    fill(root)
    tp = TopicPartition(TOPIC, 0)
    c = consumer(root, group_id="g", enable_auto_commit=False)
    c.assign([tp])
    assert c.committed(tp) is None
    c.poll(timeout_ms=1000, max_records=2)
    c.commit()
    assert c.committed(tp) == 2
    assert c.committed(tp, metadata=True) == OffsetAndMetadata(2, "", -1)
    calls = []
    future = c.commit_async({tp: OffsetAndMetadata(4, "", -1)},
                            callback=lambda offsets, response: calls.append((offsets, response)))
    assert future.succeeded() and calls == [({tp: OffsetAndMetadata(4, "", -1)}, None)]
    assert c.committed(tp) == 4
    c.close()
    again = consumer(root, group_id="g", enable_auto_commit=False)
    again.assign([tp])
    assert [r.offset for r in drain(again)] == [4]  # resumes from the committed offset
    with pytest.raises(errors.IllegalStateError, match="group_id"):
        consumer(root).commit()


def test_auto_commit_commits_consumed_positions_in_poll_and_on_close(root) -> None:
    fill(root)
    tp = TopicPartition(TOPIC, 2)
    c = consumer(root, group_id="auto", auto_commit_interval_ms=0)
    c.assign([tp])
    c.poll(timeout_ms=1000, max_records=3)
    assert c.committed(tp) is None  # what a poll returns is committed by the next poll
    c.poll(timeout_ms=0, max_records=1)
    assert c.committed(tp) == 3
    c.close()
    assert Log(root).committed("auto") == {(TOPIC, 2): 4}
    failed = consumer(root, group_id="auto2", auto_commit_interval_ms=60_000)
    failed.assign([tp])
    with pytest.raises(RuntimeError):
        with failed:
            failed.poll(timeout_ms=1000)
            raise RuntimeError("processing failed")
    assert Log(root).committed("auto2") == {}  # no auto-commit when the block failed


def test_iteration_stops_after_consumer_timeout_and_commits_only_what_was_seen(root) -> None:
    fill(root)
    c = consumer(root, group_id="it", enable_auto_commit=False, consumer_timeout_ms=200)
    c.assign(all_partitions())
    seen = []
    for record in c:
        seen.append(record)
        if len(seen) == 4:
            break
    c.commit()
    committed = Log(root).committed("it")
    for tp in {(r.topic, r.partition) for r in seen}:
        assert committed[tp] == max(r.offset for r in seen if (r.topic, r.partition) == tp) + 1
    started = time.monotonic()
    rest = list(c)
    assert time.monotonic() - started >= 0.2
    assert len(seen) + len(rest) == 15
    assert not {(r.partition, r.offset) for r in seen} & {(r.partition, r.offset) for r in rest}


def test_a_record_the_deserializer_rejects_is_named_and_not_skipped(root) -> None:
    with producer(root) as p:
        for value in (b'{"n": 0}', b"not json", b'{"n": 2}'):
            p.send(TOPIC, value, partition=0)
    tp = TopicPartition(TOPIC, 0)
    c = consumer(root, value_deserializer=json.loads)
    c.assign([tp])
    with pytest.raises(json.JSONDecodeError) as caught:  # kafka-python's type, with a note
        c.poll(timeout_ms=1000)
    assert f"{TOPIC}-0 at offset 1" in "".join(caught.value.__notes__)
    assert c.position(tp) == 0  # nothing of the failed poll was handed out
    with pytest.raises(json.JSONDecodeError):
        c.poll(timeout_ms=0, max_records=5)
    c.seek(tp, 2)  # the program decides to skip the bad record
    assert [r.value for r in drain(c)] == [{"n": 2}]


def test_pause_and_resume(root) -> None:
    fill(root)
    c = consumer(root)
    c.assign(all_partitions())
    c.pause(TopicPartition(TOPIC, 0))
    assert c.paused() == {TopicPartition(TOPIC, 0)}
    assert {r.partition for r in drain(c)} == {1, 2}
    c.resume(TopicPartition(TOPIC, 0))
    assert {r.partition for r in drain(c)} == {0}
    with pytest.raises(errors.IllegalStateError):
        c.pause(TopicPartition("other", 0))


def test_subscribe_without_a_group_reads_every_partition_and_finds_new_ones(root) -> None:
    fill(root, per_partition=1)
    c = consumer(root, metadata_max_age_ms=0)
    c.subscribe([TOPIC])
    assert c.subscription() == {TOPIC}
    assert c.assignment() == set(all_partitions())
    assert len(drain(c)) == 3
    Log(root).create_partitions(TOPIC, 4)
    with producer(root) as p:
        p.send(TOPIC, b"new", partition=3)
    assert [r.partition for r in drain(c)] == [3]
    with pytest.raises(errors.IllegalStateError, match="mutually exclusive"):
        c.assign(all_partitions())
    c.unsubscribe()
    assert c.subscription() is None and c.assignment() == set()
    assert c.topics() == {TOPIC} and c.partitions_for_topic(TOPIC) == {0, 1, 2, 3}
    assert c.partitions_for_topic("absent") == set()


def test_two_subscribed_consumers_split_the_partitions_and_commit_as_members(root) -> None:
    fill(root, per_partition=2)

    class Listener(ConsumerRebalanceListener):
        def __init__(self) -> None:
            self.assigned: list = []

        def on_partitions_revoked(self, revoked):
            pass

        def on_partitions_assigned(self, assigned):
            self.assigned.append(sorted(assigned))

    def member() -> tuple[KafkaConsumer, Listener]:
        listener = Listener()
        c = KafkaConsumer(bootstrap_servers=root, group_id="g", auto_offset_reset="earliest",
                          enable_auto_commit=False, session_timeout_ms=3000,
                          heartbeat_interval_ms=200, partition_assignment_strategy=["range"])
        c.subscribe([TOPIC], listener=listener)
        return c, listener

    a, a_listener = member()
    b, b_listener = member()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        a.poll(timeout_ms=50, update_offsets=False)
        b.poll(timeout_ms=50, update_offsets=False)
        if {len(a.assignment()), len(b.assignment())} == {1, 2}:
            break
    # range over 3 partitions and 2 members: 2 + 1, each partition owned once
    assert {len(a.assignment()), len(b.assignment())} == {1, 2}, (a.assignment(),
                                                                    b.assignment())
    assert a.assignment() | b.assignment() == set(all_partitions())
    assert a_listener.assigned[-1] == sorted(a.assignment())
    meta = a.group_metadata()
    assert meta.group_id == "g" and meta.generation_id >= 1 and meta.member_id
    for tp in a.assignment():
        a.seek_to_end(tp)
    a.commit()
    assert Log(root).committed("g") == {(tp.topic, tp.partition): 2 for tp in a.assignment()}
    b.close()
    a.close()


def test_an_unknown_assignment_strategy_is_named(root) -> None:
    fill(root, per_partition=1)
    c = consumer(root, group_id="g", partition_assignment_strategy=["sticky-ish"])
    with pytest.raises(errors.KafkaError, match="sticky-ish"):
        c.subscribe([TOPIC])
    c.close()


def test_offset_out_of_range_is_catchable_by_both_names(root) -> None:
    fill(root, per_partition=2)
    c = consumer(root, auto_offset_reset="none", group_id="none", enable_auto_commit=False)
    tp = TopicPartition(TOPIC, 0)
    c.assign([tp])
    c.seek(tp, 50)
    with pytest.raises(errors.OffsetOutOfRangeError) as caught:
        c.poll(timeout_ms=0)
    assert isinstance(caught.value, txlog.OffsetOutOfRangeError)
    assert isinstance(caught.value.__cause__, txlog.OffsetOutOfRangeError)


def test_an_object_store_root_with_storage_options(s3_server, s3_root) -> None:
    """bootstrap_servers is an s3:// URL; storage_options carries the endpoint."""
    options = s3_server.storage_options
    Log(s3_root, storage_options=options).create_topic(TOPIC, partitions=2)
    with KafkaProducer(bootstrap_servers=s3_root, storage_options=options) as p:
        for i in range(4):
            p.send(TOPIC, b"%d" % i, partition=i % 2)
    c = KafkaConsumer(bootstrap_servers=s3_root, storage_options=options, group_id="s3",
                      auto_offset_reset="earliest", enable_auto_commit=False)
    c.assign([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])
    assert sorted(r.value for r in drain(c)) == [b"0", b"1", b"2", b"3"]
    s3_server.reset_counts()
    assert c.poll(timeout_ms=0) == {}
    idle = sum(s3_server.counts.values())
    assert idle <= 4, dict(s3_server.counts)  # an idle poll: two requests per partition
    c.commit()
    assert Log(s3_root, storage_options=options).committed("s3") == {(TOPIC, 0): 2, (TOPIC, 1): 2}


# --- ported programs ----------------------------------------------------------------------

KAFKA_PRODUCER_PROGRAM = '''
import json
import sys

from kafka import KafkaProducer
from kafka.errors import KafkaError

producer = KafkaProducer(
    bootstrap_servers="localhost:9092",
    key_serializer=lambda key: key.encode("utf-8"),
    value_serializer=lambda value: json.dumps(value).encode("utf-8"),
    linger_ms=10,
)
futures = []
for i in range(int(sys.argv[1])):
    order = {"order_id": i, "amount": i * 10}
    futures.append(producer.send("orders", order, key=f"customer-{i % 4}",
                                 headers=[("source", b"web"), ("seq", str(i).encode())]))
producer.flush()
for future in futures:
    try:
        metadata = future.get(timeout=10)
    except KafkaError as exc:
        print("FAILED", exc)
        sys.exit(1)
    print("sent", metadata.topic, metadata.partition, metadata.offset,
          metadata.serialized_key_size)
producer.close()
'''

KAFKA_CONSUMER_PROGRAM = '''
import json
import sys

from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition

consumer = KafkaConsumer(
    bootstrap_servers="localhost:9092",
    group_id="billing",
    enable_auto_commit=False,
    auto_offset_reset="earliest",
    key_deserializer=lambda key: key.decode("utf-8"),
    value_deserializer=lambda value: json.loads(value.decode("utf-8")),
)
partitions = [TopicPartition("orders", p) for p in sorted(consumer.partitions_for_topic("orders"))]
consumer.assign(partitions)
limit = int(sys.argv[1])
handled = 0
while handled < limit:
    batch = consumer.poll(timeout_ms=1000, max_records=3)
    if not batch:
        break
    for tp, records in batch.items():
        for record in records:
            headers = dict(record.headers)
            print("got", record.partition, record.offset, record.key, record.value["order_id"],
                  headers["source"].decode())
            handled += 1
        consumer.commit({tp: OffsetAndMetadata(records[-1].offset + 1, "", -1)})
for tp in partitions:
    print("committed", tp.partition, consumer.committed(tp), consumer.position(tp))
consumer.close()
'''


KAFKA_GROUP_CONSUMER_PROGRAM = '''
import sys

from kafka import KafkaConsumer

consumer = KafkaConsumer(
    "orders",
    bootstrap_servers="localhost:9092",
    group_id="shipping",
    enable_auto_commit=False,
    auto_offset_reset="earliest",
    consumer_timeout_ms=3000,
    value_deserializer=lambda value: value.decode("utf-8"),
)
limit = int(sys.argv[1])
handled = 0
for record in consumer:
    print("got", record.partition, record.offset, record.value)
    handled += 1
    if handled % 5 == 0 or handled == limit:
        consumer.commit()
    if handled == limit:
        break
consumer.commit()
print("assigned", sorted(tp.partition for tp in consumer.assignment()))
consumer.close()
'''


def port(program: str, root: str) -> str:
    """What the issue allows a port to change: the imports and bootstrap_servers."""
    ported = program.replace("from kafka import", "from txlog.kafka import") \
        .replace("from kafka.errors import", "from txlog.kafka.errors import") \
        .replace('"localhost:9092"', repr(root))
    changed = [line for line in difflib.ndiff(program.splitlines(), ported.splitlines())
               if line.startswith("+ ")]
    assert changed and all("import" in line or "bootstrap_servers" in line for line in changed)
    return ported


def test_ported_producer_and_assign_consumer_programs_run_unchanged(tmp_path) -> None:
    root = str(tmp_path / "log")
    Log(root).create_topic("orders", partitions=3)
    programs = {}
    for name, source in (("producer.py", KAFKA_PRODUCER_PROGRAM),
                         ("consumer.py", KAFKA_CONSUMER_PROGRAM)):
        programs[name] = tmp_path / name
        programs[name].write_text(port(source, root))
    env = {"JAVA_HOME": os.environ.get("JAVA_HOME", "")}  # no Spark here: skip finding Java
    sent = run_python([str(programs["producer.py"]), "20"], env=env, timeout=120).stdout
    sent_rows = [line.split() for line in sent.splitlines()]
    assert len(sent_rows) == 20 and all(r[0] == "sent" and r[1] == "orders" for r in sent_rows)
    from kafka.partitioner.default import murmur2

    for i, row in enumerate(sent_rows):  # where kafka-python's partitioner would put it
        assert int(row[2]) == (murmur2(f"customer-{i % 4}".encode()) & 0x7FFFFFFF) % 3
        assert row[4] == str(len(f"customer-{i % 4}"))
    sent_at = {(int(r[2]), int(r[3])): i for i, r in enumerate(sent_rows)}
    assert len(sent_at) == 20

    first = run_python([str(programs["consumer.py"]), "7"], env=env, timeout=120).stdout
    second = run_python([str(programs["consumer.py"]), "100"], env=env, timeout=120).stdout
    got = [line.split() for line in (first + second).splitlines() if line.startswith("got")]
    # every record once: the second run resumes from what the first committed
    assert sorted((int(g[1]), int(g[2])) for g in got) == sorted(sent_at)
    for g in got:
        i = sent_at[(int(g[1]), int(g[2]))]
        assert (g[3], int(g[4]), g[5]) == (f"customer-{i % 4}", i, "web")
    per_partition: dict[int, list[int]] = {}
    for g in got:
        per_partition.setdefault(int(g[1]), []).append(int(g[2]))
    assert all(offsets == sorted(offsets) for offsets in per_partition.values())
    ends = {p: 1 + max(o for (q, o) in sent_at if q == p) for p, _ in sent_at}
    final = [line.split() for line in second.splitlines() if line.startswith("committed")]
    assert {int(c[1]): (c[2], c[3]) for c in final} == \
        {p: (str(ends[p]), str(ends[p])) if p in ends else ("None", "0") for p in range(3)}
    assert Log(root).committed("billing") == {("orders", p): e for p, e in ends.items()}


def test_ported_group_consumer_with_manual_commits_resumes_from_its_commits(tmp_path) -> None:
    root = str(tmp_path / "log")
    log = Log(root)
    log.create_topic("orders", partitions=3)
    with Producer(log) as producer:
        for i in range(30):
            producer.send("orders", value=f"order-{i}".encode(), partition=i % 3)
    program = tmp_path / "group_consumer.py"
    program.write_text(port(KAFKA_GROUP_CONSUMER_PROGRAM, root))
    env = {"JAVA_HOME": os.environ.get("JAVA_HOME", "")}
    first = run_python([str(program), "12"], env=env, timeout=120).stdout
    second = run_python([str(program), "100"], env=env, timeout=120).stdout
    for out in (first, second):  # the only member of its group owns every partition
        assert "assigned [0, 1, 2]" in out, out
    got = [line.split() for line in (first + second).splitlines() if line.startswith("got")]
    # the first run stopped after 12 and committed them: the second starts right there
    assert sorted((int(g[1]), int(g[2])) for g in got) == \
        sorted((p, o) for p in range(3) for o in range(10))
    assert all(g[3] == f"order-{int(g[2]) * 3 + int(g[1])}" for g in got)
    assert log.committed("shipping") == {("orders", p): 10 for p in range(3)}
