"""Option parsing of format("txlog"): Spark's Kafka source rules, checked without Spark."""

from __future__ import annotations

import pickle

import pytest

from txlog.errors import InvalidConfigError
from txlog.spark.planning import PositionSpec, Subscription
from txlog.spark.options import (ReadOptions, WriteOptions, parse_bytes, parse_duration_ms)

BASE = {"path": "/data/log", "subscribe": "events"}


def batch(**extra: str) -> ReadOptions:
    return ReadOptions.parse({**BASE, **extra}, streaming=False)


def stream(**extra: str) -> ReadOptions:
    return ReadOptions.parse({**BASE, **extra}, streaming=True)


def fails(fn, options: dict, streaming: bool, *fragments: str) -> str:
    with pytest.raises(InvalidConfigError) as info:
        fn(options, streaming=streaming)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def read_fails(options: dict, streaming: bool, *fragments: str) -> str:
    return fails(ReadOptions.parse, options, streaming, *fragments)


def write_fails(options: dict, streaming: bool, *fragments: str) -> str:
    return fails(WriteOptions.parse, options, streaming, *fragments)


# --- path, subscription ---------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True])
def test_path_is_required(streaming):
    message = read_fails({"subscribe": "t"}, streaming, "path")
    assert message == ("missing option 'path' (the txlog root: a directory or URL; "
                       "kafka.bootstrap.servers may name it instead)")
    write_fails({"topic": "t", "transactional.id.prefix": "p"}, streaming, "'path'")


def test_empty_path_is_rejected():
    read_fails({**BASE, "path": "  "}, False, "option 'path'", "empty")


def test_subscribe_trims_and_drops_blanks():
    opts = batch(subscribe=" a , b,,c ,")
    assert opts.subscription == Subscription.subscribe(["a", "b", "c"])
    assert opts.path == "/data/log"


@pytest.mark.parametrize("value", ["", " , ,"])
def test_subscribe_without_topics(value):
    read_fails({"path": "/p", "subscribe": value}, False, "option 'subscribe'", "no topics")


def test_subscribe_invalid_topic_name():
    read_fails({"path": "/p", "subscribe": "ok,bad/name"}, False, "option 'subscribe'",
               "illegal characters")


def test_subscribe_pattern():
    opts = ReadOptions.parse({"path": "/p", "subscribePattern": "  ev.*  "}, streaming=False)
    assert opts.subscription == Subscription.subscribe_pattern("ev.*")


def test_subscribe_pattern_empty_and_invalid():
    read_fails({"path": "/p", "subscribePattern": " "}, False, "option 'subscribePattern'", "empty")
    read_fails({"path": "/p", "subscribePattern": "(unclosed"}, False,
               "option 'subscribePattern'", "regular expression")


def test_assign():
    opts = ReadOptions.parse({"path": "/p", "assign": ' {"a":[0,2],"b":[1]} '}, streaming=True)
    assert opts.subscription == Subscription.assign([("a", 0), ("a", 2), ("b", 1)])


@pytest.mark.parametrize("value, fragment", [
    ("a:0", "JSON"),
    ("{not json", "JSON object"),
    ('{"a":0}', "list of partition numbers"),
    ('{"a":[-1]}', "list of partition numbers"),
    ('{"a":["0"]}', "list of partition numbers"),
    ('{"a":[true]}', "list of partition numbers"),
    ('{"a":[]}', "no topic partitions"),
    ('{"a/b":[0]}', "illegal characters"),
])
def test_assign_errors(value, fragment):
    read_fails({"path": "/p", "assign": value}, False, "option 'assign'", fragment)


def test_exactly_one_strategy():
    read_fails({"path": "/p"}, False, "subscribe, subscribePattern, assign", "must be given")
    message = read_fails({"path": "/p", "subscribe": "a", "SubscribePattern": "a.*"}, False,
                         "only one of")
    assert "SubscribePattern" in message  # named as the user spelled it


def test_option_names_are_case_insensitive():
    opts = ReadOptions.parse({"PATH": "/p", "SUBSCRIBE": "t", "STARTINGOFFSETS": "Earliest",
                              "includeheaders": "TRUE"}, streaming=False)
    assert opts.path == "/p" and opts.include_headers and opts.starting.kind == "earliest"


