"""kafka-python 3.0's admin value types (``kafka.admin``), field for field.

What a ported admin program builds (``NewTopic``, ``NewPartitions``,
``ConfigResource``, ``OffsetSpec``...) and what it reads back
(``TransactionDescription``, the 2.x names' ``GroupInformation``...), with
kafka-python's names, fields and defaults, so that code which builds,
unpacks or compares them behaves the same.  ``Response`` stands for the
protocol responses kafka-python hands back as objects (``create_partitions``).
"""

from __future__ import annotations

from collections import namedtuple
from enum import Enum, IntEnum
from typing import Any, NamedTuple

from ..transactions.metadata import TxnState


class NewTopic:
    """DEPRECATED in kafka-python 3.0 (a dict or a list of names is the new form), still
    accepted by ``create_topics``."""

    def __init__(self, name: str, num_partitions: int = -1, replication_factor: int = -1,
                 replica_assignments: dict[int, list[int]] | None = None,
                 topic_configs: dict[str, Any] | None = None) -> None:
        self.name = name
        self.num_partitions = num_partitions
        self.replication_factor = replication_factor
        self.replica_assignments = replica_assignments or {}
        self.topic_configs = topic_configs or {}


class NewPartitions:
    """DEPRECATED in kafka-python 3.0 (an int total is the new form), still accepted by
    ``create_partitions``."""

    def __init__(self, total_count: int, new_assignments: list[list[int]] | None = None
                 ) -> None:
        self.total_count = total_count
        self.new_assignments = new_assignments


class ConfigResourceType(IntEnum):
    UNKNOWN = 0
    TOPIC = 2
    BROKER = 4
    BROKER_LOGGER = 8
    CLIENT_METRICS = 16
    GROUP = 32


class ConfigResource:
    """A resource whose configs are described or altered: ``configs`` is a list of keys
    (or a dict whose keys filter a describe, and whose values an alter sets)."""

    def __init__(self, resource_type: ConfigResourceType | str | int, name: str,
                 configs: Any = None) -> None:
        if not isinstance(resource_type, ConfigResourceType):
            resource_type = (ConfigResourceType(resource_type) if isinstance(resource_type, int)
                             else ConfigResourceType[str(resource_type).upper()])
        self.resource_type = resource_type
        self.name = name
        self.configs = configs

    def __str__(self) -> str:
        return f"ConfigResource {self.name}={self.resource_type}"

    def __repr__(self) -> str:
        return f"ConfigResource({self.resource_type}, {self.name}, {self.configs})"


class AlterConfigOp(IntEnum):
    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


class OffsetSpec(IntEnum):
    """Which offset ``list_partition_offsets`` and ``reset_group_offsets`` look up."""

    LATEST = -1
    EARLIEST = -2
    MAX_TIMESTAMP = -3
    EARLIEST_LOCAL = -4
    LATEST_TIERED = -5


class OffsetTimestamp(int):
    """A time in epoch milliseconds, told apart from a plain offset: the first offset whose
    timestamp is at least it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"OffsetTimestamp({int(self)})"


# kafka-python's name for the coordinator's states, the same as txlog's (Kafka's), and
# UNKNOWN for a state a newer broker might report.
TransactionState = Enum(  # type: ignore[misc]
    "TransactionState", [(s.name, s.value) for s in TxnState] + [("UNKNOWN", "Unknown")],
    type=str, module=__name__)


class TransactionListing(NamedTuple):
    transactional_id: str
    producer_id: int
    state: TransactionState


class TransactionDescription(NamedTuple):
    coordinator_id: int
    state: TransactionState
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_time_ms: int
    topic_partitions: set[Any]


class ProducerState(NamedTuple):
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_transaction_start_offset: int


class PartitionProducerState(NamedTuple):
    active_producers: list[ProducerState]


# kafka-python 2.x's describe_consumer_groups() rows, which its older names return.
MemberInformation = namedtuple("MemberInformation", ["member_id", "client_id", "client_host",
                                                     "member_metadata", "member_assignment"])
GroupInformation = namedtuple("GroupInformation", ["error_code", "group", "state",
                                                   "protocol_type", "protocol", "members",
                                                   "authorized_operations"])


class Response:
    """A protocol response as kafka-python returns one: fields as attributes (nested rows
    too) and ``to_dict()``."""

    def __init__(self, **fields: Any) -> None:
        for name, value in fields.items():
            if isinstance(value, list):
                value = [Response(**v) if isinstance(v, dict) else v for v in value]
            setattr(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        return {name: [v.to_dict() if isinstance(v, Response) else v for v in value]
                if isinstance(value, list) else value for name, value in vars(self).items()}

    def __repr__(self) -> str:
        return f"Response({self.to_dict()!r})"
