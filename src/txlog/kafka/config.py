"""What each kafka-python configuration key means to txlog: the one table.

A ported program passes kafka-python's keys.  Each key of kafka-python
3.0's ``KafkaProducer``/``KafkaConsumer`` is here with what txlog does with
it, in one of three ways:

* ``USED``: it means what it means in Kafka (``linger_ms``, ``group_id``...);
* ``ACCEPTED``: taken and documented, with no effect or a different one,
  because there is no broker or network (``acks``: every write is durable
  once published, as with ``acks="all"``; ``request_timeout_ms``...);
* ``REFUSED``: only the default passes; any other value raises
  ``KafkaConfigurationError`` naming the key, because txlog cannot give it
  the meaning the program expects (SASL/SSL settings, a custom
  partitioner).  A few used or accepted keys also refuse values outside
  what they can mean (``acks``, several bootstrap servers).

An unknown key is refused, as kafka-python refuses it.  docs/clients.md
shows this table; a test checks the two agree.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..clients.producer import DEFAULT_BATCH_SIZE, DEFAULT_LINGER_MS, DEFAULT_TRANSACTION_TIMEOUT_MS
from ..api.log import Log
from .errors import KafkaConfigurationError, translated

USED = "used"
ACCEPTED = "accepted"
REFUSED = "refused"


@dataclass(frozen=True)
class Setting:
    default: Any
    handling: str
    note: str
    allows: Callable[[Any], bool] | None = None  # the values that pass (None: any)


def _is(*values: Any) -> Callable[[Any], bool]:
    return lambda v: any(v == x and type(v) is type(x) for x in values)


_NO_NETWORK = "no network: txlog reads and writes the storage root directly"
_CREDENTIALS = ("no broker to authenticate to: the storage's credentials come from "
                "storage_options or the environment (docs/object_stores.md)")
_MEMBERSHIP = "group membership (subscribe with a group_id), as Kafka"

_COMMON: dict[str, Setting] = {
    "bootstrap_servers": Setting(
        None, USED, "the log's root: a path or URL (s3://..., memory://...), a one-item list "
        "of one, or a txlog.Log; several servers are refused",
        None),
    "storage_options": Setting(
        None, USED, "txlog's own key: the fsspec options of an object-store root (Log's "
        "storage_options)"),
    "client_id": Setting(None, ACCEPTED, "a name only; " + _MEMBERSHIP),
    "api_version": Setting(None, ACCEPTED, "txlog speaks one protocol: any value is taken and "
                           "has no effect"),
    "allow_auto_create_topics": Setting(
        True, ACCEPTED, "txlog never creates topics on use: a missing one raises "
        "UnknownTopicOrPartitionError at once (create it with `txlog topics create`)"),
    "metadata_max_age_ms": Setting(
        300000, USED, "how often a subscription without group_id looks for added partitions; "
        "a producer refreshes a topic's partition count whenever it needs it"),
    "retry_backoff_ms": Setting(100, USED, "the pause between reads of storage while poll() "
                                "waits for records"),
    "bootstrap_timeout_ms": Setting(30000, ACCEPTED, _NO_NETWORK),
    "request_timeout_ms": Setting(30000, ACCEPTED, _NO_NETWORK),
    "reconnect_backoff_ms": Setting(50, ACCEPTED, _NO_NETWORK),
    "reconnect_backoff_max_ms": Setting(30000, ACCEPTED, _NO_NETWORK),
    "max_in_flight_requests_per_connection": Setting(5, ACCEPTED, _NO_NETWORK),
    "receive_buffer_bytes": Setting(None, ACCEPTED, _NO_NETWORK),
    "send_buffer_bytes": Setting(None, ACCEPTED, _NO_NETWORK),
    "receive_message_max_bytes": Setting(100_000_000, ACCEPTED, _NO_NETWORK),
    "socket_options": Setting(None, ACCEPTED, _NO_NETWORK),
    "connections_max_idle_ms": Setting(540000, ACCEPTED, _NO_NETWORK),
    "client_dns_lookup": Setting("use_all_dns_ips", ACCEPTED, _NO_NETWORK),
    "selector": Setting(None, ACCEPTED, _NO_NETWORK),
    "kafka_client": Setting(None, ACCEPTED, _NO_NETWORK),
    "proxy_url": Setting(None, REFUSED, "no network to proxy", _is(None)),
    "socks5_proxy": Setting(None, REFUSED, "no network to proxy", _is(None)),
    "metric_reporters": Setting((), ACCEPTED, "txlog keeps no client metrics; metrics() "
                                "returns {}"),
    "metrics_enabled": Setting(True, ACCEPTED, "txlog keeps no client metrics"),
    "metrics_num_samples": Setting(2, ACCEPTED, "txlog keeps no client metrics"),
    "metrics_sample_window_ms": Setting(30000, ACCEPTED, "txlog keeps no client metrics"),
    "security_protocol": Setting("PLAINTEXT", REFUSED, _CREDENTIALS, _is("PLAINTEXT")),
    "ssl_context": Setting(None, REFUSED, _CREDENTIALS, _is(None)),
    "ssl_check_hostname": Setting(True, REFUSED, _CREDENTIALS, _is(True)),
    "ssl_cafile": Setting(None, REFUSED, _CREDENTIALS, _is(None)),
    "ssl_certfile": Setting(None, REFUSED, _CREDENTIALS, _is(None)),
    "ssl_keyfile": Setting(None, REFUSED, _CREDENTIALS, _is(None)),
    "ssl_crlfile": Setting(None, REFUSED, _CREDENTIALS, _is(None)),
    "ssl_password": Setting(None, REFUSED, _CREDENTIALS, _is(None)),
    "ssl_ciphers": Setting(None, REFUSED, _CREDENTIALS, _is(None)),
    "sasl_mechanism": Setting(None, REFUSED, _CREDENTIALS, _is(None)),
    "sasl_plain_username": Setting(None, REFUSED, _CREDENTIALS, _is(None)),
    "sasl_plain_password": Setting(None, REFUSED, _CREDENTIALS, _is(None)),
    "sasl_kerberos_name": Setting(None, REFUSED, _CREDENTIALS, _is(None)),
    "sasl_kerberos_service_name": Setting("kafka", REFUSED, _CREDENTIALS, _is("kafka")),
    "sasl_kerberos_domain_name": Setting(None, REFUSED, _CREDENTIALS, _is(None)),
    "sasl_oauth_token_provider": Setting(None, REFUSED, _CREDENTIALS, _is(None)),
}

PRODUCER_CONFIG: dict[str, Setting] = {
    **_COMMON,
    "key_serializer": Setting(None, USED, "a callable or a kafka-style Serializer"),
    "value_serializer": Setting(None, USED, "a callable or a kafka-style Serializer"),
    "enable_idempotence": Setting(True, USED, "producer ids, epochs and sequences, as Kafka"),
    "transactional_id": Setting(None, USED, "the transactional producer"),
    "transaction_timeout_ms": Setting(DEFAULT_TRANSACTION_TIMEOUT_MS, USED,
                                      "an open transaction is aborted by any process after it"),
    "compression_type": Setting(None, USED, "None, 'lz4' or 'zstd' (gzip and snappy are "
                                "refused: txlog's batches do not use them)"),
    "batch_size": Setting(DEFAULT_BATCH_SIZE, USED,
                          f"bytes per batch; default {DEFAULT_BATCH_SIZE} (kafka-python: 16384) "
                          "because each batch is one storage object"),
    "linger_ms": Setting(DEFAULT_LINGER_MS, USED,
                         f"default {DEFAULT_LINGER_MS} (kafka-python: 0) because each batch is "
                         "one storage object; a background thread publishes batches whose "
                         "linger has run out"),
    "acks": Setting(-1, ACCEPTED, "every batch is durable once published, as with "
                    "acks='all'; 0 and 1 are taken and get that durability too (offsets are "
                    "real, not -1)", _is(0, 1, -1, "all")),
    "retries": Setting(float("inf"), ACCEPTED, "a storage write is not retried by the layer: "
                       "its error reaches the record's future"),
    "delivery_timeout_ms": Setting(120000, ACCEPTED, "a batch is written or fails in one "
                                   "storage request; get(timeout) bounds the wait"),
    "max_block_ms": Setting(60000, ACCEPTED, "send() blocks only while another thread "
                            "publishes; topic metadata is read from storage at once"),
    "max_request_size": Setting(1048576, ACCEPTED, "the topic's max.message.bytes bounds a "
                                "batch instead"),
    "partitioner": Setting(None, REFUSED, "txlog partitions as Kafka's default partitioner "
                           "(murmur2 of the key, sticky without one); a custom one is refused",
                           _is(None)),
}

CONSUMER_CONFIG: dict[str, Setting] = {
    **_COMMON,
    "group_id": Setting(None, USED, "committed offsets live in the log's group store"),
    "group_instance_id": Setting(None, USED, _MEMBERSHIP),
    "key_deserializer": Setting(None, USED, "a callable or a kafka-style Deserializer"),
    "value_deserializer": Setting(None, USED, "a callable or a kafka-style Deserializer"),
    "auto_offset_reset": Setting("latest", USED, "'earliest', 'latest' or 'none' "
                                 "('smallest'/'largest' as aliases)"),
    "enable_auto_commit": Setting(True, USED, "commits positions in poll() every "
                                  "auto_commit_interval_ms and on close(); needs a group_id"),
    "auto_commit_interval_ms": Setting(5000, USED, "as Kafka"),
    "default_offset_commit_callback": Setting(None, USED, "commit_async()'s callback when none "
                                              "is given"),
    "isolation_level": Setting("read_uncommitted", USED, "as Kafka, read_uncommitted by "
                               "default; read_committed reads up to the LSO"),
    "max_poll_records": Setting(500, USED, "as Kafka"),
    "consumer_timeout_ms": Setting(float("inf"), USED, "iteration stops after this long "
                                   "without records"),
    "partition_assignment_strategy": Setting(None, USED, _MEMBERSHIP),
    "session_timeout_ms": Setting(45000, USED, _MEMBERSHIP),
    "heartbeat_interval_ms": Setting(3000, USED, _MEMBERSHIP),
    "max_poll_interval_ms": Setting(300000, USED, _MEMBERSHIP),
    "check_crcs": Setting(True, ACCEPTED, "txlog checks both checksums of every batch "
                          "always; False does not turn that off"),
    "fetch_max_wait_ms": Setting(500, ACCEPTED, "poll(timeout_ms) is how long a poll waits"),
    "fetch_min_bytes": Setting(1, ACCEPTED, "a poll returns as soon as any record is there"),
    "fetch_max_bytes": Setting(52428800, ACCEPTED, "max_poll_records bounds a poll"),
    "max_partition_fetch_bytes": Setting(1048576, ACCEPTED, "max_poll_records bounds a poll"),
    "enable_incremental_fetch_sessions": Setting(True, ACCEPTED, _NO_NETWORK),
    "client_rack": Setting("", ACCEPTED, "no replicas to pick a near one from"),
    "exclude_internal_topics": Setting(True, ACCEPTED, "txlog has no internal topics"),
    "metric_group_prefix": Setting("consumer", ACCEPTED, "txlog keeps no client metrics"),
}


def resolve(kind: str, table: dict[str, Setting], configs: dict[str, Any]) -> dict[str, Any]:
    """Every key's value (defaults filled in), after refusing unknown and refused ones."""
    unknown = sorted(set(configs) - set(table))
    if unknown:
        raise KafkaConfigurationError(
            f"{kind}: unrecognized config(s) {unknown} (kafka-python 3.0's keys are known; "
            "docs/clients.md lists what each means to txlog)")
    for key, value in configs.items():
        setting = table[key]
        if setting.allows is not None and not setting.allows(value):
            raise KafkaConfigurationError(
                f"{kind}: {key}={value!r} is not supported by txlog: {setting.note}")
    resolved = {key: s.default for key, s in table.items()}
    resolved.update(configs)
    return resolved


