"""Options of ``format("txlog")``, parsed and checked before any data moves.

Spark hands a data source its options as a case-insensitive map of strings.
They are turned here into frozen dataclasses that pickle to executors, and
every mistake is reported at ``load()``/``save()`` time with the option's name
and what it accepts, instead of as a failure inside a task.

Read options follow Spark's Kafka source (``KafkaSourceProvider`` and
``KafkaOffsetRangeLimit`` in Spark 4.3) so a Kafka pipeline can switch to
txlog by changing the format: the same names, the same precedence between
``*Timestamp``, ``*OffsetsByTimestamp`` and ``*Offsets``, the same defaults
and the same batch/streaming restrictions.  Where Spark accepts something that
can only fail later (a negative offset below -2, a non-numeric
``maxOffsetsPerTrigger`` in a batch query), it is rejected here instead.

Spark's ``kafka.*`` client settings are mapped onto txlog's options, refused
where Spark's Kafka source or sink refuses them, or logged as ignored (the
block at the end of this module; docs/spark.md has the table).

One rule stays with the planner, because it needs the log: like Spark, a JSON
offsets or timestamps map must name exactly the partitions the subscription
covers when the read is planned (``PositionSpec.default`` only applies to
partitions that appear later in a stream).
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..clients.producer_settings import DEFAULT_COMPRESSION
from ..clients.settings import Kind, Setting, Settings
from ..errors import InvalidConfigError, InvalidNameError
from ..exactly_once.id_pool import DEFAULT_POOL_SIZE, MAX_POOL_SIZE
from ..integers import is_int
from ..storage.secrets import is_secret_option
from ..storage.names import validate_name
from ..storage.schemes import normalised_url
from ..transactions.coordinator import MAX_TRANSACTION_TIMEOUT_MS
from .planning import EARLIEST, LATEST, PositionSpec, Subscription

log = logging.getLogger(__name__)

IsolationLevel = Literal["read_committed", "read_uncommitted"]
DeliveryGuarantee = Literal["exactly_once", "at_least_once"]

# Spark's JavaUtils time and byte suffixes (timeStringAsMs, byteStringAsBytes).
_TIME_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000,
                  "h": 3_600_000, "d": 86_400_000}
_BYTE_UNITS = {"b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
               "g": 1 << 30, "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40,
               "p": 1 << 50, "pb": 1 << 50}
_TIME_RE = re.compile(r"(-?[0-9]+)([a-z]+)?")
_BYTES_RE = re.compile(r"([0-9]+)([a-z]+)?")
# Java's Long.parseLong: optional sign, decimal digits.
_LONG_RE = re.compile(r"[+-]?[0-9]+")
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1

# Option names, lower-cased as Spark's CaseInsensitiveMap compares them.
_STRATEGIES = {"subscribe": "subscribe", "subscribepattern": "subscribePattern",
               "assign": "assign"}
_READ_NAMES = (
    "path", "subscribe", "subscribePattern", "assign",
    "startingOffsets", "endingOffsets", "startingTimestamp", "endingTimestamp",
    "startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy", "failOnDataLoss", "minPartitions",
    "maxRecordsPerPartition", "includeHeaders", "isolation.level",
    "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "maxBytesPerTrigger",
    "abortExpiredTransactions", "groupId", "topicIds",
)
_WRITE_NAMES = (
    "path", "topic", "deliveryGuarantee", "transactional.id.prefix", "transaction.timeout.ms",
    "createTopics", "numPartitions", "compression", "batch.size", "groupId",
    "checkpointLocation", "takeOverFrom", "queryName", "txnAppId", "txnVersion",
    "dataObjectBytes", "transactionalIdPoolSize",
)
# Spark Kafka source options that mean nothing without a Kafka cluster; a
# pipeline moved from format("kafka") may still carry them.
_KAFKA_ONLY = ("groupIdPrefix", "fetchOffset.numRetries", "fetchOffset.retryIntervalMs",
               "kafkaConsumer.pollTimeoutMs")
# Keys Spark itself may put in the map (load(path) / save(path)).
_SPARK_PASSED = ("path", "paths")
_ALL_KNOWN = {n.lower() for n in (*_READ_NAMES, *_WRITE_NAMES, *_KAFKA_ONLY, *_SPARK_PASSED)}


class _Opts(Mapping[str, str]):
    """Case-insensitive view of Spark's options that names options in errors as the user
    wrote them; iterating gives the lower-cased names."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._values: dict[str, str] = {}
        self._spelling: dict[str, str] = {}
        for key, value in options.items():
            lower = str(key).lower()
            self._values[lower] = "" if value is None else str(value)
            self._spelling[lower] = str(key)

    def __getitem__(self, name: str) -> str:
        return self._values[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def spelled(self, lower: str) -> str:
        return self._spelling.get(lower, lower)


def _fail(option: str, message: str) -> InvalidConfigError:
    return InvalidConfigError(f"option '{option}': {message}")


def _parse_long(option: str, raw: str, *, what: str = "an integer") -> int:
    text = raw.strip()
    if not _LONG_RE.fullmatch(text):
        raise _fail(option, f"expected {what}, got {raw!r}")
    value = int(text)
    if not _LONG_MIN <= value <= _LONG_MAX:
        raise _fail(option, f"{raw!r} does not fit a 64-bit integer")
    return value


def parse_duration_ms(option: str, raw: str) -> int:
    """A Spark duration ("100ms", "30s", "15m", "1h", "2d"; bare numbers are ms) in ms."""
    text = raw.strip().lower()
    match = _TIME_RE.fullmatch(text)
    if not match or (match.group(2) is not None and match.group(2) not in _TIME_UNITS_MS):
        raise _fail(option, f"expected a duration such as '100ms', '30s', '15m', '1h' or '2d' "
                            f"(units us, ms, s, m/min, h, d), got {raw!r}")
    value = int(match.group(1)) * _TIME_UNITS_MS[match.group(2) or "ms"]
    if value < 0:
        raise _fail(option, f"must not be negative, got {raw!r}")
    return int(value)


def parse_bytes(option: str, raw: str) -> int:
    """A Spark byte size ("1048576", "512k", "64m", "1g"; bare numbers are bytes)."""
    text = raw.strip().lower()
    match = _BYTES_RE.fullmatch(text)
    if not match or (match.group(2) is not None and match.group(2) not in _BYTE_UNITS):
        raise _fail(option, f"expected a size in bytes such as '1048576', '512k', '64m' or "
                            f"'1g' (units b, k/kb, m/mb, g/gb, t/tb, p/pb), got {raw!r}")
    return int(match.group(1)) * _BYTE_UNITS[match.group(2) or "b"]


# --- kinds: how an option's text is read (the tables are with each direction) ---


def _positive(bits: int) -> Kind:
    """A positive integer of ``bits`` (32: Java's int, 64: its long)."""
    def read(name: str, raw: str) -> int:
        value = _parse_long(name, raw, what="a positive integer")
        if bits == 32 and value > _INT_MAX:
            raise _fail(name, f"{raw!r} is larger than {_INT_MAX}")
        if value <= 0:
            raise _fail(name, f"must be positive, got {raw!r}")
        return value
    return read


def _long(what: str) -> Kind:
    """Java's Long.parseLong of the text; ``what`` says what is expected."""
    return lambda name, raw: _parse_long(name, raw, what=what)


def _ranged(parse: Kind, low: int, high: float, beyond: str) -> Kind:
    """What ``parse`` reads, from ``low`` to ``high``; ``beyond`` is the message for a
    value outside, formatted with the ``raw`` text."""
    def read(name: str, raw: str) -> int:
        value = parse(name, raw)
        if not low <= value <= high:
            raise _fail(name, beyond.format(raw=raw))
        return value
    return read


def _boolean(name: str, raw: str) -> bool:
    # Scala's String.toBoolean: "true"/"false" in any case, nothing else.
    lowered = raw.strip().lower()
    if lowered not in ("true", "false"):
        raise _fail(name, f"expected true or false, got {raw!r}")
    return lowered == "true"


def _one_of(choices: tuple[str, ...], expected: str, dashes: bool = False) -> Kind:
    """One of ``choices``, in any case (``expected`` lists them for the message); with
    ``dashes``, Flink's spelling (exactly-once) too."""
    def read(name: str, raw: str) -> str:
        value = raw.strip().lower()
        value = value.replace("-", "_") if dashes else value
        if value not in choices:
            raise _fail(name, f"expected {expected}, got {raw!r}")
        return value
    return read


def _compression(name: str, raw: str) -> str:
    value = raw.strip().lower()
    if value not in _COMPRESSIONS:
        why = (" (gzip and snappy are Kafka codecs txlog does not have: a txlog batch "
               "is Arrow IPC, which compresses with lz4 or zstd)"
               if value in ("gzip", "snappy") else "")
        raise _fail(name, f"expected none, lz4 or zstd, got {raw!r}{why}")
    return value


def _named(option: str, name: object, kind: str) -> str:
    """``name`` if it is a legal ``kind`` name (a topic, a group id...), else the error
    naming ``option``."""
    try:
        return validate_name(name, kind)
    except InvalidNameError as exc:
        raise _fail(option, str(exc)) from None


def _name_of(kind: str) -> Kind:
    return lambda option, raw: _named(option, raw.strip(), kind)


def _stripped(name: str, raw: str) -> str | None:
    return raw.strip() or None


_BATCH_SIZE_RANGE = f"must be between 1 byte and {_INT_MAX}, got {{raw!r}}"


def _kafka_batch_size(name: str, raw: str) -> int:
    size = _parse_long(name, raw, what="a size in bytes")
    if size == 0:
        raise _fail(name, "0 (Kafka's 'no batching') would make every record a batch object "
                          "of its own; give a size in bytes")
    if not 1 <= size <= _INT_MAX:
        raise _fail(name, _BATCH_SIZE_RANGE.format(raw=raw))
    return size


_TIMEOUT_MS = _ranged(_long("milliseconds between 1 and 900000"), 1, MAX_TRANSACTION_TIMEOUT_MS,
                      f"must be between 1 and {MAX_TRANSACTION_TIMEOUT_MS} ms, got {{raw!r}}")


def _json_object(option: str, raw: str, example: str) -> dict:
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise _fail(option, f"expected a JSON object such as {example}, got {raw!r}")
    return value


def _partition_map(option: str, raw: str, example: str) -> dict[tuple[str, int], int]:
    """``{"topic": {"0": n, ...}}`` as Spark's JsonUtils reads it: partition keys are ints."""
    parsed = _json_object(option, raw.strip(), example)
    result: dict[tuple[str, int], int] = {}
    for topic, partitions in parsed.items():
        _named(option, topic, "topic")
        if isinstance(partitions, str) and partitions.lower() in ("earliest", "latest"):
            raise _fail(option, f"topic {topic!r}: a topic-wide {partitions!r} is not accepted "
                                f"(Spark 4.3's Kafka source does not take it either); name each "
                                f"partition, e.g. {example}")
        if not isinstance(partitions, dict):
            raise _fail(option, f"topic {topic!r} must map partition numbers to values, "
                                f"e.g. {example}; got {json.dumps(partitions)}")
        for key, value in partitions.items():
            if not re.fullmatch(r"[+-]?[0-9]+", key) or int(key) < 0 or int(key) > _INT_MAX:
                raise _fail(option, f"topic {topic!r}: partition {key!r} is not a "
                                    f"non-negative integer; expected e.g. {example}")
            if not is_int(value) or not _LONG_MIN <= value <= _LONG_MAX:
                raise _fail(option, f"topic {topic!r} partition {key}: expected an integer, "
                                    f"got {json.dumps(value)}")
            result[(topic, int(key))] = value
    return result


# --- starting and ending positions ---------------------------------------


def _position(opts: _Opts, side: Literal["starting", "ending"],
              default: Literal["earliest", "latest"], strategy: Literal["error", "latest"]
              ) -> PositionSpec:
    """Spark's getKafkaOffsetRangeLimit: a global timestamp wins over per-partition
    timestamps, which win over offsets; with none of them, ``default``."""
    ts_key = f"{side}Timestamp"
    by_ts_key = f"{side}OffsetsByTimestamp"
    offsets_key = f"{side}Offsets"
    # Spark applies the strategy to starting positions only; an ending timestamp
    # with no record at or after it always resolves to the latest offset.
    if_none: Literal["error", "latest"] = strategy if side == "starting" else "latest"
    unnamed: Literal["earliest", "latest"] = "earliest" if side == "starting" else "latest"
    if ts_key in opts:
        raw = opts.get(ts_key) or ""
        ts = _parse_long(ts_key, raw, what="one timestamp in milliseconds since the epoch")
        if ts < 0:
            raise _fail(ts_key, f"a timestamp must not be negative, got {raw!r}")
        return PositionSpec("timestamp", timestamp=ts, if_none=if_none, default=unnamed)
    if by_ts_key in opts:
        example = '{"topicA":{"0":1700000000000,"1":1700000000000}}'
        stamps = _partition_map(by_ts_key, opts.get(by_ts_key) or "", example)
        for (topic, partition), ts in stamps.items():
            if ts < 0:
                raise _fail(by_ts_key, f"topic {topic!r} partition {partition}: a timestamp "
                                       f"must not be negative, got {ts}")
        return PositionSpec("timestamps", timestamps=stamps, if_none=if_none, default=unnamed)
    given = opts.get(offsets_key)
    if given is None:
        return PositionSpec(default, if_none=if_none, default=unnamed)
    text = given.strip()
    if text.lower() in ("earliest", "latest"):
        return PositionSpec(text.lower(), if_none=if_none, default=unnamed)  # type: ignore[arg-type]
    example = '{"topicA":{"0":23,"1":-2},"topicB":{"0":-1}}'
    if not text.startswith("{"):
        raise _fail(offsets_key, f"expected 'earliest', 'latest' or a JSON object such as "
                                 f"{example} (-2 = earliest, -1 = latest), got {given!r}")
    offsets = _partition_map(offsets_key, text, example)
    for (topic, partition), off in offsets.items():
        if off < EARLIEST:
            raise _fail(offsets_key, f"topic {topic!r} partition {partition}: offset {off} is "
                                     f"invalid; use an offset >= 0, -2 (earliest) or -1 (latest)")
    return PositionSpec("offsets", offsets=offsets, if_none=if_none, default=unnamed)


def _check_batch_positions(start: PositionSpec, end: PositionSpec) -> None:
    """Spark's validateBatchOptions and checkOffsetLimitValidity."""
    if start.kind == "latest":
        raise _fail("startingOffsets", "can't be 'latest' for a batch query (it would read "
                                       "nothing); use 'earliest', a JSON map or a timestamp")
    for (topic, partition), off in sorted(start.offsets.items()):
        if off == LATEST:
            raise _fail("startingOffsets", f"{topic}-{partition} can't start at -1 (latest) in "
                                           f"a batch query; use an offset >= 0 or -2 (earliest)")
    if end.kind == "earliest":
        raise _fail("endingOffsets", "can't be 'earliest' for a batch query (it would read "
                                     "nothing); use 'latest', a JSON map or a timestamp")
    for (topic, partition), off in sorted(end.offsets.items()):
        if off == EARLIEST:
            raise _fail("endingOffsets", f"{topic}-{partition} can't end at -2 (earliest) in a "
                                         f"batch query; use an offset >= 0 or -1 (latest)")
    if start.kind == "offsets" and end.kind == "offsets":
        _same_partitions("startingOffsets", "endingOffsets", start.offsets, end.offsets)
        for tp, first in sorted(start.offsets.items()):
            last = end.offsets[tp]
            if first >= 0 and last >= 0 and first > last:
                raise _fail("startingOffsets", f"{tp[0]}-{tp[1]} starts at {first}, after its "
                                               f"endingOffsets {last}")
    if start.kind == "timestamps" and end.kind == "timestamps":
        _same_partitions("startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
                         start.timestamps, end.timestamps)
        for tp, first in sorted(start.timestamps.items()):
            last = end.timestamps[tp]
            if first > last:
                raise _fail("startingOffsetsByTimestamp",
                            f"{tp[0]}-{tp[1]} starts at timestamp {first}, after its "
                            f"endingOffsetsByTimestamp {last}")


def _same_partitions(a_name: str, b_name: str, a: Mapping, b: Mapping) -> None:
    if set(a) != set(b):
        def show(keys: set) -> str:
            return ", ".join(f"{t}-{p}" for t, p in sorted(keys)) or "none"
        raise _fail(a_name, f"{a_name} and {b_name} must name the same partitions; only in "
                            f"{a_name}: {show(set(a) - set(b))}; only in {b_name}: "
                            f"{show(set(b) - set(a))}")


# --- unknown options ------------------------------------------------------


def _check_spelling(opts: _Opts) -> None:
    """Reject a key that is one slip away from an option name, ignore anything else.

    Options other sources or Spark understand (``kafka.*``, ``path``) pass
    through, as in Spark's Kafka source; a key close to one of ours is almost
    certainly a typo that would otherwise be silently ignored.
    """
    for lower in opts.keys():
        if lower in _ALL_KNOWN or lower.startswith("kafka.") or \
                lower.startswith(STORAGE_PREFIX) or lower == STORAGE_JSON:
            continue
        if lower.startswith("txlog."):
            raise _fail(opts.spelled(lower), f"unknown option; storage options are spelled "
                                             f"'{STORAGE_PREFIX}<name>' or given as a JSON "
                                             f"object in '{STORAGE_JSON}'")
        close = difflib.get_close_matches(lower, _ALL_KNOWN, n=1, cutoff=0.85)
        if close:
            proper = next(n for n in (*_READ_NAMES, *_WRITE_NAMES, *_KAFKA_ONLY, *_SPARK_PASSED)
                          if n.lower() == close[0])
            raise _fail(opts.spelled(lower), f"unknown option; did you mean '{proper}'?")


# --- storage options -------------------------------------------------------

STORAGE_PREFIX = "txlog.storage."
STORAGE_JSON = "txlog.storage_options"


def _storage_options(opts: _Opts) -> dict[str, Any]:
    """The fsspec backend's arguments (endpoint, region, credentials) for an object-store root.

    Executors open the log themselves, and the data source's options are what
    reaches them (a Python worker does not see the driver's Python objects), so
    ``Log(root, storage_options=...)`` has its Spark twin here:
    ``txlog.storage.<name>`` sets argument ``<name>``, dots nest
    (``txlog.storage.client_kwargs.region_name``), and ``true``/``false``
    become booleans (a backend flag such as ``anon`` would take the string
    "false" as true).  Anything else that needs a type (numbers, lists) goes in
    ``txlog.storage_options`` as a JSON object.  Values never appear in an
    error: they may be credentials.
    """
    options: dict[str, Any] = {}
    raw_json = opts.get(STORAGE_JSON)
    if raw_json is not None:
        try:
            parsed = json.loads(raw_json)
        except json.JSONDecodeError as exc:
            raise _fail(STORAGE_JSON, f"is not valid JSON ({exc.msg} at character "
                                      f"{exc.pos}); expected an object such as "
                                      '{"endpoint_url": "https://..."}') from None
        if not isinstance(parsed, dict):
            raise _fail(STORAGE_JSON, f"expected a JSON object of storage options, got a "
                                      f"JSON {type(parsed).__name__}")
        options.update(parsed)
    for lower in sorted(opts.keys()):
        if not lower.startswith(STORAGE_PREFIX):
            continue
        name = opts.spelled(lower)[len(STORAGE_PREFIX):]
        parts = name.split(".")
        if any(not part for part in parts):
            raise _fail(opts.spelled(lower), "is not a storage option name: give "
                                             f"'{STORAGE_PREFIX}<name>[.<name>...]'")
        raw = opts.get(lower) or ""
        value: Any = {"true": True, "false": False}.get(raw.strip().lower(), raw)
        where = options
        for depth, part in enumerate(parts[:-1]):
            where = where.setdefault(part, {})
            if not isinstance(where, dict):
                raise _fail(opts.spelled(lower), f"'{'.'.join(parts[:depth + 1])}' is "
                                                 "already set to a value that is not an object")
        if parts[-1] in where:
            raise _fail(opts.spelled(lower), f"storage option '{name}' is given twice (also in "
                                             f"'{STORAGE_JSON}' or with other dots)")
        where[parts[-1]] = value
    return options


def _path(opts: _Opts) -> str:
    """The root: option ``path``, or Spark Kafka's ``kafka.bootstrap.servers`` in its place
    (a broker address refused there); both given, they must name the same root."""
    raw, servers = opts.get("path"), opts.get("kafka.bootstrap.servers")
    if raw is None and not opts.keys():
        raise InvalidConfigError(NO_OPTIONS_POINTER)
    if servers is not None:
        # Imported here: the txlog.kafka package would make every reader's Python process
        # import the Kafka clients (docs/spark.md, the source's imports).
        from ..kafka.addresses import root_address

        servers = root_address("kafka.bootstrap.servers", servers)
    if raw is None:
        if servers is None:
            raise InvalidConfigError("missing option 'path' (the txlog root: a directory or "
                                     "URL; kafka.bootstrap.servers may name it instead)")
        return servers
    if not raw.strip():
        raise _fail("path", "is empty; give the txlog root (a directory or URL)")
    if servers is not None and normalised_url(raw) != normalised_url(servers):
        raise _fail("path", f"{raw.strip()!r} and kafka.bootstrap.servers {servers!r} name "
                            "different roots; give the root in one of them (or the same "
                            "root in both)")
    return raw.strip()


# --- read -------------------------------------------------------------------


@dataclass(frozen=True)
class ReadOptions:
    """A validated read: what to read, from where to where, and how fast (streaming).

    ``ending`` is None for streaming reads; the trigger limits are None for
    batch reads (Spark's Kafka source ignores them there too).
    """

    path: str
    subscription: Subscription
    starting: PositionSpec
    ending: PositionSpec | None
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    include_headers: bool = False
    isolation_level: IsolationLevel = "read_committed"
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int | None = None
    max_bytes_per_trigger: int | None = None
    abort_expired_transactions: bool = True
    group_id: str | None = None
    # The incarnation (topic id) each named topic must be, for a batch read (topicIds).
    topic_ids: tuple[tuple[str, str], ...] = ()
    # The fsspec backend's arguments for an object-store path (credentials included:
    # kept out of repr and comparisons).
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @staticmethod
    def parse(options: Mapping[str, str], streaming: bool) -> ReadOptions:
        """Check ``options`` for a batch (``streaming=False``) or streaming read."""
        opts = _Opts(options)
        _check_spelling(opts)
        path = _path(opts)
        if streaming:
            # Spark rejects these two by name; endingTimestamp is rejected here as
            # well, where Spark would silently ignore it and never end.
            for name in ("endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp"):
                if name in opts:
                    raise _fail(name, "not valid in streaming queries (a stream has no end); "
                                      "use a batch read to stop at an offset or time")
        if "kafka.auto.offset.reset" in opts:
            raise _fail("kafka.auto.offset.reset", "is not supported; set 'startingOffsets' "
                                                   "to 'earliest' or 'latest' instead")
        _refuse_kafka(opts, _KAFKA_REFUSED_READ)
        subscription = _subscription(opts)
        value = _READ.resolve(opts)
        strategy = value["startingOffsetsByTimestampStrategy"]
        starting = _position(opts, "starting", "latest" if streaming else "earliest", strategy)
        ending = None if streaming else _position(opts, "ending", "latest", strategy)
        if ending is not None:
            _check_batch_positions(starting, ending)
        if value["groupId"] is not None and not streaming:
            raise _fail("groupId", "records the offsets of each micro-batch a streaming query "
                                   "committed; a batch read has no progress to record")
        _warn_ignored(opts, "streaming read" if streaming else "batch read", _KAFKA_MAPPED_READ)
        return ReadOptions(
            path=path,
            subscription=subscription,
            starting=starting,
            ending=ending,
            fail_on_data_loss=value["failOnDataLoss"],
            min_partitions=value["minPartitions"],
            max_records_per_partition=value["maxRecordsPerPartition"],
            include_headers=value["includeHeaders"],
            isolation_level=_isolation(opts, value),
            **_trigger_limits(opts, value, streaming),
            abort_expired_transactions=value["abortExpiredTransactions"],
            group_id=value["groupId"],
            topic_ids=_topic_ids(opts, streaming),
            storage_options=_storage_options(opts),
        )


def _topic_ids(opts: _Opts, streaming: bool) -> tuple[tuple[str, str], ...]:
    """``topicIds``: JSON ``{"topic": "<topic id>"}``, the incarnation each named topic
    must still be when the read is planned (a DataFrame is planned again at each action);
    an option of txlog's own, not of Spark's Kafka source."""
    raw = opts.get("topicids")
    if raw is None:
        return ()
    example = '{"events": "<topic id, as txlog topics describe prints it>"}'
    if streaming:
        raise _fail("topicIds", "pins a batch read's topics to their incarnations; a "
                                "streaming query does not take it")
    ids = _json_object("topicIds", raw.strip(), example)
    for topic, topic_id in ids.items():
        _named("topicIds", topic, "topic")
        if not isinstance(topic_id, str) or not topic_id:
            raise _fail("topicIds", f"topic {topic!r} must map to its topic id as a string, "
                                    f"as in {example}; got {json.dumps(topic_id)}")
    return tuple(sorted(ids.items()))


# What a read's options take, in the order they are checked (the positions, the
# subscription and the kafka.* refusals are read on their own).
_ISOLATION = _one_of(("read_committed", "read_uncommitted"),
                     "'read_committed' or 'read_uncommitted'")
_READ = Settings(
    # Spark parses the strategy whenever positions are computed, so a bad value
    # fails even when no timestamp option is set; so does it here.
    Setting("startingOffsetsByTimestampStrategy", _one_of(("error", "latest"),
                                                          "'error' or 'latest'"), "error"),
    Setting("minPartitions", _positive(32)),
    Setting("maxRecordsPerPartition", _positive(64)),
    Setting("maxOffsetsPerTrigger", _positive(64)),
    Setting("minOffsetsPerTrigger", _positive(64)),
    # Spark's Kafka source: maxTriggerDelay defaults to 15 minutes.
    Setting("maxTriggerDelay", parse_duration_ms, 15 * 60_000),
    Setting("maxBytesPerTrigger", _ranged(parse_bytes, 1, math.inf, "must be positive")),
    Setting("isolation.level", _ISOLATION),
    Setting("kafka.isolation.level", _ISOLATION),
    Setting("failOnDataLoss", _boolean, True),
    Setting("includeHeaders", _boolean, False),
    Setting("abortExpiredTransactions", _boolean, True),
    Setting("groupId", _name_of("group id")),  # the group a stream records its batches in
)


def _trigger_limits(opts: _Opts, value: dict[str, Any], streaming: bool) -> dict[str, Any]:
    """A stream's limits per micro-batch; a batch read checks them and then ignores them,
    as Spark's Kafka source does."""
    max_offsets, min_offsets = value["maxOffsetsPerTrigger"], value["minOffsetsPerTrigger"]
    if max_offsets is not None and min_offsets is not None and min_offsets > max_offsets:
        raise _fail("minOffsetsPerTrigger", f"{min_offsets} is higher than "
                                            f"maxOffsetsPerTrigger ({max_offsets})")
    names = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
             "maxBytesPerTrigger")
    if not streaming:
        for name in names:
            if name in opts:
                log.warning("option %s is ignored in batch queries", name)
    fields = ("max_offsets_per_trigger", "min_offsets_per_trigger", "max_trigger_delay_ms",
              "max_bytes_per_trigger")
    return {f: value[name] if streaming else None for f, name in zip(fields, names)}


