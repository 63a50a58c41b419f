"""Tests of the declared settings: the table, its kinds, and the clients that check through it.

The producer's table is checked twice for each bad value, through
``check_producer_settings`` and through ``Producer`` itself, against the
message ``Producer`` has always given, so the two stay one check after
``Producer.__init__`` calls the function.
"""

from __future__ import annotations

from typing import Any

import pytest

from txlog import Log
from txlog.clients.consumer import Consumer
from txlog.clients.producer import DEFAULT_LINGER_MS, Producer
from txlog.clients.producer_settings import check_producer_settings
from txlog.clients.settings import Setting, Settings, any_value, at_least, name_of, one_of
from txlog.errors import InvalidConfigError, InvalidNameError
from txlog.integers import is_int
from txlog.kafka.config import CONSUMER_CONFIG, PRODUCER_CONFIG, resolve
from txlog.kafka.errors import KafkaConfigurationError

COUNT = at_least(1, "{name} must be positive, not {value!r}")
TABLE = Settings(
    Setting("size", COUNT, 10),
    Setting("mode", one_of(("a", "b"), "{name}: {value!r}?"), "a"),
    Setting("label"),
)


# --- the mechanism ------------------------------------------------------------------------


def test_resolve_fills_in_defaults_and_reads_given_values_through_their_rows() -> None:
    assert TABLE.resolve({}) == {"size": 10, "mode": "a", "label": None}
    assert TABLE.resolve({"size": 3, "label": object}) == {"size": 3, "mode": "a",
                                                            "label": object}
    assert TABLE.resolve({"other": "not looked at"}) == {"size": 10, "mode": "a", "label": None}


def test_a_default_is_taken_as_declared_and_never_read() -> None:
    table = Settings(Setting("size", COUNT, None))
    assert table.resolve({}) == {"size": None}
    with pytest.raises(InvalidConfigError, match="size must be positive, not None"):
        table.resolve({"size": None})  # given: read, and refused


def test_the_first_bad_value_in_table_order_is_the_one_reported() -> None:
    with pytest.raises(InvalidConfigError, match=r"^size must be positive, not 0$"):
        TABLE.resolve({"mode": "c", "size": 0})
    with pytest.raises(InvalidConfigError, match=r"^mode: 'c'\?$"):
        TABLE.check(mode="c", size=1)


def test_the_table_is_a_mapping_of_its_rows_in_order() -> None:
    assert list(TABLE) == ["size", "mode", "label"]
    assert len(TABLE) == 3 and "mode" in TABLE and TABLE["label"].kind is any_value
    assert TABLE["size"].read(4) == 4


def test_a_kind_that_returns_another_value_gives_that_value() -> None:
    table = Settings(Setting("level", lambda name, value: value.strip().lower()))
    assert table.resolve({"level": " High "}) == {"level": "high"}


# --- the kinds ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -3, 1.5, "2", None, True, False])
def test_at_least_refuses_other_types_bools_and_values_below_its_bound(value: Any) -> None:
    with pytest.raises(InvalidConfigError) as info:
        COUNT("size", value)
    assert str(info.value) == f"size must be positive, not {value!r}"


def test_at_least_takes_what_its_types_and_allow_bool_say() -> None:
    assert COUNT("size", 1) == 1 and COUNT("size", 1 << 70) == 1 << 70
    legacy = at_least(1, "{name}: {value!r}", allow_bool=True)
    assert legacy("n", True) is True
    with pytest.raises(InvalidConfigError, match="n: False"):
        legacy("n", False)  # a bool still has to reach the bound
    ms = at_least(0, "{name} must be >= 0, not {value!r}", types=(int, float))
    assert ms("ms", 0.5) == 0.5 and ms("ms", 0) == 0
    with pytest.raises(InvalidConfigError, match=r"ms must be >= 0, not -0.5"):
        ms("ms", -0.5)


def test_one_of_and_name_of() -> None:
    kind = one_of((None, "x"), "{name} is {value!r}")
    assert kind("k", None) is None and kind("k", "x") == "x"
    with pytest.raises(InvalidConfigError, match="^k is 'y'$"):
        kind("k", "y")
    names = name_of("group id")
    assert names("group", None) is None and names("group", "g-1") == "g-1"
    with pytest.raises(InvalidNameError, match="group id name 'a/b' contains illegal"):
        names("group", "a/b")


def test_is_int_means_an_int_and_not_a_bool() -> None:
    assert is_int(0) and is_int(-5) and is_int(1 << 80)
    assert not any(is_int(v) for v in (True, False, 1.0, "1", None))


# --- the native producer: its table, and Producer itself ----------------------------------

PRODUCER_DEFAULTS: dict[str, Any] = dict(
    compression=None, compression_type=None, batch_size=None,
    data_object_bytes=None, linger_ms=DEFAULT_LINGER_MS,
    transactional_id=None, enable_idempotence=True, metrics_num_samples=2,
    metrics_sample_window_ms=30000)

