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
  what they can mean (``acks``, a broker address as ``bootstrap_servers``).

An unknown key is refused, as kafka-python refuses it.  docs/clients.md
shows this table; a test checks the two agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..clients.producer import (DEFAULT_BATCH_SIZE, DEFAULT_LINGER_MS, DEFAULT_TRANSACTION_TIMEOUT_MS,
                               )
from ..clients.producer_settings import DEFAULT_COMPRESSION
from ..api.log import Log
from ..clients.metrics import DEFAULT_NUM_SAMPLES, DEFAULT_SAMPLE_WINDOW_MS, PREFIX_SETTING
from ..clients.settings import Setting, Settings, any_value
from ..errors import InvalidConfigError
from ..format.batch import MIN_COMPRESSED_BYTES
from .addresses import root_address
from .errors import KafkaConfigurationError, translated

USED = "used"
ACCEPTED = "accepted"
REFUSED = "refused"


@dataclass(frozen=True)
class KafkaKey(Setting):
    """A kafka-python key's row, with what txlog does with it and why (docs/clients.md)."""

    handling: str = USED
    note: str = ""


def _key(name: str, default: Any, handling: str, note: str,
         allows: tuple[Any, ...] | None = None) -> KafkaKey:
    """A key's row; with ``allows``, only those values pass, each of its own type (True
    is not 1), and any other is refused with the note saying why."""
    def only(key: str, value: Any) -> Any:
        if not any(value == x and type(value) is type(x) for x in allows or ()):
            raise InvalidConfigError(f"{key}={value!r} is not supported by txlog: {note}")
        return value
    return KafkaKey(name, any_value if allows is None else only, default, handling, note)


_NO_NETWORK = "no network: txlog reads and writes the storage root directly"
_CREDENTIALS = ("no broker to authenticate to: the storage's credentials come from "
                "storage_options or the environment (docs/object_stores.md)")
_MEMBERSHIP = "group membership (subscribe with a group_id), as Kafka"

_COMMON = (
    _key("bootstrap_servers",
        None, USED, "the log's root: a path or URL (s3://..., memory://...), a one-item list "
        "of one, or a txlog.Log; a broker address (host:port, a list of hosts or of several "
        "servers) is refused",
        None),
    _key("storage_options",
        None, USED, "txlog's own key: the fsspec options of an object-store root (Log's "
        "storage_options)"),
    _key("client_id", None, ACCEPTED, "a name only; " + _MEMBERSHIP),
    _key("api_version", None, ACCEPTED, "txlog speaks one protocol: any value is taken and "
                        "has no effect"),
    _key("allow_auto_create_topics",
        True, USED, "as Kafka: a topic missing when sent to, subscribed or assigned is "
        "created if the root's auto.create.topics.enable allows it (with its num.partitions); "
        "False never creates one (a send to it raises UnknownTopicOrPartitionError)"),
    _key("metadata_max_age_ms",
        300000, USED, "how often a subscription without group_id looks for added partitions; "
        "a producer refreshes a topic's partition count whenever it needs it"),
    _key("retry_backoff_ms", 100, USED, "the pause between reads of storage while poll() "
                             "waits for records"),
    _key("bootstrap_timeout_ms", 30000, ACCEPTED, _NO_NETWORK),
    _key("request_timeout_ms", 30000, ACCEPTED, _NO_NETWORK),
    _key("reconnect_backoff_ms", 50, ACCEPTED, _NO_NETWORK),
    _key("reconnect_backoff_max_ms", 30000, ACCEPTED, _NO_NETWORK),
    _key("max_in_flight_requests_per_connection", 5, ACCEPTED, _NO_NETWORK),
    _key("receive_buffer_bytes", None, ACCEPTED, _NO_NETWORK),
    _key("send_buffer_bytes", None, ACCEPTED, _NO_NETWORK),
    _key("receive_message_max_bytes", 100_000_000, ACCEPTED, _NO_NETWORK),
    _key("socket_options", None, ACCEPTED, _NO_NETWORK),
    _key("connections_max_idle_ms", 540000, ACCEPTED, _NO_NETWORK),
    _key("client_dns_lookup", "use_all_dns_ips", ACCEPTED, _NO_NETWORK),
    _key("selector", None, ACCEPTED, _NO_NETWORK),
    _key("kafka_client", None, ACCEPTED, _NO_NETWORK),
    _key("proxy_url", None, REFUSED, "no network to proxy", (None,)),
    _key("socks5_proxy", None, REFUSED, "no network to proxy", (None,)),
    _key("metric_reporters", (), REFUSED, "reporters are not called: read metrics() "
                             "instead (kafka-python's groups and names)", ((), [])),
    _key("metrics_enabled", True, USED, "False: metrics() returns None, as kafka-python"),
    _key("metrics_num_samples", DEFAULT_NUM_SAMPLES, USED,
                                "samples a metrics() rate or average is taken over, as Kafka"),
    _key("metrics_sample_window_ms", DEFAULT_SAMPLE_WINDOW_MS, USED,
                                     "each sample's window, as Kafka"),
    _key("security_protocol", "PLAINTEXT", REFUSED, _CREDENTIALS, ("PLAINTEXT",)),
    _key("ssl_context", None, REFUSED, _CREDENTIALS, (None,)),
    _key("ssl_check_hostname", True, REFUSED, _CREDENTIALS, (True,)),
    _key("ssl_cafile", None, REFUSED, _CREDENTIALS, (None,)),
    _key("ssl_certfile", None, REFUSED, _CREDENTIALS, (None,)),
    _key("ssl_keyfile", None, REFUSED, _CREDENTIALS, (None,)),
    _key("ssl_crlfile", None, REFUSED, _CREDENTIALS, (None,)),
    _key("ssl_password", None, REFUSED, _CREDENTIALS, (None,)),
    _key("ssl_ciphers", None, REFUSED, _CREDENTIALS, (None,)),
    _key("sasl_mechanism", None, REFUSED, _CREDENTIALS, (None,)),
    _key("sasl_plain_username", None, REFUSED, _CREDENTIALS, (None,)),
    _key("sasl_plain_password", None, REFUSED, _CREDENTIALS, (None,)),
    _key("sasl_kerberos_name", None, REFUSED, _CREDENTIALS, (None,)),
    _key("sasl_kerberos_service_name", "kafka", REFUSED, _CREDENTIALS, ("kafka",)),
    _key("sasl_kerberos_domain_name", None, REFUSED, _CREDENTIALS, (None,)),
    _key("sasl_oauth_token_provider", None, REFUSED, _CREDENTIALS, (None,)),
)

