"""A topic's description, the rules its config obeys, and the records of its two chains.

A topic is created once (``topic.json``, format/topic_ids.py) and then changes only by
new versions of two chains: its partition count (partitions added) and its config
(retention and segment settings altered).  Each version names the incarnation it
belongs to (``topic_id``), so a chain left over from a deleted topic of the same name
is never taken for this one's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidConfigError
from ..partition.compaction import DEFAULT_SEGMENT_BYTES
from ..partition.producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS, PRODUCER_ID_EXPIRATION
from .value_schema import VALUE_FORMAT, VALUE_FORMATS, VALUE_SCHEMA, check_value_config, schema_problem

MAX_PARTITIONS = 10_000

# Topic configuration keys we honour (Kafka's names).
_TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
# Kafka's defaults for the keys that only compaction and retention read.
TOPIC_DEFAULTS: dict[str, Any] = {"retention.ms": 7 * 24 * 3600 * 1000, "retention.bytes": -1,
                                  "segment.bytes": DEFAULT_SEGMENT_BYTES,
                                  PRODUCER_ID_EXPIRATION: DEFAULT_PRODUCER_ID_EXPIRATION_MS}
MIN_SEGMENT_BYTES = 1024
# txlog's own key (not Kafka's): "true" has `txlog maintain` sync the topic's Iceberg
# table before each retention run (docs/tables.md); unset or "false": it does not.
TABLE_SYNC = "txlog.table.sync"
# txlog's own key: the time bucket of the table's partition spec (beside the Kafka
# partition), fixed when the table is created (docs/tables.md, "Layout"); unset: day.
TABLE_TIME_BUCKET = "txlog.table.time-bucket"
TIME_BUCKETS = ("hour", "day", "none")
# txlog's own key: "true" keeps retention's time and size rules from deleting a segment
# that holds records the topic's table does not cover yet (docs/tables.md).
TABLE_HOLD_RETENTION = "txlog.table.hold-retention"
# What ``alter_topic_config`` may change: keys that appenders do not cache.
ALTERABLE_CONFIG = ("retention.ms", "retention.bytes", "segment.bytes", TABLE_SYNC,
                    TABLE_TIME_BUCKET, TABLE_HOLD_RETENTION, VALUE_FORMAT, VALUE_SCHEMA)


def _int_at_least(low: int) -> Any:
    def check(value: Any) -> str | None:
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            return f"an integer of at least {low}"
        return None
    return check


_CONFIG_RULES = {
    "message.timestamp.type":
        lambda v: None if v in _TIMESTAMP_TYPES else f"one of {_TIMESTAMP_TYPES}",
    "max.message.bytes": _int_at_least(1),
    "retention.ms": _int_at_least(-1),  # -1: no limit by time
    "retention.bytes": _int_at_least(-1),  # -1: no limit by size
    "segment.bytes": _int_at_least(MIN_SEGMENT_BYTES),
    TABLE_SYNC: lambda v: None if v in ("true", "false") else "true or false",
    TABLE_HOLD_RETENTION: lambda v: None if v in ("true", "false") else "true or false",
    TABLE_TIME_BUCKET: lambda v: None if v in TIME_BUCKETS else f"one of {TIME_BUCKETS}",
    # txlog's own too: how a sync parses the values into typed columns (value_schema.py).
    VALUE_FORMAT: lambda v: None if v in VALUE_FORMATS else f"one of {VALUE_FORMATS}",
    VALUE_SCHEMA: schema_problem,
    # Not alterable: the producer state is a fold every process must compute alike.
    PRODUCER_ID_EXPIRATION: _int_at_least(1),
}


def config_value(value: Any) -> Any:
    """A setting as text gives it (the CLI's KEY=VALUE, a Kafka admin client's string
    values): digits become an int, as the integer settings need; anything else stays."""
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value


def _check_config(topic: str, config: dict[str, Any]) -> dict[str, Any]:
    checked: dict[str, Any] = {}
    for key, value in config.items():
        rule = _CONFIG_RULES.get(key)
        if rule is None:
            raise InvalidConfigError(
                f"topic {topic!r}: unknown config {key!r} (known: {', '.join(_CONFIG_RULES)})")
        problem = rule(value)
        if problem is not None:
            raise InvalidConfigError(f"topic {topic!r}: {key} must be {problem}, not {value!r}")
        checked[key] = value
    return checked


def check_new_topic(name: str, partitions: Any, config: dict[str, Any] | None) -> dict[str, Any]:
    """A new topic's config, checked, once its partition count is known to be an integer
    from 1 to ``MAX_PARTITIONS``."""
    if not isinstance(partitions, int) or isinstance(partitions, bool) or \
            not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidConfigError(
            f"topic {name!r}: partitions must be an integer from 1 to {MAX_PARTITIONS}, "
            f"not {partitions!r}")
    checked = _check_config(name, dict(config or {}))
    check_value_config(name, checked)
    return checked


def check_alteration(name: str, set: dict[str, Any], delete: list[str] | tuple[str, ...]
                     ) -> dict[str, Any]:
    """The settings ``alter_topic_config`` may set, checked; only alterable keys may change."""
    for key in [*set, *delete]:
        if key not in ALTERABLE_CONFIG:
            raise InvalidConfigError(
                f"topic {name!r}: config {key!r} cannot be altered (alterable: "
                f"{', '.join(ALTERABLE_CONFIG)})")
    return _check_config(name, set)


@dataclass(frozen=True)
class TopicDescription:
    name: str
    partitions: int
    config: dict[str, Any] = field(default_factory=dict)
    created_ms: int = 0
    topic_id: str = ""  # this incarnation of the topic (KIP-516); see format/topic_ids.py

    def setting(self, key: str) -> Any:
        """A config value, Kafka's default where the topic sets none."""
        return self.config.get(key, TOPIC_DEFAULTS.get(key))


