"""txlog.kafka.KafkaAdminClient against kafka-python 3.0's, on a real root.

kafka-python is the oracle for names, signatures and configuration keys;
each method is then run on a fresh root and its result checked for shape
and for truth against what the core (and the CLI) see.
"""

from __future__ import annotations

import inspect
import uuid

import pytest

from txlog import Log, clock
from txlog.kafka import (ConfigResource, ConfigResourceType, KafkaAdminClient, KafkaConsumer,
                         KafkaProducer, NewPartitions, NewTopic, OffsetAndMetadata, OffsetSpec,
                         OffsetTimestamp, TopicPartition, errors)
from txlog.kafka import admin_types
from txlog.kafka.admin import REFUSED_METHODS
from txlog.kafka.admin_types import AlterConfigOp, GroupInformation, TransactionState
from txlog.kafka.config import ADMIN_CONFIG

kafka = pytest.importorskip("kafka", reason="kafka-python is the oracle: pip install -e '.[test]'")


@pytest.fixture
def root(tmp_path) -> str:
    return str(tmp_path / "log")


@pytest.fixture
def admin(root) -> KafkaAdminClient:
    with KafkaAdminClient(bootstrap_servers=root) as client:
        yield client


def produce(root: str, topic: str, n: int, partition: int = 0) -> None:
    with KafkaProducer(bootstrap_servers=root) as p:
        for i in range(n):
            p.send(topic, f"v{i}".encode(), partition=partition)
        p.flush()


# --- names, signatures, configuration keys: kafka-python is the oracle ----------------------


def test_every_method_of_kafka_pythons_admin_client_is_here_with_its_parameters() -> None:
    theirs = kafka.KafkaAdminClient
    names = [n for n, f in vars(theirs).items() if callable(f) and not n.startswith("_")]
    names += [n for base in theirs.__mro__[1:] for n, f in vars(base).items()
              if callable(f) and not n.startswith("_")]
    for name in sorted(set(names)):
        mine = getattr(KafkaAdminClient, name)
        if name in REFUSED_METHODS:
            continue
        original = getattr(theirs, name)
        assert [(p.name, p.kind, p.default) for p in
                inspect.signature(mine).parameters.values()] == \
            [(p.name, p.kind, p.default) for p in
             inspect.signature(original).parameters.values()], name


def test_the_admin_keys_are_kafka_pythons_and_storage_options() -> None:
    assert set(ADMIN_CONFIG) == set(kafka.KafkaAdminClient.DEFAULT_CONFIG) | {"storage_options"}
    with pytest.raises(errors.KafkaConfigurationError, match="allow_auto_create_topics"):
        KafkaAdminClient(bootstrap_servers="memory://x", allow_auto_create_topics=False)
    with pytest.raises(errors.KafkaConfigurationError, match="sasl_mechanism"):
        KafkaAdminClient(bootstrap_servers="memory://x", sasl_mechanism="PLAIN")


def test_value_types_have_kafka_pythons_fields_and_values() -> None:
    from kafka.admin import _transactions as kt
    assert {m.name: m.value for m in ConfigResourceType} == \
        {m.name: m.value for m in kafka.admin.ConfigResourceType}
    assert {m.name: m.value for m in OffsetSpec} == {m.name: m.value for m in kafka.OffsetSpec}
    assert {m.name: m.value for m in AlterConfigOp} == \
        {m.name: m.value for m in kafka.admin.AlterConfigOp}
    assert {m.name: m.value for m in TransactionState} == \
        {m.name: m.value for m in kt.TransactionState}
    for name in ("TransactionListing", "TransactionDescription", "ProducerState"):
        assert getattr(admin_types, name)._fields == getattr(kt, name)._fields, name
    for cls in (NewTopic, NewPartitions, ConfigResource):
        theirs = getattr(kafka.admin, cls.__name__)
        assert [(p.name, p.default) for p in inspect.signature(cls).parameters.values()] == \
            [(p.name, p.default) for p in inspect.signature(theirs).parameters.values()]


@pytest.mark.parametrize("name", sorted(REFUSED_METHODS))
def test_a_refused_method_says_why(admin, name) -> None:
    with pytest.raises(errors.UnsupportedVersionError, match=name):
        getattr(admin, name)()