PRODUCER_CONFIG = Settings(
    *_COMMON,
    _key("key_serializer", None, USED, "a callable or a kafka-style Serializer"),
    _key("value_serializer", None, USED, "a callable or a kafka-style Serializer"),
    _key("enable_idempotence", True, USED, "producer ids, epochs and sequences, as Kafka"),
    _key("transactional_id", None, USED, "the transactional producer"),
    _key("transaction_timeout_ms", DEFAULT_TRANSACTION_TIMEOUT_MS, USED,
                                   "an open transaction is aborted by any process after it"),
    _key("compression_type", DEFAULT_COMPRESSION, USED,
                             f"default '{DEFAULT_COMPRESSION}' (kafka-python: None) because "
                             "what a log costs is the bytes it stores; None, 'lz4' or 'zstd' "
                             "(gzip and snappy are refused: txlog's batches do not use them). "
                             f"A batch under {MIN_COMPRESSED_BYTES // 1024} KiB encoded is "
                             "stored uncompressed whatever the codec (docs/format.md 2.4)"),
    _key("batch_size", DEFAULT_BATCH_SIZE, USED,
                       f"bytes per batch; default {DEFAULT_BATCH_SIZE} (kafka-python: 16384) "
                       "because each batch is one storage object"),
    _key("linger_ms", DEFAULT_LINGER_MS, USED,
                      f"default {DEFAULT_LINGER_MS} (kafka-python: 0) because each batch is "
                      "one storage object; a background thread publishes batches whose "
                      "linger has run out"),
    _key("acks", -1, ACCEPTED, "every batch is durable once published, as with "
                 "acks='all'; 0 and 1 are taken and get that durability too (offsets are "
                 "real, not -1)", (0, 1, -1, "all")),
    _key("retries", float("inf"), ACCEPTED, "a storage write is not retried by the layer: "
                    "its error reaches the record's future"),
    _key("delivery_timeout_ms", 120000, ACCEPTED, "a batch is written or fails in one "
                                "storage request; get(timeout) bounds the wait"),
    _key("max_block_ms", 60000, ACCEPTED, "send() blocks only while another thread "
                         "publishes; topic metadata is read from storage at once"),
    _key("max_request_size", 1048576, ACCEPTED, "the topic's max.message.bytes bounds a "
                             "batch instead"),
    _key("partitioner", None, REFUSED, "txlog partitions as Kafka's default partitioner "
                        "(murmur2 of the key, sticky without one); a custom one is refused",
                        (None,)),
)