def _subscription(opts: _Opts) -> Subscription:
    given = [k for k in opts.keys() if k in _STRATEGIES]
    names = ", ".join(_STRATEGIES.values())
    if not given:
        raise _fail("subscribe", f"one of the options {names} must be given to say which "
                                 f"topics to read")
    if len(given) > 1:
        shown = ", ".join(opts.spelled(k) for k in given)
        raise _fail(opts.spelled(given[0]), f"only one of {names} may be given, got {shown}")
    key = given[0]
    option = _STRATEGIES[key]
    raw = opts.get(key) or ""
    if key == "subscribe":
        topics = [t.strip() for t in raw.split(",") if t.strip()]
        if not topics:
            raise _fail(option, f"no topics to subscribe to in {raw!r}; give a comma-separated "
                                f"list of topic names")
        for topic in topics:
            _named(option, topic, "topic")
        return Subscription.subscribe(topics)
    if key == "subscribepattern":
        pattern = raw.strip()
        if not pattern:
            raise _fail(option, f"the pattern is empty ({raw!r}); give a regular expression "
                                f"that topic names must match entirely")
        try:
            return Subscription.subscribe_pattern(pattern)
        except InvalidConfigError as exc:
            raise _fail(option, str(exc)) from None
    example = '{"topicA":[0,1],"topicB":[2,4]}'
    if not raw.strip().startswith("{"):
        raise _fail(option, f"expected topic partitions as JSON such as {example}, got {raw!r}")
    parsed = _json_object(option, raw.strip(), example)
    assignment: list[tuple[str, int]] = []
    for topic, partitions in parsed.items():
        _named(option, topic, "topic")
        if not isinstance(partitions, list) or \
                not all(is_int(p) and 0 <= p <= _INT_MAX for p in partitions):
            raise _fail(option, f"topic {topic!r} must map to a list of partition numbers "
                                f">= 0, as in {example}; got {json.dumps(partitions)}")
        assignment.extend((topic, p) for p in partitions)
    if not assignment:
        raise _fail(option, f"no topic partitions to assign in {raw!r}; expected e.g. {example}")
    return Subscription.assign(assignment)


