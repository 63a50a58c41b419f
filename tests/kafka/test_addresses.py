"""A Kafka address where a txlog root belongs: refused with what to give, real roots never.

The first line of most kafka-python programs names a broker; taken as a root
it would be a relative directory named after it, so txlog.kafka's clients
refuse it (txlog.kafka.addresses), saying that a txlog root is a path or URL.
"""

from __future__ import annotations

import pytest

import txlog.kafka
from txlog.kafka import KafkaConsumer, KafkaProducer
from txlog.kafka.addresses import is_broker_address, root_address
from txlog.kafka.config import open_log
from txlog.kafka.errors import KafkaConfigurationError

ADDRESSES = ["localhost:9092", "host1:9092,host2:9092", ["a:1", "b:2"]]
ROOT_IS = "a txlog root is a path or URL"


def _admin(servers):
    admin = getattr(txlog.kafka, "KafkaAdminClient", None)
    if admin is None:
        pytest.skip("txlog.kafka has no KafkaAdminClient in this tree")
    return admin(bootstrap_servers=servers)


CLIENTS = {
    "KafkaProducer": lambda servers: KafkaProducer(bootstrap_servers=servers),
    "KafkaConsumer": lambda servers: KafkaConsumer(bootstrap_servers=servers),
    "KafkaAdminClient": _admin,
    "open_log": lambda servers: open_log("open_log", servers, None),
}


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("servers", ADDRESSES, ids=["host-port", "comma-list", "list"])
def test_every_client_refuses_a_broker_address_saying_what_a_root_is(client, servers,
                                                                      tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # were it taken as a relative root, it would land here
    with pytest.raises(KafkaConfigurationError) as info:
        CLIENTS[client](servers)
    message = str(info.value)
    assert ROOT_IS in message and repr(servers) in message, message
    assert "bootstrap_servers" in message, message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text", [
    "localhost:9092", "10.0.0.1:9092", "[::1]:9092", "broker-1.example.com:9093",
    "PLAINTEXT://localhost:9092", "SASL_SSL://b1.example.com:9094", " localhost:9092 ",
    "host1:9092,host2:9092", "kafka1,kafka2", "a:1, b:2",
])
def test_broker_addresses_are_recognised(text):
    assert is_broker_address(text)


@pytest.mark.parametrize("text", [
    "/data/log", "data", "logs/localhost:9092", "./localhost:9092", "C:\\data\\log",
    "file:///tmp/log", "s3://bucket/prefix", "s3://bucket:9000/prefix", "memory://name",
    "gs://bucket", "/data/a,b", "localhost", "mylog:2024/x", "[::1]",
])
def test_paths_and_urls_are_roots(text):
    assert not is_broker_address(text)
    assert root_address("bootstrap_servers", text) == text


def test_a_root_passes_alone_or_as_a_one_item_list_and_a_host_port_directory_as_dot_slash(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert open_log("open_log", [str(tmp_path / "log")], None).root == str(tmp_path / "log")
    KafkaProducer(bootstrap_servers=(str(tmp_path / "log"),)).close()
    assert open_log("open_log", "./localhost:9092", None).root == \
        str(tmp_path / "localhost:9092")
    with pytest.raises(KafkaConfigurationError, match=ROOT_IS):
        open_log("open_log", [], None)


@pytest.mark.parametrize("text", ["['a:1', 'b:2']", '["a:1","b:2"]', "['localhost:9092']"])
def test_a_written_out_list_of_brokers_is_recognised(text):
    # What a list becomes as a Spark option (PySpark's str() of it) or in JSON.
    assert is_broker_address(text)
