"""Topic auto-creation (issue 34, item 2): the root's ``auto.create.topics.enable`` and
``num.partitions``, as a Kafka broker's, honoured by every client that writes or
subscribes, never by a read; and processes racing to create one topic end up with one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter

import pyarrow as pa
import pytest

from txlog import InvalidConfigError, Log, TopicExistsError, UnknownTopicError
from txlog.kafka import KafkaConsumer, KafkaProducer, TopicPartition
from txlog.kafka.errors import UnknownTopicOrPartitionError
from txlog.root.root_config import RootConfig
from txlog.storage.contract import Storage
from txlog.storage.paths import ROOT_CONFIG_DIR, topic_dir, topic_meta_path
from conftest import HARNESS_DIR, SRC
from helpers_core import DelegatingStorage

OFF = {"auto.create.topics.enable": False}


def test_a_root_without_settings_has_kafkas_defaults(memlog: Log) -> None:
    assert memlog.storage.list(ROOT_CONFIG_DIR) == []  # as every root made before them
    config = memlog.describe_root_config()
    assert config == RootConfig({})
    assert (config.auto_create, config.num_partitions) == (True, 1)


def test_a_send_creates_the_topic_with_the_roots_partition_count(memlog: Log) -> None:
    producer = memlog.producer()
    producer.send("first", b"a").get()
    assert memlog.describe_topic("first").partitions == 1
    memlog.alter_root_config({"num.partitions": 4})
    assert producer.partitions_for("second") == {0, 1, 2, 3}
    producer.send_table("third", pa.table({"value": [b"x", b"y"]}))
    assert memlog.topics() == ["first", "second", "third"]
    assert memlog.describe_topic("third").partitions == 4
    assert sum(memlog.end_offset("third", p) for p in range(4)) == 2


def test_reads_never_create(memlog: Log) -> None:
    for call in (lambda: memlog.describe_topic("nope"), lambda: memlog.read("nope", 0),
                 lambda: memlog.end_offset("nope", 0), lambda: memlog.partition("nope", 0),
                 lambda: memlog.consumer().assign([("nope", 0)])):
        with pytest.raises(UnknownTopicError, match="'nope' does not exist"):
            call()
    assert memlog.topics() == []


def test_turned_off_the_error_names_the_setting(memlog: Log) -> None:
    config = memlog.alter_root_config({"auto.create.topics.enable": "FALSE", "num.partitions": 2})
    assert config.config == {"auto.create.topics.enable": False, "num.partitions": 2}
    with pytest.raises(UnknownTopicError, match=(
            r"topic 'x' does not exist in memory://\w+ and auto.create.topics.enable is false "
            "on this root")):
        memlog.producer().send("x", b"v")
    assert memlog.topics() == []
    # Removed, the setting is Kafka's default again: on.
    assert memlog.alter_root_config(delete=["auto.create.topics.enable"]).config == {
        "num.partitions": 2}
    memlog.producer().send("x", b"v").get()
    assert memlog.describe_topic("x").partitions == 2


def test_a_producer_may_refuse_what_the_root_allows(memlog: Log) -> None:
    with pytest.raises(UnknownTopicError, match="allow_auto_create_topics is false"):
        memlog.producer(allow_auto_create_topics=False).send("x", b"v")
    assert memlog.topics() == []


def test_another_process_switching_it_off_is_seen_at_the_next_missing_topic(memlog) -> None:
    producer = memlog.producer()
    producer.send("a", b"v").get()
    Log(memlog.storage).alter_root_config(OFF)  # another process
    with pytest.raises(UnknownTopicError, match="auto.create.topics.enable is false"):
        producer.send("b", b"v")
    producer.send("a", b"w").get()  # existing topics are not affected


@pytest.mark.parametrize("set, delete, message", [
    ({"auto.create.topics.enable": "yes"}, (), "must be true or false, not 'yes'"),
    ({"auto.create.topics.enable": 1}, (), "must be true or false, not 1"),
    ({"num.partitions": 0}, (), "num.partitions must be an integer from 1 to 10000, not 0"),
    ({"num.partitions": True}, (), "not True"),
    ({"log.retention.ms": 5}, (), "unknown root config 'log.retention.ms'"),
    ({}, ("num.partitionz",), "unknown root config 'num.partitionz'"),
])
def test_bad_settings_are_refused_by_name(memlog: Log, set, delete, message) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        memlog.alter_root_config(set, delete)
    assert memlog.storage.list(ROOT_CONFIG_DIR) == []


def test_leftovers_of_an_unfinished_delete_are_not_taken_for_a_topic(memlog: Log) -> None:
    memlog.storage.publish_if_absent(f"{topic_dir('x')}/0/leftover", b"")
    with pytest.raises(TopicExistsError, match="unfinished delete"):
        memlog.producer().send("x", b"v")


class _AllSeeItMissing(DelegatingStorage):
    """Holds every creator after it found ``topic.json`` missing until all have: each then
    creates, and all but one lose the race."""

    def __init__(self, inner: Storage, barrier: threading.Barrier) -> None:
        super().__init__(inner)
        self.barrier = barrier

    def exists(self, path: str) -> bool:
        found = self.inner.exists(path)
        if path == topic_meta_path("t"):
            self.barrier.wait(timeout=30)
        return found


def test_threads_creating_one_topic_at_once_all_get_it(memlog: Log) -> None:
    barrier = threading.Barrier(8)
    logs = [Log(_AllSeeItMissing(memlog.storage, barrier)) for _ in range(8)]
    ids: list[str] = []

    def create(log: Log) -> None:
        ids.append(log.services.ensure_topic("t").topic_id)
    threads = [threading.Thread(target=create, args=(log,)) for log in logs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 8 and set(ids) == {memlog.describe_topic("t").topic_id}


# --- txlog.kafka ----------------------------------------------------------------------------


def test_kafka_clients_create_as_kafka_does(memlog: Log) -> None:
    root = memlog.root
    with KafkaProducer(bootstrap_servers=root) as producer:
        producer.send("sent", b"v").get(timeout=10)
        assert producer.partitions_for("asked") == {0}
    KafkaConsumer("subscribed", bootstrap_servers=root).close()
    consumer = KafkaConsumer(bootstrap_servers=root)
    consumer.assign([TopicPartition("assigned", 0)])
    consumer.close()
    assert memlog.topics() == ["asked", "assigned", "sent", "subscribed"]


def test_kafka_clients_without_allow_auto_create_topics_never_create(memlog: Log) -> None:
    root, no = memlog.root, {"allow_auto_create_topics": False}
    with KafkaProducer(bootstrap_servers=root, **no) as producer:
        with pytest.raises(UnknownTopicOrPartitionError, match="allow_auto_create_topics"):
            producer.send("x", b"v")
    with pytest.raises(UnknownTopicOrPartitionError, match="allow_auto_create_topics"):
        KafkaConsumer("x", bootstrap_servers=root, **no)
    consumer = KafkaConsumer(bootstrap_servers=root, **no)
    with pytest.raises(UnknownTopicOrPartitionError, match="allow_auto_create_topics"):
        consumer.assign([TopicPartition("x", 0)])
    # A group's member waits for its topic, as a Kafka member does.
    member = KafkaConsumer("x", bootstrap_servers=root, group_id="g", **no)
    assert member.subscription() == {"x"}
    member.close()
    memlog.alter_root_config(OFF)
    with pytest.raises(UnknownTopicOrPartitionError, match="auto.create.topics.enable"):
        KafkaConsumer("x", bootstrap_servers=root)
    assert memlog.topics() == []


# --- processes ------------------------------------------------------------------------------


def test_eight_processes_producing_to_one_new_topic_leave_one_topic(tmp_path) -> None:
    """The acceptance criterion: every process finds the topic missing at the same moment
    and creates it; one creation wins, the others use it, and no record is lost."""
    root, count = str(tmp_path / "root"), 300
    Log(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SRC), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
    procs = [subprocess.Popen(
        [sys.executable, str(HARNESS_DIR / "auto_create_producer.py"), root, "new", f"p{i}",
         str(count), "native" if i % 2 else "kafka"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) for i in range(8)]
    try:
        for proc in procs:  # every one has opened the root and made its producer
            assert proc.stdout.readline() == "READY\n"
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert [p.returncode for p in procs] == [0] * 8
    assert outputs == [f"SENT {count}\n"] * 8
    log = Log(root)
    assert log.topics() == ["new"]
    assert log.describe_topic("new").partitions == 1  # the root's num.partitions default
    values = log.read("new", 0).column("value").to_pylist()
    per_producer = Counter(v.decode().split("-")[0] for v in values)
    assert per_producer == {f"p{i}": count for i in range(8)}
    assert len(set(values)) == len(values) == 8 * count