def _isolation(opts: _Opts, value: dict[str, Any]) -> IsolationLevel:
    plain, kafka = value["isolation.level"], value["kafka.isolation.level"]
    if plain is not None and kafka is not None and plain != kafka:
        raise _fail("isolation.level", f"{opts['isolation.level']!r} contradicts "
                                       f"kafka.isolation.level {opts['kafka.isolation.level']!r}; "
                                       "give one of them")
    return plain or kafka or "read_committed"


# --- write ------------------------------------------------------------------


@dataclass(frozen=True)
class WriteOptions:
    """A validated write: where, with which guarantee, and how records are batched."""

    path: str
    topic: str | None = None
    delivery_guarantee: DeliveryGuarantee = "exactly_once"
    transactional_id_prefix: str | None = None
    transaction_timeout_ms: int = MAX_TRANSACTION_TIMEOUT_MS
    # None: the root's auto.create.topics.enable and num.partitions decide (root_config.py).
    create_topics: bool | None = None
    num_partitions: int | None = None
    compression: Literal["none", "lz4", "zstd"] = DEFAULT_COMPRESSION
    batch_size: int | None = None
    group_id: str | None = None
    checkpoint_location: str | None = None
    take_over_from: str | None = None
    txn_app_id: str | None = None
    txn_version: int | None = None
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # Kafka producer settings without a txlog spelling (kafka.linger.ms, kafka.max.request.size).
    linger_ms: int | None = None
    max_request_size: int | None = None
    # Payload bytes a task gathers into one data object (over all partitions); None: the
    # writer's default for the store (writer.py).
    data_object_bytes: int | None = None
    # Concurrent batch jobs without a transactional.id.prefix per pool (exactly_once.id_pool).
    transactional_id_pool_size: int = DEFAULT_POOL_SIZE

    @staticmethod
    def parse(options: Mapping[str, str], streaming: bool) -> WriteOptions:
        """Check ``options`` for a batch (``streaming=False``) or streaming write."""
        opts = _Opts(options)
        _check_spelling(opts)
        path = _path(opts)
        _refuse_kafka(opts, _KAFKA_REFUSED_WRITE)
        value = _WRITE.resolve(opts)
        guarantee = value["deliveryGuarantee"]
        if guarantee == "exactly_once":
            _check_transactional(value)
        _check_progress(opts, value, streaming)
        app_id, version = _txn(opts, streaming, guarantee)
        prefix = value["transactional.id.prefix"]
        _check_pool_size(value, prefix, app_id, streaming)
        if app_id is not None and prefix is None:
            from ..exactly_once.app_versions import default_prefix

            prefix = default_prefix(app_id)
        _warn_ignored(opts, "streaming write" if streaming else "batch write",
                      _KAFKA_MAPPED_WRITE)
        return WriteOptions(
            path=path,
            topic=value["topic"],
            delivery_guarantee=guarantee,
            transactional_id_prefix=prefix,
            transaction_timeout_ms=_agree(value, "transaction.timeout.ms",
                                          "kafka.transaction.timeout.ms",
                                          MAX_TRANSACTION_TIMEOUT_MS),
            create_topics=value["createTopics"],
            num_partitions=value["numPartitions"],
            compression=_agree(value, "compression", "kafka.compression.type",
                               DEFAULT_COMPRESSION),
            batch_size=_agree(value, "batch.size", "kafka.batch.size", None),
            group_id=value["groupId"],
            checkpoint_location=value["checkpointLocation"],
            take_over_from=value["takeOverFrom"],
            txn_app_id=app_id,
            txn_version=version,
            storage_options=_storage_options(opts),
            linger_ms=value["kafka.linger.ms"],
            max_request_size=value["kafka.max.request.size"],
            data_object_bytes=value["dataObjectBytes"],
            transactional_id_pool_size=value["transactionalIdPoolSize"] or DEFAULT_POOL_SIZE,
        )