def test_a_broker_address_names_no_root() -> None:
    with pytest.raises(errors.KafkaConfigurationError, match="broker"):
        KafkaAdminClient(bootstrap_servers=["a:1", "b:2"])


# --- topics ---------------------------------------------------------------------------------


def test_create_then_describe_in_all_three_forms(admin, root) -> None:
    made = admin.create_topics({"a": {"num_partitions": 3, "replication_factor": 3,
                                      "configs": {"retention.ms": "60000"}}})
    assert [(t["name"], t["error_code"], t["num_partitions"], t["replication_factor"])
            for t in made["topics"]] == [("a", 0, 3, 3)]
    assert made["topics"][0]["configs"]["retention.ms"]["value"] == "60000"
    admin.create_topics(["b"])  # Kafka's default partition count: 1
    admin.create_topics([NewTopic("c", 2, 1, topic_configs={"segment.bytes": 4096})])
    assert admin.list_topics() == ["a", "b", "c"] == Log(root).topics()
    described = {t["name"]: t for t in admin.describe_topics()}
    assert {n: len(t["partitions"]) for n, t in described.items()} == {"a": 3, "b": 1, "c": 2}
    assert described["a"]["topic_id"].hex == Log(root).describe_topic("a").topic_id
    assert Log(root).describe_topic("a").config == {"retention.ms": 60000}
    assert [p["leader_id"] for p in described["a"]["partitions"]] == [0, 0, 0]
    assert admin.describe_topics([described["c"]["topic_id"]])[0]["name"] == "c"
    assert admin.describe_topics(["nope"])[0]["error_code"] == 3


def test_a_duplicate_create_fails_for_that_topic_only(admin) -> None:
    admin.create_topics(["t"])
    result = admin.create_topics(["t", "u"], raise_errors=False)
    assert [(t["name"], t["error_code"]) for t in result["topics"]] == [("t", 36), ("u", 0)]
    with pytest.raises(errors.TopicAlreadyExistsError, match="'t'"):
        admin.create_topics(["t"])
    assert admin.list_topics() == ["t", "u"]


def test_validate_only_creates_nothing_and_refusals_are_named(admin) -> None:
    assert admin.create_topics(["v"], validate_only=True)["topics"][0]["error_code"] == 0
    assert admin.list_topics() == []
    assigned = admin.create_topics([NewTopic("w", replica_assignments={0: [1, 2]})],
                                   raise_errors=False)["topics"][0]
    assert assigned["error_code"] == errors.InvalidRequestError.errno
    assert "replica assignments" in assigned["error_message"]
    unreplicated = admin.create_topics({"y": {"replication_factor": 0}}, raise_errors=False)
    assert unreplicated["topics"][0]["error_code"] == errors.InvalidReplicationFactorError.errno
    bad = admin.create_topics({"x": {"num_partitions": 0}}, raise_errors=False)["topics"][0]
    assert bad["error_code"] == 40 and "partitions" in bad["error_message"]
    assert admin.list_topics() == []


def test_create_partitions_and_delete_topics(admin, root) -> None:
    admin.create_topics(["t", "u"])
    response = admin.create_partitions({"t": 3, "u": NewPartitions(2)})
    assert [(r.name, r.error_code) for r in response.results] == [("t", 0), ("u", 0)]
    assert Log(root).describe_topic("t", refresh=True).partitions == 3
    with pytest.raises(errors.InvalidPartitionsError, match="only be added"):
        admin.create_partitions({"t": 2})
    assert admin.create_partitions({"t": 5}, validate_only=True).results[0].error_code == 0
    assert Log(root).describe_topic("t", refresh=True).partitions == 3
    result = admin.delete_topics(["t", "gone"], raise_errors=False)
    assert [(t["name"], t["error_code"]) for t in result["topics"]] == [("t", 0), ("gone", 3)]
    assert admin.list_topics() == ["u"]


# --- configs --------------------------------------------------------------------------------