def test_topic_ids_pin_a_batch_reads_topics():
    assert batch(topicIds='{"events": "ab12"}').topic_ids == (("events", "ab12"),)
    assert batch().topic_ids == ()
    read_fails({**BASE, "topicIds": '["ab12"]'}, False, "option 'topicIds'", "JSON object")
    read_fails({**BASE, "topicIds": '{"events": 12}'}, False, "option 'topicIds'",
               "topic 'events' must map to its topic id as a string")
    read_fails({**BASE, "topicIds": '{"a/b": "ab12"}'}, False, "option 'topicIds'",
               "illegal characters")
    read_fails({**BASE, "topicIds": '{"events": "ab12"}'}, True, "option 'topicIds'",
               "streaming query does not take it")


# --- defaults ---------------------------------------------------------------


def test_batch_defaults():
    opts = batch()
    assert opts.starting == PositionSpec("earliest", default="earliest", if_none="error")
    assert opts.ending == PositionSpec("latest", default="latest", if_none="latest")
    assert opts.fail_on_data_loss is True
    assert opts.include_headers is False
    assert opts.isolation_level == "read_committed"
    assert opts.min_partitions is None and opts.max_records_per_partition is None
    assert opts.max_offsets_per_trigger is None and opts.max_trigger_delay_ms is None


def test_streaming_defaults():
    opts = stream()
    assert opts.starting.kind == "latest"
    assert opts.ending is None
    assert opts.max_trigger_delay_ms == 15 * 60_000
    assert opts.max_offsets_per_trigger is None and opts.min_offsets_per_trigger is None
    assert opts.max_bytes_per_trigger is None


def test_read_options_are_frozen_and_pickle():
    opts = stream(startingOffsets='{"events":{"0":5}}', maxOffsetsPerTrigger="10")
    assert pickle.loads(pickle.dumps(opts)) == opts
    with pytest.raises(AttributeError):
        opts.path = "/elsewhere"  # type: ignore[misc]


# --- offsets ------------------------------------------------------------------


def test_offsets_json():
    opts = batch(startingOffsets=' {"events":{"0":23,"1":-2},"other":{"3":0}} ',
                 endingOffsets='{"events":{"0":50,"1":-1},"other":{"3":7}}')
    assert opts.starting.kind == "offsets"
    assert opts.starting.offsets == {("events", 0): 23, ("events", 1): -2, ("other", 3): 0}
    assert opts.ending.offsets == {("events", 0): 50, ("events", 1): -1, ("other", 3): 7}


def test_unnamed_partitions_default_in_streaming():
    # Spark starts partitions that appear during a stream at earliest.
    opts = stream(startingOffsets='{"events":{"0":4}}')
    assert opts.starting.default == "earliest"


def test_batch_start_latest_rejected():
    read_fails({**BASE, "startingOffsets": "LATEST"}, False, "option 'startingOffsets'",
               "can't be 'latest'")


def test_batch_start_json_latest_rejected():
    read_fails({**BASE, "startingOffsets": '{"events":{"0":-1}}'}, False,
               "option 'startingOffsets'", "events-0", "-1 (latest)")


def test_batch_end_earliest_rejected():
    read_fails({**BASE, "endingOffsets": " earliest"}, False, "option 'endingOffsets'",
               "can't be 'earliest'")


def test_batch_end_json_earliest_rejected():
    read_fails({**BASE, "endingOffsets": '{"events":{"2":-2}}'}, False,
               "option 'endingOffsets'", "events-2", "-2 (earliest)")


def test_streaming_allows_latest_start_and_json_latest():
    assert stream(startingOffsets="latest").starting.kind == "latest"
    assert stream(startingOffsets="earliest").starting.kind == "earliest"
    assert stream(startingOffsets='{"events":{"0":-1}}').starting.offsets == {("events", 0): -1}


@pytest.mark.parametrize("name", ["endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp"])
def test_streaming_rejects_ending_options(name):
    value = '{"events":{"0":1}}' if name != "endingTimestamp" else "1"
    read_fails({**BASE, name: value}, True, f"option '{name}'", "not valid in streaming")


def test_start_and_end_json_must_name_same_partitions():
    message = read_fails({**BASE, "startingOffsets": '{"events":{"0":1,"1":1}}',
                          "endingOffsets": '{"events":{"0":5,"2":5}}'}, False,
                         "startingOffsets", "endingOffsets", "same partitions")
    assert "events-1" in message and "events-2" in message


