"""kafka-python's value types (``kafka.structs`` and friends), field for field, and their
conversion to the native clients' offsets.

Named tuples with kafka-python 3.0's fields and defaults, so that code which
unpacks them, reads them by name or builds them (``TopicPartition("t", 0)``,
``OffsetAndMetadata(42, "", -1)``) behaves the same.  A ``TopicPartition`` is
a plain ``(topic, partition)`` tuple underneath, which is what the native
clients take.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

from ..integers import is_int
from .errors import KafkaConfigurationError

TopicPartition = namedtuple("TopicPartition", ["topic", "partition"])

OffsetAndMetadata = namedtuple("OffsetAndMetadata", ["offset", "metadata", "leader_epoch"],
                               defaults=[None, "", -1])

OffsetAndTimestamp = namedtuple("OffsetAndTimestamp", ["offset", "timestamp", "leader_epoch"])


class MemberState:
    UNJOINED = "<unjoined>"
    REBALANCING = "<rebalancing>"
    STABLE = "<stable>"


ConsumerGroupMetadata = namedtuple(
    "ConsumerGroupMetadata", ["group_id", "generation_id", "member_id", "group_instance_id",
                              "state"],
    defaults=[None, -1, "", None, MemberState.UNJOINED])

# leader_epoch is -1 (txlog has no leaders) and checksum None, as kafka-python
# gives for message format v2.
ConsumerRecord = namedtuple(
    "ConsumerRecord", ["topic", "partition", "leader_epoch", "offset", "timestamp",
                       "timestamp_type", "key", "value", "headers", "checksum",
                       "serialized_key_size", "serialized_value_size", "serialized_header_size"])

RecordMetadata = namedtuple(
    "RecordMetadata", ["topic", "partition", "topic_partition", "offset", "timestamp",
                       "checksum", "serialized_key_size", "serialized_value_size",
                       "serialized_header_size"])


class ConsumerRebalanceListener:
    """kafka-python's rebalance callbacks; ``subscribe(listener=...)`` takes one.

    Each receives a list of ``TopicPartition``.  Called by group membership
    (docs/clients.md); with manual ``assign()`` there is no rebalance.
    """

    def on_partitions_revoked(self, revoked: list[Any]) -> None:
        pass

    def on_partitions_assigned(self, assigned: list[Any]) -> None:
        pass

    def on_partitions_lost(self, lost: list[Any]) -> None:
        self.on_partitions_revoked(lost)


def plain_offsets(offsets: dict[Any, Any], what: str) -> dict[tuple[str, int], int]:
    """``{TopicPartition: OffsetAndMetadata | int}`` as the core's ``{(topic, partition): int}``.

    txlog's group store keeps no metadata string per offset, so a non-empty
    one is refused rather than dropped.
    """
    if not isinstance(offsets, dict):
        raise TypeError(f"{what}: offsets must be a dict of TopicPartition to "
                        f"OffsetAndMetadata, not {type(offsets).__name__}")
    out: dict[tuple[str, int], int] = {}
    for tp, value in offsets.items():
        if not isinstance(tp, tuple) or len(tp) != 2:
            raise TypeError(f"{what}: keys must be TopicPartition, not {tp!r}")
        if isinstance(value, OffsetAndMetadata):
            if value.metadata:
                raise KafkaConfigurationError(
                    f"{what}: {tp[0]}-{tp[1]}: txlog's group offsets keep no metadata "
                    f"string; OffsetAndMetadata metadata={value.metadata!r} is refused (use '')")
            value = value.offset
        if not is_int(value) or value < 0:
            raise KafkaConfigurationError(
                f"{what}: {tp[0]}-{tp[1]}: offset must be a non-negative int, not {value!r}")
        out[(tp[0], tp[1])] = value
    return out