# What a write's options take, in the order they are checked.  A txlog option and its
# kafka.* twin default to None here: _agree gives the one given, or the default.
_WRITE = Settings(
    Setting("topic", _name_of("topic")),
    Setting("deliveryGuarantee", _one_of(("exactly_once", "at_least_once"),
                                         "exactly_once or at_least_once", dashes=True),
            "exactly_once"),
    Setting("transactional.id.prefix", _name_of("transactional id prefix")),
    Setting("compression", _compression),
    Setting("kafka.compression.type", _compression),
    Setting("batch.size", _ranged(parse_bytes, 1, _INT_MAX, _BATCH_SIZE_RANGE)),
    Setting("kafka.batch.size", _kafka_batch_size),
    Setting("transaction.timeout.ms", _TIMEOUT_MS),
    Setting("kafka.transaction.timeout.ms", _TIMEOUT_MS),
    Setting("kafka.linger.ms", _ranged(_long("milliseconds"), 0, math.inf,
                                       "must not be negative, got {raw!r}")),
    Setting("kafka.max.request.size", _positive(32)),
    Setting("kafka.enable.idempotence", _boolean, True),
    Setting("numPartitions", _positive(32)),
    Setting("groupId", _name_of("group id")),
    Setting("checkpointLocation", _stripped),
    # A query id, checked once the write is known to be one it can mean something to.
    Setting("takeOverFrom", lambda name, raw: raw.strip()),
    Setting("dataObjectBytes", _ranged(parse_bytes, 1, 1 << 30, (
        "must be between 1 byte and 1g (each task holds about twice this in memory), "
        "got {raw!r}"))),
    Setting("createTopics", _boolean),
    Setting("transactionalIdPoolSize", _ranged(_long("a positive integer"), 1, MAX_POOL_SIZE,
                                               f"must be from 1 to {MAX_POOL_SIZE}, got "
                                               "{raw!r}")),
)
_TXN_VERSION = _ranged(_long("a non-negative integer"), 0, math.inf,
                       "must be a non-negative integer, got {raw!r}")