def test_start_after_end_rejected_only_for_real_offsets():
    read_fails({**BASE, "startingOffsets": '{"events":{"0":10}}',
                "endingOffsets": '{"events":{"0":9}}'}, False, "startingOffsets", "after")
    # -2 and -1 are not compared with real offsets, as in Spark.
    opts = batch(startingOffsets='{"events":{"0":-2}}', endingOffsets='{"events":{"0":0}}')
    assert opts.ending.offsets == {("events", 0): 0}
    assert batch(startingOffsets='{"events":{"0":7}}',
                 endingOffsets='{"events":{"0":7}}').starting.offsets == {("events", 0): 7}


def test_start_json_and_end_latest_need_no_matching():
    assert batch(startingOffsets='{"events":{"0":3}}').ending.kind == "latest"


@pytest.mark.parametrize("value, fragment", [
    ("23", "'earliest', 'latest' or a JSON object"),
    ("{bad", "JSON object"),
    ('{"events":5}', "must map partition numbers"),
    ('{"events":"earliest"}', "topic-wide"),
    ('{"events":{"x":5}}', "partition 'x'"),
    ('{"events":{"-1":5}}', "partition '-1'"),
    ('{"events":{"0":"5"}}', "expected an integer"),
    ('{"events":{"0":1.5}}', "expected an integer"),
    ('{"events":{"0":-3}}', "offset -3 is invalid"),
    ('{"bad topic":{"0":1}}', "illegal characters"),
])
def test_offsets_json_errors(value, fragment):
    read_fails({**BASE, "startingOffsets": value}, True, "option 'startingOffsets'", fragment)


# --- timestamps -------------------------------------------------------------------


def test_global_timestamp():
    opts = batch(startingTimestamp=" 1700000000000 ", endingTimestamp="1700000100000")
    assert opts.starting == PositionSpec("timestamp", timestamp=1700000000000,
                                         default="earliest", if_none="error")
    assert opts.ending.kind == "timestamp" and opts.ending.timestamp == 1700000100000
    assert opts.ending.if_none == "latest"


def test_timestamps_by_partition():
    opts = batch(startingOffsetsByTimestamp='{"events":{"0":1000,"1":2000}}',
                 endingOffsetsByTimestamp='{"events":{"0":3000,"1":4000}}')
    assert opts.starting.kind == "timestamps"
    assert opts.starting.timestamps == {("events", 0): 1000, ("events", 1): 2000}
    assert opts.ending.timestamps == {("events", 0): 3000, ("events", 1): 4000}


def test_precedence_global_timestamp_then_by_partition_then_offsets():
    opts = batch(startingTimestamp="5", startingOffsetsByTimestamp='{"events":{"0":6}}',
                 startingOffsets="earliest")
    assert opts.starting.kind == "timestamp" and opts.starting.timestamp == 5
    opts = batch(startingOffsetsByTimestamp='{"events":{"0":6}}', startingOffsets="earliest")
    assert opts.starting.kind == "timestamps"
    # The precedence also hides what a lower-ranked option says: Spark never
    # looks at startingOffsets here, so even 'latest' passes in batch.
    assert batch(startingTimestamp="5", startingOffsets="latest").starting.kind == "timestamp"


def test_strategy():
    assert batch(startingTimestamp="5").starting.if_none == "error"
    latest = batch(startingTimestamp="5", startingOffsetsByTimestampStrategy="LATEST")
    assert latest.starting.if_none == "latest"
    assert latest.ending.if_none == "latest"  # endings always fall back to latest
    read_fails({**BASE, "startingOffsetsByTimestampStrategy": "earliest"}, False,
               "option 'startingOffsetsByTimestampStrategy'", "'error' or 'latest'")


@pytest.mark.parametrize("value", ["abc", "1.5", "", "99999999999999999999"])
def test_global_timestamp_must_be_a_long(value):
    read_fails({**BASE, "startingTimestamp": value}, False, "option 'startingTimestamp'")


def test_negative_timestamps_rejected():
    read_fails({**BASE, "endingTimestamp": "-1"}, False, "option 'endingTimestamp'", "negative")
    read_fails({**BASE, "startingOffsetsByTimestamp": '{"events":{"0":-5}}'}, False,
               "option 'startingOffsetsByTimestamp'", "negative")


def test_timestamp_maps_must_match_and_be_ordered():
    read_fails({**BASE, "startingOffsetsByTimestamp": '{"events":{"0":1}}',
                "endingOffsetsByTimestamp": '{"events":{"1":2}}'}, False,
               "startingOffsetsByTimestamp", "same partitions")
    read_fails({**BASE, "startingOffsetsByTimestamp": '{"events":{"0":9}}',
                "endingOffsetsByTimestamp": '{"events":{"0":2}}'}, False,
               "startingOffsetsByTimestamp", "after")
    # Global timestamps are not compared (Spark does not either).
    opts = batch(startingTimestamp="9", endingTimestamp="2")
    assert (opts.starting.timestamp, opts.ending.timestamp) == (9, 2)