def test_describe_and_alter_topic_configs(admin, root) -> None:
    admin.create_topics({"t": {"num_partitions": 1, "configs": {"retention.ms": 1000}}})
    resource = ConfigResource(ConfigResourceType.TOPIC, "t")
    modified = admin.describe_configs([resource])["topic"]["t"]
    assert list(modified) == ["retention.ms"]
    assert modified["retention.ms"]["value"] == "1000"
    assert modified["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    everything = admin.describe_configs([resource], config_filter="all")["topic"]["t"]
    assert everything["segment.bytes"]["config_source"] == "DEFAULT_CONFIG"
    changed = ConfigResource("TOPIC", "t", {"retention.bytes": "2048",
                                            "retention.ms": (AlterConfigOp.DELETE, None)})
    assert admin.alter_configs([changed]) == {"topic": {"t": "OK"}}
    assert Log(root).describe_topic("t").config == {"retention.bytes": 2048}
    with pytest.raises(ValueError, match="max.message.bytes"):
        admin.alter_configs([ConfigResource("TOPIC", "t", {"max.message.bytes": 1})])
    bad = admin.alter_configs([ConfigResource("TOPIC", "t", {"segment.bytes": 1})])
    assert "segment.bytes" in bad["topic"]["t"]
    with pytest.raises(errors.InvalidRequestError, match="BROKER"):
        admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "0")])


# --- records and offsets ----------------------------------------------------------------------


def test_delete_records_moves_the_log_start(admin, root) -> None:
    admin.create_topics(["t"])
    produce(root, "t", 10)
    tp = TopicPartition("t", 0)
    assert admin.delete_records({tp: 4}) == {tp: {"partition_index": 0, "low_watermark": 4,
                                                  "error_code": 0}}
    assert Log(root).partition("t", 0).log_start() == 4
    offsets = admin.list_partition_offsets({tp: OffsetSpec.EARLIEST})
    assert offsets[tp].offset == 4
    assert admin.list_partition_offsets({tp: OffsetSpec.LATEST})[tp].offset == 10
    assert admin.list_partition_offsets({tp: OffsetSpec.LATEST}, kafka.IsolationLevel(1)
                                        )[tp].offset == 10
    assert admin.list_partition_offsets({tp: OffsetTimestamp(0)})[tp].offset == 4
    with pytest.raises(errors.OffsetOutOfRangeError):
        admin.delete_records({tp: 11})


# --- groups -----------------------------------------------------------------------------------


def consume_and_commit(root: str, group: str, topic: str) -> None:
    c = KafkaConsumer(topic, bootstrap_servers=root, group_id=group,
                      auto_offset_reset="earliest", enable_auto_commit=False)
    got = 0
    while got < 6:
        got += sum(len(v) for v in c.poll(timeout_ms=2000).values())
    c.commit()
    c.close()


def test_groups_offsets_after_a_consumer_commits(admin, root) -> None:
    admin.create_topics(["t"])
    produce(root, "t", 6)
    consume_and_commit(root, "g", "t")
    tp = TopicPartition("t", 0)
    assert [(g["group_id"], g["protocol_type"]) for g in admin.list_groups()] == \
        [("g", "consumer")] == admin.list_consumer_groups()
    assert admin.list_groups(states_filter=["Empty"])[0]["group_state"] == "Empty"
    assert admin.list_groups(states_filter=["stable"]) == []
    assert admin.list_group_offsets("g") == {"g": {tp: OffsetAndMetadata(6, "", -1)}}
    assert admin.list_consumer_group_offsets("g") == {tp: OffsetAndMetadata(6, "", -1)}
    described = admin.describe_groups(["g", "nobody"])
    assert described["g"]["group_state"] == "Empty" and described["g"]["error"] is None
    assert described["nobody"]["group_state"] == "Dead"
    assert admin.describe_consumer_groups(["g"])[0] == \
        GroupInformation(0, "g", "Empty", "consumer", described["g"]["protocol_data"], [],
                         None)
    with pytest.raises(errors.GroupIdNotFoundError):
        admin.describe_consumer_groups(["nobody"])