def _check_pool_size(value: dict[str, Any], prefix: str | None, app_id: str | None,
                     streaming: bool) -> None:
    """The pool serves batch jobs that name no prefix of their own: anywhere else the
    option would be silently meaningless."""
    if value["transactionalIdPoolSize"] is None:
        return
    if streaming:
        raise _fail("transactionalIdPoolSize", "applies to batch writes only (a stream sink "
                                               "re-uses the ids of its own prefix)")
    if prefix is not None or app_id is not None:
        raise _fail("transactionalIdPoolSize", "cannot go with transactional.id.prefix or "
                                               "txnAppId: a job with a prefix of its own "
                                               "owns it and takes no pooled one")


def _check_transactional(value: dict[str, Any]) -> None:
    """What an exactly_once write's transactions need."""
    if not value["kafka.enable.idempotence"]:
        raise _fail("kafka.enable.idempotence",
                    "false cannot go with deliveryGuarantee exactly_once: transactions need "
                    "an idempotent producer (Kafka refuses a transactional.id without it); "
                    "use deliveryGuarantee at_least_once")


def _check_progress(opts: _Opts, value: dict[str, Any], streaming: bool) -> None:
    """The options through which a streaming query's progress is kept, and what each needs."""
    exactly_once = value["deliveryGuarantee"] == "exactly_once"
    if value["groupId"] is not None:
        if not streaming:
            raise _fail("groupId", "records a streaming query's source offsets with each "
                                   "micro-batch; a batch write has none to record")
        if value["checkpointLocation"] is None:
            raise _fail("groupId", "needs the query's option checkpointLocation (set on "
                                   "writeStream), where the offsets each micro-batch read "
                                   "are taken from")
    if streaming and exactly_once and value["checkpointLocation"] is None:
        named = opts.get("queryName")
        raise _fail("checkpointLocation",
                    "a streaming write with deliveryGuarantee exactly_once needs it as an "
                    "option of writeStream (.option(\"checkpointLocation\", ...)): the sink "
                    "reads the query's id there, which says whether the query that owns "
                    "transactional.id.prefix is this one (and names the prefix when that "
                    "option is not given). A location set only through "
                    "spark.sql.streaming.checkpointLocation is not passed to data sources"
                    + (f" (with it, query {named!r} checkpoints in <that location>/{named}: "
                       "give that path as the option)" if named else ""))
    if value["takeOverFrom"] is not None:
        if not streaming or not exactly_once:
            raise _fail("takeOverFrom", "names the streaming query whose "
                                        "transactional.id.prefix an exactly_once stream "
                                        "write takes over; it means nothing here")
        if value["transactional.id.prefix"] is None:
            raise _fail("takeOverFrom", "needs transactional.id.prefix, the prefix to take "
                                        "over: without it the sink's prefix is derived from "
                                        "this query's own id (txlog-sink-<query id>), which "
                                        "no other query owns")
        _named("takeOverFrom", value["takeOverFrom"], "query id")