def test_timestamps_json_errors():
    read_fails({**BASE, "startingOffsetsByTimestamp": "1700000000000"}, False,
               "option 'startingOffsetsByTimestamp'", "JSON object")


# --- general options ---------------------------------------------------------------


def test_numeric_options():
    opts = batch(minPartitions="8", maxRecordsPerPartition="100000")
    assert (opts.min_partitions, opts.max_records_per_partition) == (8, 100000)


@pytest.mark.parametrize("name, value", [
    ("minPartitions", "0"), ("minPartitions", "-3"), ("minPartitions", "x"),
    ("minPartitions", "3000000000"), ("maxRecordsPerPartition", "0"),
    ("maxOffsetsPerTrigger", "0"), ("minOffsetsPerTrigger", "ten"),
])
def test_numeric_option_errors(name, value):
    read_fails({**BASE, name: value}, True, f"option '{name}'")


@pytest.mark.parametrize("name", ["failOnDataLoss", "includeHeaders"])
def test_boolean_options(name):
    field = {"failOnDataLoss": "fail_on_data_loss", "includeHeaders": "include_headers"}[name]
    assert getattr(batch(**{name: "False"}), field) is False
    assert getattr(batch(**{name: " TRUE "}), field) is True
    read_fails({**BASE, name: "yes"}, False, f"option '{name}'", "true or false")


def test_isolation_level():
    assert batch(**{"isolation.level": "read_uncommitted"}).isolation_level == "read_uncommitted"
    assert batch(**{"kafka.isolation.level": "READ_UNCOMMITTED"}).isolation_level == \
        "read_uncommitted"
    both = batch(**{"isolation.level": "read_committed", "kafka.isolation.level": "read_committed"})
    assert both.isolation_level == "read_committed"
    read_fails({**BASE, "isolation.level": "serializable"}, False, "option 'isolation.level'",
               "'read_committed' or 'read_uncommitted'")
    read_fails({**BASE, "kafka.isolation.level": "x"}, False, "option 'kafka.isolation.level'")
    read_fails({**BASE, "isolation.level": "read_committed",
                "kafka.isolation.level": "read_uncommitted"}, False,
               "option 'isolation.level'", "contradicts")


def test_kafka_auto_offset_reset_points_to_starting_offsets():
    read_fails({**BASE, "kafka.auto.offset.reset": "earliest"}, False,
               "option 'kafka.auto.offset.reset'", "startingOffsets")


def test_other_kafka_and_spark_kafka_options_are_ignored():
    opts = batch(**{"kafka.client.id": "c", "kafka.whatever": "x",
                    "groupIdPrefix": "g", "fetchOffset.numRetries": "3", "paths": "[]"})
    assert opts.subscription.topics == ("events",)


@pytest.mark.parametrize("typo, proper", [
    ("startingOffset", "startingOffsets"), ("endingOffset", "endingOffsets"),
    ("includeHeader", "includeHeaders"), ("failOnDataLos", "failOnDataLoss"),
    ("maxOffsetPerTrigger", "maxOffsetsPerTrigger"), ("subscribePatern", "subscribePattern"),
])
def test_misspelled_option_is_named(typo, proper):
    read_fails({**BASE, typo: "1"}, True, f"option '{typo}'", f"did you mean '{proper}'")


def test_unrelated_unknown_options_are_ignored():
    assert batch(checkpointLocation="/c", header="true").path == "/data/log"


def test_write_option_on_read_is_not_a_typo():
    assert batch(numPartitions="3", topic="x").path == "/data/log"


# --- streaming limits -------------------------------------------------------------


def test_trigger_limits():
    opts = stream(maxOffsetsPerTrigger="1000", minOffsetsPerTrigger="10",
                  maxTriggerDelay="30s", maxBytesPerTrigger="64m")
    assert opts.max_offsets_per_trigger == 1000
    assert opts.min_offsets_per_trigger == 10
    assert opts.max_trigger_delay_ms == 30_000
    assert opts.max_bytes_per_trigger == 64 << 20


