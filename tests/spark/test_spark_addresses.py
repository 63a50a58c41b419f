"""Spark's Kafka address options on format("txlog"), and the sink's prefix derived from its query.

``kafka.bootstrap.servers`` names the root when ``path`` is not given (and
must agree with it when both are), a broker address there is refused, and an
exactly-once stream sink without ``transactional.id.prefix`` takes
``txlog-sink-<query id>``.  Option parsing is checked without Spark; one
stream, through the shared session, shows the derived prefix exactly once
across a restart that replays a batch.
"""

from __future__ import annotations

import json
import uuid

import pytest

from conftest import LARGE

from txlog import Log
from txlog.errors import InvalidConfigError
from txlog.exactly_once.shared_transaction import check_prefix
from txlog.exactly_once.stream_sink import query_prefix
from txlog.spark.options import ReadOptions, WriteOptions

SERVERS = "kafka.bootstrap.servers"
ADDRESSES = ["localhost:9092", "host1:9092,host2:9092", str(["a:1", "b:2"])]
CHECKPOINTED = {"topic": "t", "checkpointLocation": "/ck"}


def parse(kind: str, streaming: bool, options: dict[str, str]):
    if kind == "read":
        return ReadOptions.parse({"subscribe": "t", **options}, streaming=streaming)
    return WriteOptions.parse({**CHECKPOINTED, **options}, streaming=streaming)


KINDS = [("read", False), ("read", True), ("write", False), ("write", True)]


@pytest.mark.parametrize("kind, streaming", KINDS)
@pytest.mark.parametrize("servers", ADDRESSES, ids=["host-port", "comma-list", "list"])
def test_a_broker_address_is_refused_saying_what_a_root_is(kind, streaming, servers):
    with pytest.raises(InvalidConfigError) as info:
        parse(kind, streaming, {SERVERS: servers})
    message = str(info.value)
    assert message.startswith(f"{SERVERS}={servers!r} looks like ")
    assert "a txlog root is a path or URL" in message
    with pytest.raises(InvalidConfigError, match="a txlog root is a path or URL"):
        parse(kind, streaming, {"path": "/data/log", SERVERS: servers})


@pytest.mark.parametrize("kind, streaming", KINDS)
def test_kafka_bootstrap_servers_is_the_root_without_path(kind, streaming, caplog):
    with caplog.at_level("WARNING", logger="txlog.spark.options"):
        assert parse(kind, streaming, {SERVERS: " s3://bucket/log "}).path == "s3://bucket/log"
    assert SERVERS not in caplog.text  # taken, not logged as ignored


@pytest.mark.parametrize("kind, streaming", KINDS)
def test_path_and_kafka_bootstrap_servers_must_name_the_same_root(kind, streaming,
                                                                 tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for path, servers in [("/data/log", "file:///data/log/"), ("log", str(tmp_path / "log")),
                          ("s3://bucket/log", "S3://bucket/log/")]:
        assert parse(kind, streaming, {"path": path, SERVERS: servers}).path == path
    with pytest.raises(InvalidConfigError) as info:
        parse(kind, streaming, {"path": "/data/log", SERVERS: "/data/other"})
    message = str(info.value)
    assert message.startswith("option 'path': '/data/log' and kafka.bootstrap.servers "
                              "'/data/other' name different roots"), message


def test_the_derived_prefix_is_a_valid_name_of_the_query_alone():
    query = str(uuid.uuid4())
    prefix = query_prefix(query)
    assert prefix == f"txlog-sink-{query}" == query_prefix(query)
    assert check_prefix(prefix) == prefix
    assert query_prefix(str(uuid.uuid4())) != prefix
    with pytest.raises(Exception, match="query id"):
        query_prefix("not/a name")


# The ported Kafka programs (test_ported_spark_programs.py) run a sink without a prefix in
# every CI run; this restart of one costs about 20 s, which the suite's 15 minutes cannot
# hold, so it runs with TXLOG_LARGE=1.
@LARGE
def test_a_sink_without_prefix_is_exactly_once_across_a_restart(spark, tmp_path):
    """Source and sink named by kafka.bootstrap.servers alone; the restart replays batch 0
    (its commit file deleted, as after a crash before Spark recorded it), which the sink
    skips only if it finds the same prefix: every record is in the sink once."""
    root, checkpoint = tmp_path / "log", tmp_path / "ck"
    log = Log(root)
    log.create_topic("src")
    log.create_topic("dst")

    def produce(values: list[str]) -> None:
        with log.producer() as producer:
            for value in values:
                producer.send("src", value.encode(), key=value.encode())

    def run() -> None:
        source = spark.readStream.format("txlog").option(SERVERS, str(root)) \
            .option("subscribe", "src").option("startingOffsets", "earliest").load()
        query = source.select("key", "value").writeStream.format("txlog") \
            .option(SERVERS, str(root)).option("topic", "dst") \
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
        query.awaitTermination()
        assert query.exception() is None

    produce(["a", "b", "c"])
    run()
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    for name in (str(last), f".{last}.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    produce(["d"])
    run()
    written = Log(root).read("dst", 0).column("value").to_pylist()  # read_committed
    assert sorted(value.decode() for value in written) == ["a", "b", "c", "d"]
    query = json.loads((checkpoint / "metadata").read_text().splitlines()[0])["id"]
    assert f"{query_prefix(query)}-sink" in Log(root).groups()