def _txn(opts: _Opts, streaming: bool, guarantee: DeliveryGuarantee
         ) -> tuple[str | None, int | None]:
    """Delta's txnAppId/txnVersion: both or neither, for an exactly_once batch write."""
    raw_app, raw_version = opts.get("txnAppId"), opts.get("txnVersion")
    if raw_app is None and raw_version is None:
        return None, None
    if raw_app is None or raw_version is None:
        given, missing = ("txnAppId", "txnVersion") if raw_version is None \
            else ("txnVersion", "txnAppId")
        raise _fail(missing, f"must be given with {given}: together they make a batch write "
                             "idempotent (the app's id and this write's version)")
    if streaming:
        raise _fail("txnAppId", "is for batch writes (such as those inside foreachBatch); a "
                                "stream write to txlog is idempotent by its micro-batch ids "
                                "already")
    if guarantee != "exactly_once":
        raise _fail("txnAppId", "needs deliveryGuarantee exactly_once: the version commits in "
                                "the write's transaction, and at_least_once has none")
    from ..exactly_once.app_versions import check_app_id  # writes only: see _path

    try:
        app_id = check_app_id(raw_app.strip())
    except InvalidConfigError as exc:
        raise _fail("txnAppId", str(exc)) from None
    return app_id, _TXN_VERSION("txnVersion", raw_version)