def effective_config(desc: TopicDescription) -> dict[str, Any]:
    """Every setting in force: the topic's own, and Kafka's defaults for the rest."""
    return {**TOPIC_DEFAULTS, **desc.config}


def check_growth(desc: TopicDescription, total: Any) -> None:
    """``create_partitions``' new total adds partitions to the topic's count."""
    if not isinstance(total, int) or isinstance(total, bool) or \
            not desc.partitions < total <= MAX_PARTITIONS:
        raise InvalidConfigError(
            f"topic {desc.name!r} has {desc.partitions} partitions; the new total must be an "
            f"integer from {desc.partitions + 1} to {MAX_PARTITIONS}, not {total!r} "
            "(partitions can only be added)")


def _of_incarnation(desc: TopicDescription, value: dict | None) -> dict | None:
    """A chain version, if it belongs to ``desc``'s incarnation of the topic (else None)."""
    return value if value is not None and value.get("topic_id") == desc.topic_id else None


@dataclass(frozen=True)
class PartitionCount:
    """A version of the partition-count chain: partitions were added, ``count`` in all."""

    count: int
    topic_id: str

    @classmethod
    def latest(cls, desc: TopicDescription, value: dict | None) -> PartitionCount | None:
        """The chain's newest version, if partitions were added to this incarnation."""
        mine = _of_incarnation(desc, value)
        return None if mine is None else cls(mine["count"], desc.topic_id)

    @classmethod
    def current(cls, desc: TopicDescription, value: dict | None) -> PartitionCount:
        """The count as the chain's newest version says, else as the topic was created."""
        return cls.latest(desc, value) or cls(desc.partitions, desc.topic_id)

    def grown_to(self, name: str, total: int) -> PartitionCount:
        """The next version: ``total`` partitions, more than another process made meanwhile."""
        if self.count >= total:
            raise InvalidConfigError(
                f"topic {name!r} already has {self.count} partitions (another process added "
                f"some); the new total must be more than that, not {total}")
        return PartitionCount(total, self.topic_id)

    def encode(self) -> dict[str, Any]:
        return {"count": self.count, "topic_id": self.topic_id}


@dataclass(frozen=True)
class TopicConfig:
    """A version of the config chain: the topic's whole config after an alteration."""

    config: dict[str, Any]
    topic_id: str

    @classmethod
    def latest(cls, desc: TopicDescription, value: dict | None) -> TopicConfig | None:
        """The chain's newest version, if this incarnation's config was ever altered."""
        mine = _of_incarnation(desc, value)
        return None if mine is None else cls(dict(mine["config"]), desc.topic_id)

    @classmethod
    def current(cls, desc: TopicDescription, value: dict | None) -> TopicConfig:
        """The config as last altered, else as the topic was created (``topic.json``)."""
        mine = _of_incarnation(desc, value)
        return cls(desc.config if mine is None else mine["config"], desc.topic_id)

    def altered(self, set: dict[str, Any], delete: list[str] | tuple[str, ...]) -> TopicConfig:
        """The next version: ``set`` applied, ``delete``'s keys back to Kafka's defaults."""
        config = {k: v for k, v in {**self.config, **set}.items() if k not in delete}
        return TopicConfig(config, self.topic_id)

    def encode(self) -> dict[str, Any]:
        return {"config": self.config, "topic_id": self.topic_id}
