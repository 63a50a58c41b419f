"""Topic administration and the validation of everything a user names or configures.

Topic names become directory names, so a bad one must never reach storage;
errors must say what was wrong so the user can fix the call.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from txlog import (InvalidConfigError, InvalidNameError, Log, LogFormatError, TopicExistsError,
                   UnknownPartitionError, UnknownTopicError)
from txlog.root.topics import MAX_PARTITIONS


def test_create_describe_list_delete(log: Log) -> None:
    assert log.topics() == []
    desc = log.create_topic("orders", 3, {"message.timestamp.type": "LogAppendTime",
                                          "max.message.bytes": 4096})
    log.create_topic("a.b_c-D9", 1)
    assert (desc.name, desc.partitions) == ("orders", 3)
    assert log.topics() == ["a.b_c-D9", "orders"]

    # Another process (a fresh Log) sees the same description.
    other = Log(log.root)
    described = other.describe_topic("orders")
    assert (described.name, described.partitions, described.config) == (
        "orders", 3, {"message.timestamp.type": "LogAppendTime", "max.message.bytes": 4096})
    assert described.created_ms == desc.created_ms
    producer = log.producer()
    assert producer.partitions_for("orders") == {0, 1, 2}
    producer.send("orders", b"x", partition=2).get()
    assert other.end_offset("orders", 2) == 1

    log.delete_topic("orders")
    assert log.topics() == ["a.b_c-D9"]
    with pytest.raises(UnknownTopicError, match="orders"):
        log.describe_topic("orders")
    assert not (Path(log.root) / "topics" / "orders").exists()
    # The name can be reused; the new topic starts empty with its own settings.
    log.create_topic("orders", 1)
    assert log.describe_topic("orders").partitions == 1
    assert log.end_offset("orders", 0) == 0
    assert log.read("orders", 0).num_rows == 0


def test_duplicate_create_is_refused(memlog: Log) -> None:
    memlog.create_topic("t", 2)
    with pytest.raises(TopicExistsError, match="'t' already exists"):
        memlog.create_topic("t", 2)
    with pytest.raises(TopicExistsError):
        Log(memlog.root).create_topic("t", 5)  # from another Log on the same root too
    assert memlog.describe_topic("t").partitions == 2


@pytest.mark.parametrize("name,problem", [
    ("", "empty"),
    (".", "not allowed"),
    ("..", "not allowed"),
    ("a/b", "illegal characters '/'"),
    ("../escape", "illegal characters '/'"),
    ("x" * 250, "250 characters; at most 249"),
    ("caf\u00e9", "illegal characters '\u00e9'"),
    ("\u65e5\u672c", "illegal characters"),
    ("with space", "illegal characters ' '"),
    ("tab\t", "illegal characters"),
    (None, "must be a string"),
])
def test_invalid_topic_names(memlog: Log, name: object, problem: str) -> None:
    for call in (lambda: memlog.create_topic(name, 1),  # type: ignore[arg-type]
                 lambda: memlog.describe_topic(name)):  # type: ignore[arg-type]
        with pytest.raises(InvalidNameError) as info:
            call()
        assert problem in str(info.value) and "topic name" in str(info.value)
    assert memlog.storage.list("topics") == []


def test_longest_legal_name_works(log: Log) -> None:
    name = "x" * 249
    log.create_topic(name, 1)
    log.producer().send(name, b"v", partition=0).get()
    assert log.read(name, 0).column("value").to_pylist() == [b"v"]


@pytest.mark.parametrize("partitions", [0, -1, MAX_PARTITIONS + 1, 1.5, "3", True, None])
def test_bad_partition_counts(memlog: Log, partitions: object) -> None:
    with pytest.raises(InvalidConfigError, match="partitions must be an integer") as info:
        memlog.create_topic("t", partitions)  # type: ignore[arg-type]
    assert repr(partitions) in str(info.value)
    assert memlog.topics() == []


@pytest.mark.parametrize("config,option", [
    ({"retention.mins": 1000}, "'retention.mins'"),
    ({"retention.ms": -2}, "retention.ms must be an integer of at least -1"),
    ({"retention.bytes": 1.5}, "retention.bytes"),
    ({"segment.bytes": 10}, "segment.bytes must be an integer of at least 1024"),
    ({"message.timestamp.type": "WallClock"}, "message.timestamp.type"),
    ({"max.message.bytes": 0}, "max.message.bytes"),
    ({"max.message.bytes": "big"}, "max.message.bytes"),
])
def test_bad_topic_config(memlog: Log, config: dict, option: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        memlog.create_topic("t", 1, config)
    assert option in str(info.value)
    assert memlog.topics() == []


def test_max_message_bytes_is_enforced(memlog: Log) -> None:
    memlog.create_topic("small", 1, {"max.message.bytes": 2000})
    producer = memlog.producer()
    assert producer.send("small", b"x" * 100, partition=0).get().offset == 0
    # Random bytes: the limit is on the batch as stored, which zstd (the default) would
    # shrink well under it for a repeated byte.
    future = producer.send("small", random.Random(5).randbytes(5000), partition=0)
    with pytest.raises(InvalidConfigError, match="max.message.bytes=2000"):
        future.get()
    assert memlog.end_offset("small", 0) == 1


def test_unknown_topics_and_partitions(memlog: Log) -> None:
    memlog.create_topic("t", 2)
    memlog.alter_root_config({"auto.create.topics.enable": False})  # a send would create it
    for call in (lambda: memlog.describe_topic("nope"), lambda: memlog.read("nope", 0),
                 lambda: memlog.end_offset("nope", 0), lambda: memlog.delete_topic("nope"),
                 lambda: memlog.producer().send("nope", b"v"),
                 lambda: memlog.consumer().assign([("nope", 0)])):
        with pytest.raises(UnknownTopicError, match="'nope' does not exist"):
            call()
    for bad in (2, -1):
        with pytest.raises(UnknownPartitionError, match="partitions 0 to 1"):
            memlog.read("t", bad)
        with pytest.raises(InvalidConfigError, match="partitions 0 to 1"):
            memlog.producer().send("t", b"v", partition=bad)


def test_opening_without_create(tmp_path: Path) -> None:
    with pytest.raises(LogFormatError, match="holds no txlog"):
        Log(tmp_path / "empty", create=False)
    Log(tmp_path / "made")
    assert Log(tmp_path / "made", create=False).topics() == []


def test_producer_ids_are_unique_within_a_process(memlog: Log) -> None:
    """Several allocators on one root (one per Log) never hand out the same id."""
    allocators = [Log(memlog.root).producer_ids for _ in range(3)]
    ids = [a.next_id() for _ in range(1200) for a in allocators]
    assert len(set(ids)) == len(ids)


def test_temp_file_prefix_is_not_a_legal_name(log: Log) -> None:
    """Listings hide '.tmp-' names, so a topic or id named like that would vanish."""
    from txlog import InvalidNameError

    with pytest.raises(InvalidNameError, match="reserved"):
        log.create_topic(".tmp-x", 1)
    with pytest.raises(InvalidNameError, match="reserved"):
        log.producer(transactional_id=".tmp-y")


def test_open_without_create_leaves_no_directory(tmp_path) -> None:
    from txlog import LogFormatError

    missing = tmp_path / "typo"
    with pytest.raises(LogFormatError, match="holds no txlog"):
        Log(missing, create=False)
    assert not missing.exists()


def test_stale_writer_after_delete_and_recreate_elsewhere(tmp_path) -> None:
    """A process whose cached state predates a delete + re-create must not write at its
    old end offset: that would leave the new topic with a gap (or an overlap)."""
    from helpers_core import read_chain

    root = tmp_path / "log"
    writer_log = Log(root)
    writer_log.create_topic("t", 1)
    stale = writer_log.producer(linger_ms=0)
    for i in range(3):
        stale.send("t", f"old{i}".encode(), partition=0).get()

    admin = Log(root)
    admin.delete_topic("t")
    admin.create_topic("t", 1)
    admin.producer(linger_ms=0).send("t", b"new0-longer-batch", partition=0).get()

    # The stale process learns that its topic is another incarnation now (KIP-516):
    # a clear error, nothing written.
    from txlog import InconsistentTopicIdError

    with pytest.raises(InconsistentTopicIdError, match="deleted and re-created"):
        stale.send("t", b"from-stale-producer", partition=0)
    assert [batch.header.base_offset for batch in read_chain(root, "t", 0)] == [0]
    # Its sequences of the old topic are dropped; it goes on in the new one.
    assert stale.send("t", b"stale-goes-on", partition=0).get().offset == 1
    # A new producer in the same (stale) process appends right after.
    meta = writer_log.producer(linger_ms=0).send("t", b"fresh", partition=0).get()
    assert meta.offset == 2
    chain = read_chain(root, "t", 0)
    assert [batch.header.base_offset for batch in chain] == [0, 1, 2]
    assert Log(root).read("t", 0).column("value").to_pylist() == [
        b"new0-longer-batch", b"stale-goes-on", b"fresh"]


def test_stale_writer_after_delete_gets_a_clear_error(tmp_path) -> None:
    from txlog import UnknownTopicError

    root = tmp_path / "log"
    writer_log = Log(root)
    writer_log.create_topic("t", 1)
    stale = writer_log.producer(linger_ms=0)
    stale.send("t", b"x", partition=0).get()
    Log(root).delete_topic("t")
    with pytest.raises(UnknownTopicError, match="deleted by another process"):
        stale.send("t", b"y", partition=0)
    assert not (root / "topics" / "t").exists()


def test_partitions_added_are_seen_by_processes_that_look_again(tmp_path: Path) -> None:
    root = tmp_path / "log"
    admin, other = Log(root), Log(root)
    admin.create_topic("t", 2)
    producer = other.producer()
    producer.send("t", b"old", partition=1).get()
    assert other.describe_topic("t").partitions == 2

    assert admin.create_partitions("t", 5).partitions == 5
    # A cached description does not change by itself (as a Kafka client's metadata)...
    assert other.describe_topic("t").partitions == 2
    # ...but asking for a new partition, or refreshing, finds the added ones.
    producer.send("t", b"new", partition=4).get()
    assert other.describe_topic("t", refresh=True).partitions == 5
    assert Log(root).describe_topic("t").partitions == 5
    assert Log(root).read("t", 1).column("value").to_pylist() == [b"old"]
    assert Log(root).end_offset("t", 4) == 1


def test_partitions_can_only_be_added(memlog: Log) -> None:
    memlog.create_topic("t", 3)
    for bad in (3, 2, 0, MAX_PARTITIONS + 1, "4", True):
        with pytest.raises(InvalidConfigError, match="topic 't' has 3 partitions"):
            memlog.create_partitions("t", bad)
    with pytest.raises(UnknownTopicError, match="'nope'"):
        memlog.create_partitions("nope", 4)
    stale = Log(memlog.storage)
    stale.describe_topic("t")
    memlog.create_partitions("t", 4)
    with pytest.raises(InvalidConfigError, match="has 4 partitions"):
        stale.create_partitions("t", 4)  # decided against the latest count, not its cache


def test_a_recreated_topic_does_not_inherit_added_partitions(tmp_path: Path) -> None:
    root = tmp_path / "log"
    log = Log(root)
    log.create_topic("t", 1)
    log.create_partitions("t", 3)
    log.delete_topic("t")
    log.create_topic("t", 2)
    assert log.describe_topic("t").partitions == 2
    assert Log(root).describe_topic("t", refresh=True).partitions == 2
    with pytest.raises(UnknownPartitionError):
        log.partition("t", 2)