# --- kafka.* options: Spark's Kafka integration mapped onto txlog ------------
#
# A pipeline moved from format("kafka") carries Kafka client settings.  Each is
# honoured (mapped onto txlog's own option), refused (where Spark's Kafka source
# or sink refuses it, or where ignoring it would silently change what is
# written), or ignored with one WARNING per query naming it.  docs/spark.md has
# the table.

# Consumer settings Spark's Kafka source refuses (KafkaSourceProvider's
# validateGeneralOptions), with its reasons.  kafka.auto.offset.reset is refused
# in ReadOptions.parse with a pointer to startingOffsets.
_KAFKA_REFUSED_READ = {
    "kafka.key.deserializer":
        "keys are always read as bytes (Spark's ByteArrayDeserializer); deserialize them "
        "with DataFrame operations, e.g. CAST(key AS STRING)",
    "kafka.value.deserializer":
        "values are always read as bytes (Spark's ByteArrayDeserializer); deserialize them "
        "with DataFrame operations, e.g. CAST(value AS STRING) or from_json",
    "kafka.enable.auto.commit":
        "the source commits no offsets (Spark's Kafka source refuses it too): positions "
        "live in the query's checkpoint; use the sink's groupId option to record progress "
        "in a consumer group",
    "kafka.interceptor.classes":
        "interceptors can modify the payload, so they are not safe (Spark's Kafka source "
        "refuses them for that reason); txlog runs no Java classes either",
}
# Producer settings Spark's Kafka sink refuses (kafkaParamsForProducer), and those
# whose silent omission would write something other than what Kafka would.
_KAFKA_REFUSED_WRITE = {
    "kafka.key.serializer":
        "keys are always written as bytes (Spark's Kafka sink refuses it too); serialize "
        "them into a string or binary 'key' column",
    "kafka.value.serializer":
        "values are always written as bytes (Spark's Kafka sink refuses it too); serialize "
        "them into a string or binary 'value' column",
    "kafka.partitioner.class":
        "txlog places records with Kafka's default partitioner (murmur2 of the key) and "
        "cannot run a Java partitioner; choose partitions with a 'partition' column",
    "kafka.interceptor.classes":
        "producer interceptors can modify records and are Java classes txlog cannot run; "
        "transform the DataFrame before writing",
    "kafka.transactional.id":
        "every task needs its own transactional id (one shared id would fence all tasks "
        "but one); txlog derives them from option 'transactional.id.prefix', set that",
}
# Producer settings taken on writes (the kafka.* name -> what it maps onto).
_KAFKA_MAPPED_WRITE = ("kafka.bootstrap.servers", "kafka.compression.type", "kafka.batch.size",
                       "kafka.linger.ms", "kafka.max.request.size",
                       "kafka.transaction.timeout.ms", "kafka.enable.idempotence")