def test_min_above_max_offsets_rejected_in_both_modes():
    for streaming in (False, True):
        read_fails({**BASE, "minOffsetsPerTrigger": "11", "maxOffsetsPerTrigger": "10"},
                   streaming, "option 'minOffsetsPerTrigger'", "maxOffsetsPerTrigger")


def test_trigger_limits_ignored_in_batch(caplog):
    opts = batch(maxOffsetsPerTrigger="5", maxTriggerDelay="1m")
    assert opts.max_offsets_per_trigger is None and opts.max_trigger_delay_ms is None
    assert "maxOffsetsPerTrigger" in caplog.text and "ignored in batch" in caplog.text


@pytest.mark.parametrize("text, ms", [("100ms", 100), ("30s", 30_000), ("15m", 900_000),
                                       ("2min", 120_000), ("1h", 3_600_000), ("1d", 86_400_000),
                                       ("250", 250), (" 5S ", 5000), ("1500us", 1)])
def test_durations(text, ms):
    assert parse_duration_ms("maxTriggerDelay", text) == ms


@pytest.mark.parametrize("text", ["", "ms", "1.5s", "10 s", "5w", "-1s"])
def test_duration_errors(text):
    with pytest.raises(InvalidConfigError, match="maxTriggerDelay"):
        parse_duration_ms("maxTriggerDelay", text)
    read_fails({**BASE, "maxTriggerDelay": text}, True, "option 'maxTriggerDelay'")


@pytest.mark.parametrize("text, n", [("1024", 1024), ("512k", 512 << 10), ("64MB", 64 << 20),
                                      ("1g", 1 << 30), ("3b", 3)])
def test_byte_sizes(text, n):
    assert parse_bytes("maxBytesPerTrigger", text) == n


@pytest.mark.parametrize("text", ["1.5m", "-1", "12x", "", "0"])
def test_byte_size_errors(text):
    read_fails({**BASE, "maxBytesPerTrigger": text}, True, "option 'maxBytesPerTrigger'")


# --- write ------------------------------------------------------------------------


def test_write_defaults():
    opts = WriteOptions.parse({"path": "/p"}, streaming=False)
    assert opts == WriteOptions(path="/p")
    assert opts.topic is None
    assert opts.delivery_guarantee == "exactly_once"
    assert opts.transactional_id_prefix is None
    assert opts.transaction_timeout_ms == 900_000
    # Neither given: the root's auto.create.topics.enable and num.partitions decide.
    assert (opts.create_topics, opts.num_partitions) == (None, None)
    refused = WriteOptions.parse({"path": "/p", "createTopics": "false"}, streaming=False)
    assert refused.create_topics is False  # given: it overrides the root for this query
    assert opts.compression == "zstd" and opts.batch_size is None and opts.group_id is None
    assert pickle.loads(pickle.dumps(opts)) == opts


def test_write_all_options():
    opts = WriteOptions.parse({
        "Path": " /p ", "topic": " out ", "deliveryGuarantee": "AT-LEAST-ONCE",
        "transactional.id.prefix": "etl-7", "transaction.timeout.ms": "60000",
        "createTopics": "true", "numPartitions": "6", "compression": "ZSTD",
        "batch.size": "256k", "groupId": "sink-group", "checkpointLocation": "/ck"},
        streaming=True)
    assert opts == WriteOptions(
        path="/p", topic="out", delivery_guarantee="at_least_once",
        transactional_id_prefix="etl-7", transaction_timeout_ms=60_000, create_topics=True,
        num_partitions=6, compression="zstd", batch_size=256 << 10, group_id="sink-group",
        checkpoint_location="/ck")


def test_the_pool_size_is_for_batch_writes_without_a_prefix():
    assert WriteOptions.parse({"path": "/p", "transactionalIdPoolSize": "3"},
                              streaming=False).transactional_id_pool_size == 3
    assert WriteOptions.parse({"path": "/p"}, streaming=False).transactional_id_pool_size == 8
    for bad in ("0", "1025", "x"):
        write_fails({"path": "/p", "transactionalIdPoolSize": bad}, False,
                    "option 'transactionalIdPoolSize'")
    write_fails({"path": "/p", "transactionalIdPoolSize": "3", "transactional.id.prefix": "q"},
                False, "option 'transactionalIdPoolSize'", "cannot go with")
    write_fails({"path": "/p", "transactionalIdPoolSize": "3", "txnAppId": "a",
                 "txnVersion": "1"}, False, "option 'transactionalIdPoolSize'", "txnAppId")
    write_fails({"path": "/p", "transactionalIdPoolSize": "3", "checkpointLocation": "/ck"},
                True, "option 'transactionalIdPoolSize'", "batch writes only")