def test_alter_reset_and_delete_group_offsets(admin, root) -> None:
    admin.create_topics(["t"])
    produce(root, "t", 6)
    tp, missing = TopicPartition("t", 0), TopicPartition("t", 7)
    assert admin.alter_group_offsets("g", {tp: OffsetAndMetadata(2, "", -1), missing: 1}) == \
        {tp: errors.NoError, missing: errors.UnknownTopicOrPartitionError}
    assert Log(root).committed("g") == {("t", 0): 2}
    assert admin.reset_group_offsets("g", {tp: OffsetSpec.LATEST}) == \
        {tp: {"error": errors.NoError, "offset": 6}}
    assert admin.reset_group_offsets("g", {tp: 99}) == {tp: {"error": errors.NoError,
                                                             "offset": 6}}
    assert admin.reset_group_offsets("g", {tp: OffsetTimestamp(0)})[tp]["offset"] == 0
    assert Log(root).committed("g") == {("t", 0): 0}
    with pytest.raises(errors.KafkaConfigurationError, match="metadata"):
        admin.alter_group_offsets("g", {tp: OffsetAndMetadata(1, "note", -1)})
    admin.create_partitions({"t": 2})
    other = TopicPartition("t", 1)
    admin.alter_group_offsets("g", {other: 0})
    assert admin.delete_group_offsets("g", [tp, missing]) == \
        {tp: errors.NoError, missing: errors.UnknownTopicOrPartitionError}
    assert Log(root).committed("g") == {("t", 1): 0}
    with pytest.raises(errors.GroupIdNotFoundError):
        admin.delete_group_offsets("nobody", [tp])
    assert admin.delete_groups(["g"]) == {"g": "OK"}
    assert Log(root).groups() == []
    assert admin.delete_consumer_groups(["g"]) == [("g", errors.GroupIdNotFoundError)]


def test_offsets_of_a_group_with_a_live_member_are_not_altered(admin, root) -> None:
    admin.create_topics(["t"])
    produce(root, "t", 6)
    member = KafkaConsumer("t", bootstrap_servers=root, group_id="live",
                           auto_offset_reset="earliest", enable_auto_commit=False)
    got = 0
    while got < 6:
        got += sum(len(v) for v in member.poll(timeout_ms=2000).values())
    member.commit()
    tp = TopicPartition("t", 0)
    assert admin.alter_group_offsets("live", {tp: 0}) == {tp: errors.NonEmptyGroupError}
    assert admin.describe_groups(["live"])["live"]["group_state"] == "Stable"
    assert admin.delete_groups(["live"]) == {"live": "NonEmptyGroupError"}
    with pytest.raises(errors.NonEmptyGroupError):
        admin.delete_group_offsets("live", [tp])
    member.close()
    assert Log(root).committed("live") == {("t", 0): 6}


# --- transactions -------------------------------------------------------------------------


def test_transactions_listed_described_and_a_hanging_one_found(admin, root, monkeypatch
                                                               ) -> None:
    admin.create_topics(["t"])
    p = KafkaProducer(bootstrap_servers=root, transactional_id="tx",
                      transaction_timeout_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"open", partition=0).get(timeout=10)  # then the producer "dies"
    [listing] = admin.list_transactions()[0]
    assert (listing.transactional_id, listing.state) == ("tx", TransactionState.ONGOING)
    assert admin.list_transactions(state_filters=["Empty"]) == {0: []}
    desc = admin.describe_transactions(["tx"])["tx"]
    assert desc.state is TransactionState.ONGOING
    assert desc.topic_partitions == {TopicPartition("t", 0)}
    assert desc.transaction_timeout_ms == 60_000 and desc.transaction_start_time_ms > 0
    with pytest.raises(errors.TransactionalIdNotFoundError):
        admin.describe_transactions(["nope"])
    assert admin.find_hanging_transactions() == []
    [producer] = admin.describe_producers([("t", 0)])[TopicPartition("t", 0)].active_producers
    assert producer.current_transaction_start_offset == 0
    later = clock.now_ms() + 61_000
    monkeypatch.setattr(clock, "now_ms", lambda: later)
    [hanging] = admin.find_hanging_transactions()
    assert hanging["transactional_id"] == "tx"
    assert hanging["topic_partitions"] == [TopicPartition("t", 0)]
    assert hanging["age_ms"] >= 61_000


def test_a_memory_root_and_uuid_named_topics() -> None:
    root = f"memory://{uuid.uuid4().hex}"
    with KafkaAdminClient(bootstrap_servers=root) as admin:
        admin.create_topics(["m"])
        topic_id = admin.describe_topics(["m"])[0]["topic_id"]
        assert admin.delete_topics([topic_id])["topics"][0]["error_code"] == 0
        assert admin.list_topics() == []