# Each bad setting with the error Producer(...) has always raised for it.
BAD_PRODUCER_SETTINGS = [
    ({"compression": "gzip"}, InvalidConfigError,
     "compression 'gzip' is not supported (use None, 'lz4' or 'zstd')"),
    ({"compression": "lz4", "compression_type": "snappy"}, InvalidConfigError,
     "compression 'snappy' is not supported (use None, 'lz4' or 'zstd')"),
    ({"batch_size": 0}, InvalidConfigError, "batch_size must be a positive integer, not 0"),
    ({"batch_size": 1.5}, InvalidConfigError, "batch_size must be a positive integer, not 1.5"),
    ({"batch_size": False}, InvalidConfigError,
     "batch_size must be a positive integer, not False"),
    ({"data_object_bytes": True}, InvalidConfigError,
     "data_object_bytes must be a positive integer, not True"),
    ({"data_object_bytes": -1}, InvalidConfigError,
     "data_object_bytes must be a positive integer, not -1"),
    ({"linger_ms": -1}, InvalidConfigError, "linger_ms must be >= 0, not -1"),
    ({"linger_ms": "5"}, InvalidConfigError, "linger_ms must be >= 0, not '5'"),
    ({"transactional_id": "a/b"}, InvalidNameError,
     "transactional id name 'a/b' contains illegal characters '/'; only ASCII letters, "
     "digits, '.', '_' and '-' are allowed"),
    ({"transactional_id": 7}, InvalidNameError, "transactional id name must be a string, got int"),
    ({"transactional_id": "t", "enable_idempotence": False}, InvalidConfigError,
     "a transactional producer needs enable_idempotence=True"),
    ({"metrics_num_samples": 0}, InvalidConfigError,
     "metrics_num_samples must be a positive int, not 0"),
    ({"metrics_sample_window_ms": 1.5}, InvalidConfigError,
     "metrics_sample_window_ms must be a positive int, not 1.5"),
    # Two bad values: the one Producer has always checked first is reported.
    ({"batch_size": 0, "compression": "gzip"}, InvalidConfigError,
     "compression 'gzip' is not supported (use None, 'lz4' or 'zstd')"),
    ({"linger_ms": -1, "data_object_bytes": 0}, InvalidConfigError,
     "data_object_bytes must be a positive integer, not 0"),
]


@pytest.mark.parametrize("bad,error,message", BAD_PRODUCER_SETTINGS)
def test_check_producer_settings_refuses_what_producer_refuses_with_its_message(
        bad: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        check_producer_settings(**{**PRODUCER_DEFAULTS, **bad})
    assert str(info.value) == message


@pytest.mark.parametrize("bad,error,message", BAD_PRODUCER_SETTINGS)
def test_producer_refuses_the_same_values_with_the_same_messages(
        memlog: Log, bad: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        Producer(memlog, **bad)
    assert str(info.value) == message


@pytest.mark.parametrize("good", [
    {}, {"compression": "none"}, {"compression": "zstd"}, {"compression_type": "lz4"},
    {"batch_size": True}, {"batch_size": 1}, {"linger_ms": 0.5}, {"linger_ms": True},
    {"data_object_bytes": 1}, {"transactional_id": "t-1"},
    {"metrics_num_samples": 1, "metrics_sample_window_ms": 1},
    {"transactional_id": None, "enable_idempotence": False},
])
def test_what_producer_takes_passes_the_check(memlog: Log, good: dict[str, Any]) -> None:
    chosen = check_producer_settings(**{**PRODUCER_DEFAULTS, **good})
    assert chosen == good.get("compression_type", good.get("compression"))
    Producer(memlog, **good).close()


# --- the native consumer ------------------------------------------------------------------


@pytest.mark.parametrize("bad,message", [
    ({"isolation_level": "read_some"},
     "isolation_level must be one of read_committed, read_uncommitted, not 'read_some'"),
    ({"auto_offset_reset": "smallest"},
     "auto_offset_reset must be 'earliest', 'latest' or 'none', not 'smallest'"),
    ({"max_poll_records": 0}, "max_poll_records must be a positive int, not 0"),
    ({"max_poll_records": "5"}, "max_poll_records must be a positive int, not '5'"),
    ({"max_poll_records": 0, "auto_offset_reset": "x"},
     "auto_offset_reset must be 'earliest', 'latest' or 'none', not 'x'"),
])
def test_consumer_refuses_bad_settings_with_its_messages(
        memlog: Log, bad: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        Consumer(memlog, **bad)
    assert str(info.value) == message


def test_consumer_takes_true_as_one_record_per_poll_as_it_always_has(memlog: Log) -> None:
    assert Consumer(memlog, max_poll_records=True).max_poll_records is True


# --- kafka-python's keys ------------------------------------------------------------------


def test_kafka_keys_refuse_values_outside_what_they_allow_naming_the_client() -> None:
    with pytest.raises(KafkaConfigurationError) as info:
        resolve("KafkaProducer", PRODUCER_CONFIG, {"acks": 2})
    assert str(info.value) == (
        "KafkaProducer: acks=2 is not supported by txlog: " + PRODUCER_CONFIG["acks"].note)
    with pytest.raises(KafkaConfigurationError, match="acks=True"):
        resolve("KafkaProducer", PRODUCER_CONFIG, {"acks": True})  # True is not 1
    assert resolve("KafkaProducer", PRODUCER_CONFIG, {"acks": 1})["acks"] == 1


def test_kafka_keys_fill_in_kafka_pythons_defaults() -> None:
    config = resolve("KafkaConsumer", CONSUMER_CONFIG, {"group_id": "g"})
    assert config["group_id"] == "g"
    assert config["max_poll_records"] == 500 and config["security_protocol"] == "PLAINTEXT"
    assert list(config) == list(CONSUMER_CONFIG)