def test_group_id_is_for_streaming_queries_with_a_checkpoint():
    write_fails({"path": "/p", "transactional.id.prefix": "q", "groupId": "g"}, True,
                "option 'groupId'", "checkpointLocation")
    write_fails({"path": "/p", "groupId": "g", "checkpointLocation": "/ck"}, False,
                "option 'groupId'", "batch write")


def test_streaming_exactly_once_needs_a_checkpoint_not_a_prefix():
    # The writer derives the prefix from the query id it reads in the checkpoint.
    assert WriteOptions.parse({"path": "/p", "checkpointLocation": "/ck"},
                              streaming=True).transactional_id_prefix is None
    write_fails({"path": "/p"}, True, "option 'checkpointLocation'",
                "names the prefix when that option is not given")
    write_fails({"path": "/p", "checkpointLocation": "/ck", "takeOverFrom": "q1"}, True,
                "option 'takeOverFrom'", "needs transactional.id.prefix")
    assert WriteOptions.parse({"path": "/p", "deliveryGuarantee": "at_least_once"},
                              streaming=True).transactional_id_prefix is None
    assert WriteOptions.parse({"path": "/p"}, streaming=False).transactional_id_prefix is None


@pytest.mark.parametrize("name, value, fragment", [
    ("topic", "a b", "illegal characters"),
    ("topic", "", "empty"),
    ("deliveryGuarantee", "none", "exactly_once or at_least_once"),
    ("transactional.id.prefix", "bad/prefix", "illegal characters"),
    ("transaction.timeout.ms", "0", "between 1 and 900000"),
    ("transaction.timeout.ms", "900001", "between 1 and 900000"),
    ("transaction.timeout.ms", "1m", "milliseconds"),
    ("createTopics", "1", "true or false"),
    ("numPartitions", "0", "positive"),
    ("numPartitions", "two", "positive integer"),
    ("compression", "gzip", "none, lz4 or zstd"),
    ("batch.size", "0", "between 1 byte"),
    ("batch.size", "4g", "between 1 byte"),
    ("batch.size", "big", "size in bytes"),
    ("groupId", "..", "not allowed"),
])
def test_write_option_errors(name, value, fragment):
    write_fails({"path": "/p", "transactional.id.prefix": "ok", "checkpointLocation": "/ck",
                 name: value}, True, f"option '{name}'", fragment)


def test_write_misspelling_and_read_options():
    write_fails({"path": "/p", "topics": "t"}, False, "option 'topics'", "did you mean 'topic'")
    write_fails({"path": "/p", "deliveryGuarantees": "x"}, False, "'deliveryGuarantee'")
    # A read option on a write is not a typo of a write option.
    assert WriteOptions.parse({"path": "/p", "minPartitions": "2"}, streaming=False).path == "/p"


def test_streaming_exactly_once_needs_the_checkpoint_as_an_option():
    write_fails({"path": "/p", "transactional.id.prefix": "q"}, True,
                "option 'checkpointLocation'", "query's id", "spark.sql.streaming.checkpointLocation")
    # Set through the session's conf, Spark passes the query's name: the error says the path.
    write_fails({"path": "/p", "transactional.id.prefix": "q", "queryName": "alerts"}, True,
                "option 'checkpointLocation'", "<that location>/alerts")
    assert WriteOptions.parse({"path": "/p", "deliveryGuarantee": "at_least_once"},
                              streaming=True).checkpoint_location is None


def test_take_over_from_names_a_query_of_an_exactly_once_stream():
    opts = WriteOptions.parse({"path": "/p", "transactional.id.prefix": "q",
                               "checkpointLocation": "/ck",
                               "takeOverFrom": " 547dcdda-3526-4df0-94eb-4550a2f16223 "},
                              streaming=True)
    assert opts.take_over_from == "547dcdda-3526-4df0-94eb-4550a2f16223"
    write_fails({"path": "/p", "takeOverFrom": "x"}, False, "option 'takeOverFrom'",
                "means nothing here")
    write_fails({"path": "/p", "transactional.id.prefix": "q", "checkpointLocation": "/ck",
                 "takeOverFrom": "a b"}, True, "option 'takeOverFrom'", "illegal characters")