# Consumer settings taken on reads.
_KAFKA_MAPPED_READ = ("kafka.bootstrap.servers", "kafka.isolation.level",
                      "kafka.auto.offset.reset")
_COMPRESSIONS = ("none", "lz4", "zstd")
# Hashes of the option maps already warned about: Spark parses a query's options
# more than once (a stream writer per micro-batch), the warning is wanted once.
_WARNED: set[int] = set()


def _refuse_kafka(opts: _Opts, refused: Mapping[str, str]) -> None:
    for lower in opts.keys():
        if lower in refused:
            raise _fail(opts.spelled(lower), f"is not supported: {refused[lower]}")


def _warn_ignored(opts: _Opts, kind: str, known: tuple[str, ...]) -> list[str]:
    """Log, once per query (per distinct option map), the Kafka options that do nothing here."""
    ignored = sorted(opts.spelled(k) for k in opts.keys()
                     if (k.startswith("kafka.") and k not in known)
                     or k in {n.lower() for n in _KAFKA_ONLY})
    if ignored:
        fingerprint = hash((kind, tuple(sorted(
            (k, opts.get(k)) for k in opts.keys()))))
        if fingerprint not in _WARNED:
            _WARNED.add(fingerprint)
            log.warning("txlog %s ignores these Kafka client options (no Kafka client runs "
                        "here; see docs/spark.md, 'Kafka options'): %s", kind,
                        ", ".join(ignored))
    return ignored


def _agree(value: dict[str, Any], ours: str, theirs: str, default: Any) -> Any:
    """txlog's option and its kafka.* twin: either alone, or both with the same value."""
    if value[ours] is not None and value[theirs] is not None and value[ours] != value[theirs]:
        raise _fail(ours, f"{value[ours]!r} contradicts {theirs} {value[theirs]!r}; "
                          "give one of them")
    return next((v for v in (value[ours], value[theirs]) if v is not None), default)


# --- SQL: options from a catalog table ---------------------------------------

# Keys Spark adds beside a catalog table's OPTIONS when it hands them to a
# Python data source (PySpark 4.3, CREATE TABLE ... USING txlog): the table's
# properties, and each option again as "option.<name>".  A DataFrame's
# .option() calls never carry "provider" with "option.*" copies, so their
# presence tells a table definition from a read or write.
_TABLE_PROPERTY = "provider"
_TABLE_OPTION_PREFIX = "option."

CREDENTIALS_POINTER = (
    "credentials are not taken from a table's OPTIONS, which Spark stores in its catalog in "
    "clear text: leave them out of the table and give them to every Spark process through "
    "the environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN, "
    "AZURE_STORAGE_ACCOUNT_KEY, GOOGLE_APPLICATION_CREDENTIALS, ...) or the store's "
    "credentials file (~/.aws/credentials with AWS_PROFILE, a service-account JSON file); "
    "see docs/spark.md, 'SQL'")

NO_OPTIONS_POINTER = (
    "no options reached format(\"txlog\"), not even 'path' (the txlog root). If this is a "
    "table created with CREATE TABLE ... USING txlog: PySpark 4.3 hands a Python data source "
    "a catalog table's OPTIONS when the table is created, but none when it is queried or "
    "inserted into, so such a table can be defined but not read or written; use "
    "spark.read/readStream/write.format(\"txlog\").option(...) instead "
    "(see docs/spark.md, 'SQL')")


def is_table_definition(options: Mapping[str, str]) -> bool:
    """Whether ``options`` are a catalog table's (CREATE TABLE) rather than ``.option()`` calls."""
    keys = {str(k).lower() for k in options}
    return _TABLE_PROPERTY in keys and any(k.startswith(_TABLE_OPTION_PREFIX) for k in keys)


def check_table_options(options: Mapping[str, str]) -> None:
    """Refuse a CREATE TABLE whose OPTIONS hold a credential, naming the option, never its value.

    Only a table definition is refused: credentials given with ``.option()``
    live as long as the query and are redacted from logs and errors, while a
    catalog keeps a table's options for good and shows them (DESCRIBE,
    SHOW CREATE TABLE) to whoever may read the catalog.
    """
    if not is_table_definition(options):
        return
    for key, value in options.items():
        name = str(key)
        if name.lower().startswith(_TABLE_OPTION_PREFIX):
            continue  # the same option again, under Spark's prefix
        lower = name.lower()
        if lower.startswith(STORAGE_PREFIX) and is_secret_option(lower.rsplit(".", 1)[-1]):
            raise _fail(name, CREDENTIALS_POINTER)
        if lower == STORAGE_JSON:
            try:
                parsed = json.loads(str(value))
            except ValueError:
                parsed = None
            secret = _secret_name(parsed)
            if secret is not None:
                raise _fail(name, f"holds credential '{secret}'; {CREDENTIALS_POINTER}")


def _secret_name(options: Any, prefix: str = "") -> str | None:
    if not isinstance(options, dict):
        return None
    for name, value in options.items():
        if isinstance(value, dict):
            found = _secret_name(value, f"{prefix}{name}.")
            if found is not None:
                return found
        elif is_secret_option(str(name)):
            return f"{prefix}{name}"
    return None