def open_log(kind: str, bootstrap_servers: Any, storage_options: dict | None) -> Log:
    """The Log that ``bootstrap_servers`` names: the root path or URL (or a Log)."""
    if isinstance(bootstrap_servers, Log):
        return bootstrap_servers
    servers = bootstrap_servers
    if isinstance(servers, (list, tuple)):
        if len(servers) != 1:
            raise KafkaConfigurationError(
                f"{kind}: bootstrap_servers={servers!r}: txlog has no brokers; give the one "
                "log root (a path or URL such as s3://bucket/prefix)")
        servers = servers[0]
    if isinstance(servers, os.PathLike):
        servers = os.fspath(servers)
    if not isinstance(servers, str) or not servers:
        raise KafkaConfigurationError(
            f"{kind}: bootstrap_servers must be the log root (a path or URL), not {servers!r}")
    if "," in servers and "://" not in servers:
        raise KafkaConfigurationError(
            f"{kind}: bootstrap_servers={servers!r} looks like a list of brokers; txlog has "
            "none: give the one log root (a path or URL)")
    with translated():
        return Log(servers, storage_options=storage_options)


def markdown_table() -> str:
    """The table as docs/clients.md shows it (a test keeps the two identical)."""
    rows = ["| key | producer | consumer | what txlog does with it |", "|---|---|---|---|"]
    for key in sorted(set(PRODUCER_CONFIG) | set(CONSUMER_CONFIG)):
        producer, consumer = PRODUCER_CONFIG.get(key), CONSUMER_CONFIG.get(key)
        note = (producer or consumer).note  # type: ignore[union-attr]
        if producer and consumer and producer.note != consumer.note:
            note = f"producer: {producer.note}; consumer: {consumer.note}"
        rows.append(f"| `{key}` | {producer.handling if producer else '-'} | "
                    f"{consumer.handling if consumer else '-'} | {note} |")
    return "\n".join(rows) + "\n"


Codec = Callable[[str, list, Any], Any]


def codec(value: Any, method: str, what: str) -> Codec | None:
    """A serializer or deserializer in kafka-python's two forms: an object with
    ``<method>(topic, headers, data)`` (``serialize``/``deserialize``), or a plain
    callable of the data."""
    if value is None:
        return None
    bound = getattr(value, method, None)
    if callable(bound):
        return bound
    if callable(value):
        return lambda topic, headers, data: value(data)
    raise KafkaConfigurationError(f"{what} must be callable or have {method}(topic, headers, "
                                  f"data), not {type(value).__name__}")