def test_readers_end_expired_transactions_unless_told_not_to():
    assert ReadOptions.parse({"path": "/p", "subscribe": "t"}, streaming=False) \
        .abort_expired_transactions
    assert not ReadOptions.parse({"path": "/p", "subscribe": "t",
                                  "abortExpiredTransactions": "false"}, streaming=True) \
        .abort_expired_transactions


# --- txnAppId / txnVersion (idempotent batch writes) --------------------------------------


def test_txn_app_id_and_version_make_a_batch_write_idempotent():
    opts = WriteOptions.parse({"path": "/p", "TXNAPPID": " etl-1 ", "txnVersion": " 42 "},
                              streaming=False)
    assert (opts.txn_app_id, opts.txn_version) == ("etl-1", 42)
    # The prefix names the group holding the version: stable, so derived from the app id.
    assert opts.transactional_id_prefix == "txn-etl-1"
    given = WriteOptions.parse({"path": "/p", "txnAppId": "etl-1", "txnVersion": "0",
                                "transactional.id.prefix": "mine"}, streaming=False)
    assert (given.transactional_id_prefix, given.txn_version) == ("mine", 0)
    assert pickle.loads(pickle.dumps(opts)) == opts


def test_txn_options_go_together():
    write_fails({"path": "/p", "txnAppId": "a"}, False, "option 'txnVersion'",
                "must be given with txnAppId")
    write_fails({"path": "/p", "txnVersion": "3"}, False, "option 'txnAppId'",
                "must be given with txnVersion")


@pytest.mark.parametrize("value, fragment", [
    ("-1", "non-negative integer"), ("1.5", "non-negative integer"),
    ("x", "non-negative integer"), ("", "non-negative integer"),
    ("99999999999999999999", "64-bit"),
])
def test_txn_version_is_a_non_negative_integer(value, fragment):
    write_fails({"path": "/p", "txnAppId": "a", "txnVersion": value}, False,
                "option 'txnVersion'", fragment)


@pytest.mark.parametrize("value, fragment", [
    ("a b", "illegal characters"), ("", "empty"), ("x" * 197, "at most 196"),
])
def test_txn_app_id_must_name_a_prefix(value, fragment):
    write_fails({"path": "/p", "txnAppId": value, "txnVersion": "1"}, False,
                "option 'txnAppId'", fragment)


def test_txn_options_are_for_exactly_once_batch_writes():
    write_fails({"path": "/p", "txnAppId": "a", "txnVersion": "1",
                 "transactional.id.prefix": "q", "checkpointLocation": "/ck"}, True,
                "option 'txnAppId'", "batch writes", "foreachBatch")
    write_fails({"path": "/p", "txnAppId": "a", "txnVersion": "1",
                 "deliveryGuarantee": "at_least_once"}, False, "option 'txnAppId'",
                "exactly_once")


def test_txn_option_misspelled():
    write_fails({"path": "/p", "txnAppID": "a", "txnVersions": "1"}, False,
                "did you mean 'txnVersion'")


# --- groupId on a stream read (progress in a group for any sink) ---------------------------


def test_a_stream_read_records_its_progress_in_group_id():
    assert stream(groupId=" dash ").group_id == "dash"
    assert stream().group_id is None
    read_fails({**BASE, "groupId": "g"}, False, "option 'groupId'", "batch read")
    read_fails({**BASE, "groupId": "a/b"}, True, "option 'groupId'", "illegal characters")


# --- kafka.* options (Spark's Kafka integration) --------------------------------


WRITE = {"path": "/p", "topic": "t"}


def write_opts(streaming: bool = False, **extra: str) -> WriteOptions:
    return WriteOptions.parse({**WRITE, **extra}, streaming=streaming)


def test_kafka_producer_options_map_onto_txlog_options():
    opts = write_opts(**{"kafka.compression.type": "ZSTD", "kafka.batch.size": "16384",
                         "kafka.linger.ms": "20", "kafka.max.request.size": "524288",
                         "kafka.transaction.timeout.ms": "60000",
                         "kafka.enable.idempotence": "true"})
    assert (opts.compression, opts.batch_size, opts.linger_ms, opts.max_request_size,
            opts.transaction_timeout_ms) == ("zstd", 16384, 20, 524288, 60_000)
    assert pickle.loads(pickle.dumps(opts)) == opts


