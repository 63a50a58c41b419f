"""The admin client's topics, partitions, configs and records: kafka-python 3.0's
``KafkaAdminClient`` methods over the Root's topic operations, the ones the CLI's
``txlog topics``, ``offsets`` and ``delete-records`` call.

A topic's partitions are reported as held by one pseudo-node, ``0``: the
storage, which every process reads and writes (leader 0, replicas and ISR
``[0]``), so a program that waits for leaders finds them at once.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..admin import upkeep
from ..clients.positions import bounds, offset_for_timestamp, read_limit
from ..errors import InvalidConfigError, TxlogError
from ..partition.isolation import READ_COMMITTED, READ_UNCOMMITTED
from ..partition.producer_state import PRODUCER_ID_EXPIRATION
from ..root.root import Root
from ..root.topics import (ALTERABLE_CONFIG, TopicDescription, check_alteration, check_growth,
                           config_value, effective_config)
from .admin_types import (AlterConfigOp, ConfigResourceType, NewPartitions, NewTopic,
                          OffsetSpec, OffsetTimestamp, Response)
from .errors import (InvalidConfigurationError, InvalidPartitionsError,
                     InvalidReplicationFactorError, InvalidRequestError, KafkaError,
                     UnknownTopicOrPartitionError, UnsupportedVersionError, kafka_error_for,
                     translated)
from .structs import OffsetAndTimestamp, TopicPartition

NODE = 0  # the one pseudo-node: the storage every process shares
# Kafka's num.partitions default, for a new topic that names no partition count.
DEFAULT_PARTITIONS = 1
# Kafka's figure for "authorized operations were not asked for".
NO_OPERATIONS = -2147483648
_INT_SETTINGS = ("segment.bytes", "max.message.bytes", PRODUCER_ID_EXPIRATION)
_FILTERS = ("all", "dynamic", "modified", "default", "static")


def as_kafka_error(exc: Exception,
                   invalid: type[KafkaError] = InvalidConfigurationError) -> KafkaError:
    """A native error under its kafka-python name (this layer's own pass through); a
    refused value is ``invalid``, the error code Kafka answers that request with."""
    if isinstance(exc, KafkaError):
        return exc
    new = invalid(*exc.args) if isinstance(exc, InvalidConfigError) else kafka_error_for(exc)
    if new is None:
        raise exc
    new.__cause__ = exc
    return new


def new_topic_specs(new_topics: Any) -> list[tuple[str, int, int, Any, dict]]:
    """``create_topics``' three input forms as (name, partitions, replication, assignments,
    configs): a dict of options per name, a list of names, or (deprecated) NewTopics."""
    if isinstance(new_topics, dict):
        return [(name, o.get("num_partitions", -1), o.get("replication_factor", -1),
                 o.get("assignments") or {}, o.get("configs") or {})
                for name, o in new_topics.items()]
    new_topics = list(new_topics)
    if new_topics and all(isinstance(t, str) for t in new_topics):
        return [(name, -1, -1, {}, {}) for name in new_topics]
    if new_topics and all(isinstance(t, NewTopic) for t in new_topics):
        return [(t.name, t.num_partitions, t.replication_factor, t.replica_assignments,
                 t.topic_configs) for t in new_topics]
    raise ValueError(f"No valid topics found in new_topics: {new_topics}")


def config_entry(desc: TopicDescription, key: str, value: Any) -> dict[str, Any]:
    """One key as DescribeConfigs describes it (kafka-python's processed form)."""
    kind = ("INT" if key in _INT_SETTINGS else "LONG") if isinstance(value, int) else "STRING"
    return {"value": str(value), "read_only": key not in ALTERABLE_CONFIG,
            "config_source": "DYNAMIC_TOPIC_CONFIG" if key in desc.config else "DEFAULT_CONFIG",
            "is_sensitive": False, "synonyms": [], "config_type": kind,
            "documentation": None}


def _refuse_assignments(name: str, replication: Any, assignments: Any) -> None:
    """Replication factors are taken (-1 or at least 1; storage replaces replication);
    replica assignments are refused."""
    if replication is not None and (not isinstance(replication, int) or
                                    isinstance(replication, bool) or
                                    replication == 0 or replication < -1):
        raise InvalidReplicationFactorError(
            f"topic {name!r}: replication_factor must be -1 or at least 1, not "
            f"{replication!r} (it has no effect: storage replaces replication)")
    if assignments:
        raise InvalidRequestError(
            f"topic {name!r}: replica assignments are refused: txlog has no brokers to "
            "place replicas on (storage replaces replication)")


def error_code(exc: KafkaError) -> int:
    """Its Kafka error code; -1 (UNKNOWN_SERVER_ERROR) for an error that has none."""
    return getattr(exc, "errno", None) or -1


def _failed_topic(name: str, exc: KafkaError) -> dict[str, Any]:
    return {"name": name, "topic_id": None, "error_code": error_code(exc),
            "error_message": str(exc), "topic_config_error_code": 0, "num_partitions": -1,
            "replication_factor": -1}


def _raise_first(errors: list[KafkaError]) -> None:
    if errors:
        raise errors[0]


class TopicAdmin:
    """Topics, partitions, configs, offsets and records (see the module)."""

    _root: Root

    def list_topics(self) -> list[str]:
        with translated():
            return self._root.topics()

    def describe_topics(self, topics: list[Any] | None = None) -> list[dict[str, Any]]:
        """Each topic as MetadataResponse describes it; an unknown one with error code 3."""
        with translated():
            names = self._root.topics() if topics is None else [self._topic_name(t)
                                                                 for t in topics]
            return [self._metadata(name) for name in names]

    def _metadata(self, name: str) -> dict[str, Any]:
        try:
            desc = self._root.describe_topic(name, refresh=True)
        except TxlogError as exc:
            return {"error_code": error_code(as_kafka_error(exc)), "name": name, "topic_id": None,
                    "is_internal": False, "partitions": [],
                    "topic_authorized_operations": NO_OPERATIONS}
        partitions = [{"error_code": 0, "partition_index": p, "leader_id": NODE,
                       "leader_epoch": -1, "replica_nodes": [NODE], "isr_nodes": [NODE],
                       "offline_replicas": []} for p in range(desc.partitions)]
        return {"error_code": 0, "name": name, "topic_id": uuid.UUID(hex=desc.topic_id),
                "is_internal": False, "partitions": partitions,
                "topic_authorized_operations": NO_OPERATIONS}

    def _topic_name(self, topic: Any) -> str:
        """A topic named by name or (KIP-516) by its id."""
        if not isinstance(topic, uuid.UUID):
            return topic
        for name in self._root.topics():
            if self._root.describe_topic(name).topic_id == topic.hex:
                return name
        raise UnknownTopicOrPartitionError(f"no topic has id {topic} in {self._root.url}")

    def create_topics(self, new_topics: Any, timeout_ms: int | None = None,
                      validate_only: bool = False, raise_errors: bool = True,
                      wait_for_metadata: bool = False) -> dict[str, Any]:
        """Create each topic; a failed one has its error code in the result (and with
        ``raise_errors``, the first failure is raised once every topic was tried, as a
        broker answers for each).  ``num_partitions`` -1 is Kafka's default of 1;
        ``replication_factor`` is taken and has no effect; ``timeout_ms`` has none
        either (a create is one storage publish); ``wait_for_metadata`` returns at once
        (a created topic is seen by every process at once)."""
        if validate_only and wait_for_metadata:
            raise ValueError("validate_only and wait_for_metadata are mutually exclusive")
        results, errors = [], []
        for name, partitions, replication, assignments, configs in new_topic_specs(new_topics):
            partitions = DEFAULT_PARTITIONS if partitions == -1 else partitions
            try:
                _refuse_assignments(name, replication, assignments)
                desc = self._root.create_topic(
                    name, partitions, {k: config_value(v) for k, v in configs.items()},
                    validate_only=validate_only)
            except (TxlogError, KafkaError) as exc:
                errors.append(as_kafka_error(exc))
                results.append(_failed_topic(name, errors[-1]))
                continue
            results.append({"name": name, "topic_id": uuid.UUID(hex=desc.topic_id),
                            "error_code": 0, "error_message": None,
                            "topic_config_error_code": 0, "num_partitions": partitions,
                            "replication_factor": replication,
                            "configs": {k: config_entry(desc, k, v)
                                        for k, v in sorted(effective_config(desc).items())}})
        if raise_errors:
            _raise_first(errors)
        return {"topics": results}

    def wait_for_topics(self, topic_names: list[str], timeout_ms: int = 10000) -> None:
        """Returns once every topic exists: at once, or UnknownTopicOrPartitionError (a
        topic is visible to every process as soon as it is created)."""
        with translated():
            for name in topic_names:
                self._root.describe_topic(name)

    def delete_topics(self, topics: list[Any], timeout_ms: int | None = None,
                      raise_errors: bool = True) -> dict[str, Any]:
        results, errors = [], []
        for topic in topics:
            try:
                name = self._topic_name(topic)
                self._root.delete_topic(name)
            except (TxlogError, KafkaError) as exc:
                errors.append(as_kafka_error(exc))
                results.append({"name": topic if isinstance(topic, str) else None,
                                "topic_id": topic if isinstance(topic, uuid.UUID) else None,
                                "error_code": error_code(errors[-1]),
                                "error_message": str(exc)})
                continue
            results.append({"name": name, "topic_id": None, "error_code": 0,
                            "error_message": None})
        if raise_errors:
            _raise_first(errors)
        return {"topics": results}

    def create_partitions(self, topic_partitions: dict[str, Any], timeout_ms: int | None = None,
                          validate_only: bool = False, raise_errors: bool = True) -> Response:
        """Grow each topic to its new total (an int, ``{"count": n}``, or a NewPartitions);
        assignments of the new partitions are refused (no brokers to place them on)."""
        results, errors = [], []
        for name, spec in topic_partitions.items():
            try:
                if isinstance(spec, NewPartitions):
                    total, assignments = spec.total_count, spec.new_assignments
                elif isinstance(spec, dict):
                    total, assignments = spec["count"], spec.get("assignments")
                else:
                    total, assignments = spec, None
                _refuse_assignments(name, None, assignments)
                if validate_only:
                    check_growth(self._root.describe_topic(name, refresh=True), total)
                else:
                    self._root.create_partitions(name, total)
            except (TxlogError, KafkaError) as exc:
                errors.append(as_kafka_error(exc, InvalidPartitionsError))
                results.append({"name": name, "error_code": error_code(errors[-1]),
                                "error_message": str(exc)})
                continue
            results.append({"name": name, "error_code": 0, "error_message": None})
        if raise_errors:
            _raise_first(errors)
        return Response(throttle_time_ms=0, results=results)

    def _topic_resource(self, resource: Any) -> TopicDescription:
        """A TOPIC resource's description; other kinds are refused by name."""
        kind = ConfigResourceType(resource.resource_type)
        if kind is not ConfigResourceType.TOPIC:
            raise InvalidRequestError(
                f"ConfigResource {kind.name} {resource.name!r}: txlog has no brokers, "
                "loggers or group configs; its settings are per topic (TOPIC resources)")
        with translated():
            return self._root.describe_topic(resource.name, refresh=True)

    def describe_configs(self, config_resources: list[Any], include_synonyms: bool = False,
                         config_filter: Any = "modified") -> dict[str, Any]:
        """``{"topic": {name: {key: entry}}}``; ``config_filter`` as kafka-python's (modified:
        the keys the topic sets; dynamic: the alterable ones; default; all; static: none,
        as there is no broker).  Synonyms: there are none (no broker-level settings)."""
        chosen = _FILTERS[config_filter] if isinstance(config_filter, int) else \
            str(getattr(config_filter, "name", config_filter)).lower()
        if chosen not in _FILTERS:
            raise ValueError(f"config_filter {config_filter!r}: one of {', '.join(_FILTERS)}")
        out: dict[str, Any] = {}
        for resource in config_resources:
            desc = self._topic_resource(resource)
            wanted = None if resource.configs is None else list(resource.configs)
            entries = {}
            for key, value in sorted(effective_config(desc).items()):
                keep = {"all": True, "dynamic": key in ALTERABLE_CONFIG, "static": False,
                        "modified": key in desc.config, "default": key not in desc.config}
                if keep[chosen] and (wanted is None or key in wanted):
                    entries[key] = config_entry(desc, key, value)
            out.setdefault("topic", {})[resource.name] = entries
        return out

    def alter_configs(self, config_resources: list[Any], validate_only: bool = False,
                      raise_on_unknown: bool = True, incremental: bool | None = None
                      ) -> dict[str, Any]:
        """Set (a bare value or ``(SET, value)``) or delete (``(DELETE, _)``: back to
        Kafka's default) topic settings, per resource ``"OK"`` or the error.  Only
        retention.ms, retention.bytes and segment.bytes can change (the others are
        read by appenders as the topic was created); APPEND and SUBTRACT are refused
        (txlog has no list settings).  ``incremental`` False changes nothing: the keys not
        given keep their values either way, as kafka-python arranges."""
        out: dict[str, Any] = {}
        for resource in config_resources:
            desc = self._topic_resource(resource)
            configs = resource.configs or {}
            unknown = sorted(set(configs) - set(ALTERABLE_CONFIG))
            if unknown and raise_on_unknown:
                raise ValueError(f"Unrecognized configs: {set(unknown)} (alterable here: "
                                 f"{', '.join(ALTERABLE_CONFIG)})")
            out.setdefault("topic", {})[resource.name] = self._alter_one(desc, configs,
                                                                         validate_only)
        return out

    def _alter_one(self, desc: TopicDescription, configs: dict[str, Any],
                   validate_only: bool) -> str:
        changes: dict[str, Any] = {}
        deletes = []
        try:
            for key, given in configs.items():
                op, value = given if isinstance(given, tuple) else (AlterConfigOp.SET, given)
                op = AlterConfigOp[op.upper()] if isinstance(op, str) else AlterConfigOp(op)
                if op is AlterConfigOp.DELETE:
                    deletes.append(key)
                elif op is AlterConfigOp.SET:
                    changes[key] = config_value(value)
                else:
                    raise InvalidRequestError(f"{key}: {op.name} is refused: txlog has no "
                                              "list settings to append to or subtract from")
            check_alteration(desc.name, changes, deletes)
            if not validate_only:
                self._root.alter_topic_config(desc.name, changes, deletes)
        except (TxlogError, KafkaError) as exc:
            return str(as_kafka_error(exc))
        return "OK"

    def list_partition_offsets(self, topic_partition_specs: dict[Any, Any],
                               isolation_level: Any = 0, timeout_ms: int | None = None
                               ) -> dict[Any, OffsetAndTimestamp]:
        """For each partition, the offset its spec names (ListOffsets, as ``txlog offsets
        --time``): EARLIEST the log start, LATEST the log end (read_committed, level 1:
        the LSO), a timestamp the first record at or after it, else -1 and -1.
        ``isolation_level``: kafka-python's IsolationLevel, or its value or name."""
        level = READ_COMMITTED if isolation_level in (1, READ_COMMITTED) else READ_UNCOMMITTED
        out = {}
        with translated():
            for tp, spec in topic_partition_specs.items():
                out[TopicPartition(*tp)] = self._offset_for(tp, spec, level)
        return out

    def _offset_for(self, tp: Any, spec: Any, level: str) -> OffsetAndTimestamp:
        topic, partition = tp
        if spec == OffsetSpec.EARLIEST and not isinstance(spec, OffsetTimestamp):
            return OffsetAndTimestamp(bounds(self._root, topic, partition).log_start, -1, None)
        if spec == OffsetSpec.LATEST and not isinstance(spec, OffsetTimestamp):
            return OffsetAndTimestamp(read_limit(self._root, topic, partition, level), -1, None)
        if int(spec) < 0:
            raise UnsupportedVersionError(
                f"{topic}-{partition}: OffsetSpec {spec!r} is refused: txlog looks offsets up "
                "by EARLIEST, LATEST or a timestamp (no tiered storage; MAX_TIMESTAMP would "
                "scan every record)")
        hit = offset_for_timestamp(self._root, topic, partition, int(spec), level)
        return OffsetAndTimestamp(*(hit or (-1, -1)), None)

    def delete_records(self, records_to_delete: dict[Any, int], timeout_ms: int | None = None,
                       partition_leader_id: int | None = None) -> dict[Any, dict[str, Any]]:
        """Move each partition's log start up to its offset (-1: the log end), all checked
        before any moves (``txlog delete-records``); per partition its new low watermark.
        ``partition_leader_id`` must be None or 0, the one node."""
        if partition_leader_id not in (None, NODE):
            raise InvalidRequestError(f"partition_leader_id={partition_leader_id!r}: txlog's "
                                      f"one node is {NODE} (the storage)")
        with translated():
            low = upkeep.delete_records(self._root, {(tp[0], tp[1]): offset for tp, offset
                                                     in records_to_delete.items()})
        return {TopicPartition(*tp): {"partition_index": tp[1], "low_watermark": lw,
                                      "error_code": 0} for tp, lw in low.items()}