CONSUMER_CONFIG = Settings(
    *_COMMON,
    _key("group_id", None, USED, "committed offsets live in the log's group store"),
    _key("group_instance_id", None, USED, _MEMBERSHIP),
    _key("key_deserializer", None, USED, "a callable or a kafka-style Deserializer"),
    _key("value_deserializer", None, USED, "a callable or a kafka-style Deserializer"),
    _key("auto_offset_reset", "latest", USED, "'earliest', 'latest' or 'none' "
                              "('smallest'/'largest' as aliases)"),
    _key("enable_auto_commit", True, USED, "commits positions in poll() every "
                               "auto_commit_interval_ms and on close(); needs a group_id"),
    _key("auto_commit_interval_ms", 5000, USED, "as Kafka"),
    _key("default_offset_commit_callback", None, USED, "commit_async()'s callback when none "
                                           "is given"),
    _key("isolation_level", "read_uncommitted", USED, "as Kafka, read_uncommitted by "
                            "default; read_committed reads up to the LSO"),
    _key("max_poll_records", 500, USED, "as Kafka"),
    _key("consumer_timeout_ms", float("inf"), USED, "iteration stops after this long "
                                "without records"),
    _key("partition_assignment_strategy", None, USED, _MEMBERSHIP),
    _key("session_timeout_ms", 45000, USED, _MEMBERSHIP),
    _key("heartbeat_interval_ms", 3000, USED, _MEMBERSHIP),
    _key("max_poll_interval_ms", 300000, USED, _MEMBERSHIP),
    _key("check_crcs", True, ACCEPTED, "txlog checks both checksums of every batch "
                       "always; False does not turn that off"),
    _key("fetch_max_wait_ms", 500, ACCEPTED, "poll(timeout_ms) is how long a poll waits"),
    _key("fetch_min_bytes", 1, ACCEPTED, "a poll returns as soon as any record is there"),
    _key("fetch_max_bytes", 52428800, ACCEPTED, "max_poll_records bounds a poll"),
    _key("max_partition_fetch_bytes", 1048576, USED,
         "what one fetch reads ahead of a partition's position at most (whole batches, at "
         "least one), as Kafka's"),
    _key("enable_incremental_fetch_sessions", True, ACCEPTED, _NO_NETWORK),
    _key("client_rack", "", ACCEPTED, "no replicas to pick a near one from"),
    _key("exclude_internal_topics", True, ACCEPTED, "txlog has no internal topics"),
    _key("metric_group_prefix", PREFIX_SETTING.default, USED,
                                "the consumer's metrics() groups: PREFIX-fetch-manager-metrics "
                                "and PREFIX-coordinator-metrics"),
)

# KafkaAdminClient takes the keys both clients take, but those about records (creating
# topics on use, turning metrics off) and ssl_ciphers, as kafka-python 3.0's admin client.
ADMIN_CONFIG = Settings(*(row for row in _COMMON if row.name not in
                          ("allow_auto_create_topics", "metrics_enabled", "ssl_ciphers")))


def resolve(kind: str, table: Settings[KafkaKey], configs: dict[str, Any]) -> dict[str, Any]:
    """Every key's value (defaults filled in), after refusing unknown and refused ones."""
    unknown = sorted(set(configs) - set(table))
    if unknown:
        raise KafkaConfigurationError(
            f"{kind}: unrecognized config(s) {unknown} (kafka-python 3.0's keys are known; "
            "docs/clients.md lists what each means to txlog)")
    try:
        return table.resolve(configs)
    except InvalidConfigError as exc:
        raise KafkaConfigurationError(f"{kind}: {exc}") from None


def open_log(kind: str, bootstrap_servers: Any, storage_options: dict | None) -> Log:
    """The Log that ``bootstrap_servers`` names: the root path or URL (or a Log); a broker
    address is refused (txlog.kafka.addresses)."""
    if isinstance(bootstrap_servers, Log):
        return bootstrap_servers
    try:
        root = root_address("bootstrap_servers", bootstrap_servers)
    except InvalidConfigError as exc:
        raise KafkaConfigurationError(f"{kind}: {exc}") from None
    with translated():
        return Log(root, storage_options=storage_options)


def markdown_table() -> str:
    """The table as docs/clients.md shows it (a test keeps the two identical)."""
    rows = ["| key | producer | consumer | what txlog does with it |", "|---|---|---|---|"]
    for key in sorted(set(PRODUCER_CONFIG) | set(CONSUMER_CONFIG)):
        producer, consumer = PRODUCER_CONFIG.get(key), CONSUMER_CONFIG.get(key)
        note = (producer or CONSUMER_CONFIG[key]).note
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