@pytest.mark.parametrize("ours, theirs, a, b", [
    ("compression", "kafka.compression.type", "lz4", "LZ4"),
    ("batch.size", "kafka.batch.size", "16k", "16384"),
    ("transaction.timeout.ms", "kafka.transaction.timeout.ms", "60000", "60000"),
])
def test_txlog_and_kafka_spelling_agree_or_conflict(ours, theirs, a, b):
    # Both given with the same meaning: accepted.
    write_opts(**{ours: a, theirs: b})
    other = {"compression": "zstd", "batch.size": "32k", "transaction.timeout.ms": "1000"}[ours]
    write_fails({**WRITE, ours: other, theirs: b}, False, f"option '{ours}'", "contradicts",
                theirs, "give one of them")


@pytest.mark.parametrize("codec", ["gzip", "snappy", "GZIP"])
def test_kafka_codecs_txlog_lacks_are_refused_naming_the_supported_ones(codec):
    for name in ("kafka.compression.type", "compression"):
        write_fails({**WRITE, name: codec}, False, f"option '{name}'", "none, lz4 or zstd",
                    "Arrow IPC")


@pytest.mark.parametrize("option, value, fragment", [
    ("kafka.batch.size", "0", "no batching"),
    ("kafka.batch.size", "16k", "size in bytes"),
    ("kafka.batch.size", "4294967296", "between 1 byte"),
    ("kafka.linger.ms", "-1", "must not be negative"),
    ("kafka.linger.ms", "soon", "milliseconds"),
    ("kafka.max.request.size", "0", "must be positive"),
    ("kafka.transaction.timeout.ms", "900001", "between 1 and 900000"),
    ("kafka.enable.idempotence", "maybe", "true or false"),
])
def test_bad_kafka_producer_values_are_named(option, value, fragment):
    write_fails({**WRITE, option: value}, False, f"option '{option}'", fragment)


def test_idempotence_off_conflicts_with_exactly_once_only():
    write_fails({**WRITE, "kafka.enable.idempotence": "false"}, False,
                "option 'kafka.enable.idempotence'", "at_least_once")
    assert write_opts(deliveryGuarantee="at_least_once",
                      **{"kafka.enable.idempotence": "false"}).delivery_guarantee == \
        "at_least_once"


@pytest.mark.parametrize("option", ["kafka.key.serializer", "kafka.value.serializer",
                                    "kafka.partitioner.class", "kafka.interceptor.classes",
                                    "kafka.transactional.id", "KAFKA.Key.Serializer"])
@pytest.mark.parametrize("streaming", [False, True])
def test_options_spark_kafka_sink_refuses_are_refused(option, streaming):
    options = {**WRITE, option: "x", "transactional.id.prefix": "q", "checkpointLocation": "/ck"}
    write_fails(options, streaming, f"option '{option}'", "is not supported")


@pytest.mark.parametrize("option, reason", [
    ("kafka.key.deserializer", "DataFrame operations"),
    ("kafka.value.deserializer", "DataFrame operations"),
    ("kafka.enable.auto.commit", "commits no offsets"),
    ("kafka.interceptor.classes", "modify the payload"),
])
@pytest.mark.parametrize("streaming", [False, True])
def test_options_spark_kafka_source_refuses_are_refused(option, reason, streaming):
    read_fails({**BASE, option: "x"}, streaming, f"option '{option}'", "is not supported", reason)


def test_read_and_write_settings_of_the_other_side_are_only_ignored():
    # A consumer's settings on a write, a producer's on a read: nothing to refuse.
    write_opts(**{"kafka.key.deserializer": "x", "kafka.enable.auto.commit": "true"})
    batch(**{"kafka.key.serializer": "x", "kafka.compression.type": "gzip"})


def test_ignored_kafka_options_are_logged_once_per_query(caplog):
    options = {**WRITE, "kafka.client.id": "c", "kafka.acks": "all",
               "kafka.compression.type": "lz4", "kafka.secret.thing": "hunter2"}
    with caplog.at_level("WARNING", logger="txlog.spark.options"):
        for _ in range(3):  # Spark parses a query's options more than once
            WriteOptions.parse(options, streaming=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert "kafka.acks, kafka.client.id, kafka.secret.thing" in warnings[0]
    assert "kafka.compression.type" not in warnings[0] and "hunter2" not in warnings[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="txlog.spark.options"):
        ReadOptions.parse({**BASE, "kafka.client.id": "c",
                           "kafka.isolation.level": "read_committed", "groupIdPrefix": "g"},
                          streaming=True)
        WriteOptions.parse(WRITE, streaming=False)  # nothing ignored: no warning
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "streaming read" in warnings[0], warnings
    assert "groupIdPrefix, kafka.client.id" in warnings[0]
    assert "isolation" not in warnings[0]
