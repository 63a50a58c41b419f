"""The admin client's consumer groups: kafka-python 3.0's group methods, and the 2.x names
(``list_consumer_groups``...) with 2.x's result shapes, over the group store the CLI's
``txlog groups`` reads and changes.

A group is listed once it has committed offsets (as ``txlog groups list``).
Its state is Kafka's name for what its members' chain and heartbeats show.
Offsets are altered or reset only while the group has no live member, as a
broker refuses; ``group_coordinator_id`` and ``broker_ids`` may only name
the one node, 0 (the storage).
"""

from __future__ import annotations

from typing import Any

from .. import clock
from ..errors import TxlogError, UnknownGroupError
from ..root.root import Root
from ..transactions import groups as group_offsets
from ..transactions.stable_offsets import stable_offsets
from ..transactions.group_members import (GroupMembership, group_state_name, live_members,
                                          reset_offsets_if_inactive)
from .admin_topics import NODE, TopicAdmin, as_kafka_error
from .admin_types import GroupInformation, MemberInformation, OffsetSpec, OffsetTimestamp
from .errors import (GroupIdNotFoundError, InvalidRequestError, KafkaError, NoError,
                     NonEmptyGroupError, UnknownTopicOrPartitionError, translated)
from .structs import OffsetAndMetadata, TopicPartition, plain_offsets

PROTOCOL_TYPE = "consumer"


def one_node(what: str, value: Any) -> None:
    """``group_coordinator_id``/``broker_ids``: None, or the one node."""
    if value is not None and value != NODE and list(value if isinstance(value, list)
                                                    else [value]) != [NODE]:
        raise InvalidRequestError(f"{what}={value!r}: txlog's one node is {NODE} "
                                  "(the storage)")


def _state_key(state: Any) -> str:
    return str(getattr(state, "value", state)).replace("-", "").replace("_", "").lower()


class GroupAdmin(TopicAdmin):
    """Groups, their members and their committed offsets (see the module)."""

    _root: Root

    def _group(self, group_id: str, known: bool) -> dict[str, Any]:
        """One group as DescribeGroups describes it; an unknown one (``known``: it has
        committed offsets) without members is Dead, as in Kafka."""
        membership = GroupMembership(self._root.storage, group_id)
        state = membership.latest()
        beats = membership.heartbeats() if state.members else {}
        name = group_state_name(state, beats, clock.now_ms()) if known or state.members \
            else "Dead"
        members = [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id, "client_host": "",
                    "member_metadata": {"topics": list(m.topics), "user_data": None,
                                        "owned_partitions": [], "generation_id": -1,
                                        "rack_id": None},
                    "member_assignment": {"assigned_partitions": [
                        {"topic": t, "partitions": [p for tt, p in parts if tt == t]}
                        for t in dict.fromkeys(tt for tt, _ in parts)], "user_data": None}}
                   for m in state.members
                   for parts in [state.assignment.get(m.member_id, ())]]
        return {"group_id": group_id, "group_state": name, "protocol_type": PROTOCOL_TYPE,
                "protocol_data": state.protocol or "", "members": members,
                "authorized_operations": None, "error": None}

    def _root_groups(self) -> list[str]:
        return group_offsets.group_ids(self._root.storage)

    def list_groups(self, broker_ids: list[int] | None = None,
                    states_filter: list[Any] | None = None,
                    types_filter: list[Any] | None = None) -> list[dict[str, Any]]:
        """Every group with committed offsets: its id, protocol type, state and type
        (``classic``: members join with JoinGroup's protocol)."""
        one_node("broker_ids", broker_ids)
        with translated():
            rows = [{"group_id": g, "protocol_type": PROTOCOL_TYPE,
                     "group_state": self._group(g, True)["group_state"],
                     "group_type": "classic"}
                    for g in self._root_groups()]
        states = None if not states_filter else {_state_key(s) for s in states_filter}
        types = None if not types_filter else {_state_key(t) for t in types_filter}
        return [r for r in rows if (states is None or _state_key(r["group_state"]) in states)
                and (types is None or r["group_type"] in types)]

    def describe_groups(self, group_ids: list[str], group_coordinator_id: int | None = None,
                        include_authorized_operations: bool = False) -> dict[str, Any]:
        one_node("group_coordinator_id", group_coordinator_id)
        with translated():
            known = set(self._root_groups())
            return {g: self._group(g, g in known) for g in group_ids}

    def list_group_offsets(self, group_specs: Any) -> dict[str, dict[Any, OffsetAndMetadata]]:
        """Per group its committed offsets (those of committed transactions), all or
        those of the partitions listed; a group without any has none, as in Kafka."""
        if isinstance(group_specs, str):
            group_specs = {group_specs: None}
        elif isinstance(group_specs, list):
            group_specs = dict.fromkeys(group_specs)
        out = {}
        with translated():
            for group_id, partitions in group_specs.items():
                wanted = None if partitions is None else [tuple(tp) for tp in partitions]
                offsets = stable_offsets(self._root.coordinator, group_id, wanted)
                out[group_id] = {TopicPartition(*tp): OffsetAndMetadata(o, "", -1)
                                 for tp, o in sorted(offsets.items())}
        return out

    def _split_partitions(self, tps: Any) -> tuple[list[tuple[str, int]],
                                                     dict[Any, type[KafkaError]]]:
        """The partitions that exist, and UnknownTopicOrPartitionError for the others."""
        valid: list[tuple[str, int]] = []
        unknown: dict[Any, type[KafkaError]] = {}
        for topic, partition in tps:
            try:
                self._root.partition(topic, partition)
                valid.append((topic, partition))
            except TxlogError:
                unknown[TopicPartition(topic, partition)] = UnknownTopicOrPartitionError
        return valid, unknown

    def _set_offsets(self, group_id: str, offsets: dict[tuple[str, int], int]
                     ) -> dict[Any, type[KafkaError]]:
        """Publish ``offsets`` for the partitions that exist while the group has no live
        member (the CLI's reset path); per partition NoError or why not."""
        found, result = self._split_partitions(offsets)
        valid = {tp: offsets[tp] for tp in found}
        if valid:
            try:
                try:
                    reset_offsets_if_inactive(self._root.storage, group_id, lambda _: valid)
                except UnknownGroupError:  # no offsets yet: a first commit, still refused
                    if live_members(self._root.storage, group_id)[1]:  # while members live
                        raise NonEmptyGroupError(
                            f"group {group_id!r} has live members") from None
                    group_offsets.commit_offsets(self._root.storage, group_id, valid)
                error: type[KafkaError] = NoError
            except (TxlogError, KafkaError) as exc:
                error = type(as_kafka_error(exc))
            result.update({TopicPartition(*tp): error for tp in valid})
        return result

    def alter_group_offsets(self, group_id: str, offsets: dict[Any, Any],
                            group_coordinator_id: int | None = None
                            ) -> dict[Any, type[KafkaError]]:
        """Set offsets (``OffsetAndMetadata`` or ints; a metadata string is refused, the
        group store keeps none); per partition NoError, NonEmptyGroupError while the
        group has live members, or UnknownTopicOrPartitionError."""
        one_node("group_coordinator_id", group_coordinator_id)
        wanted = plain_offsets(offsets, "alter_group_offsets")
        return self._set_offsets(group_id, wanted)

    def reset_group_offsets(self, group_id: str, offset_specs: dict[Any, Any],
                            group_coordinator_id: int | None = None
                            ) -> dict[Any, dict[str, Any]]:
        """Set offsets named by OffsetSpec, OffsetTimestamp or an int, each clamped into
        [log start, log end] (a timestamp after the last record: the log end), as
        ``txlog groups reset-offsets`` clamps."""
        one_node("group_coordinator_id", group_coordinator_id)
        targets: dict[tuple[str, int], int] = {}
        with translated():
            for tp, spec in offset_specs.items():
                if not isinstance(spec, (int, OffsetSpec, OffsetTimestamp)) or \
                        isinstance(spec, bool):
                    raise TypeError(f"Unsupported reset target for {tp}: {spec!r} (expected "
                                    "OffsetSpec, OffsetTimestamp, or int offset)")
                first = self._offset_for(tp, OffsetSpec.EARLIEST, "read_uncommitted").offset
                last = self._offset_for(tp, OffsetSpec.LATEST, "read_uncommitted").offset
                raw = self._offset_for(tp, spec, "read_uncommitted").offset \
                    if isinstance(spec, (OffsetSpec, OffsetTimestamp)) else spec
                targets[(tp[0], tp[1])] = last if raw < 0 or raw > last else max(raw, first)
        errors = self._set_offsets(group_id, targets)
        return {TopicPartition(*tp): {"error": errors[TopicPartition(*tp)], "offset": o}
                for tp, o in targets.items()}

    def delete_group_offsets(self, group_id: str, partitions: list[Any],
                             group_coordinator_id: int | None = None
                             ) -> dict[Any, type[KafkaError]]:
        """Drop the group's offsets of ``partitions`` while it has no live member (one new
        version of its offsets, as a reset); per partition NoError, or
        UnknownTopicOrPartitionError.  Raises GroupIdNotFoundError for an unknown group
        and NonEmptyGroupError while members live, as kafka-python raises top-level
        errors."""
        one_node("group_coordinator_id", group_coordinator_id)
        valid, result = self._split_partitions(partitions)
        if valid:
            with translated():
                reset_offsets_if_inactive(self._root.storage, group_id, lambda _: {},
                                          forget=tuple(valid))
            result.update({TopicPartition(*tp): NoError for tp in valid})
        return result

    def delete_groups(self, group_ids: list[str], group_coordinator_id: int | None = None
                      ) -> dict[str, str]:
        """Forget each group's committed offsets (``txlog groups delete``): per group "OK"
        or the error's name; a group with live members is refused (NonEmptyGroupError),
        as Kafka refuses."""
        return {g: "OK" if error is NoError else error.__name__
                for g, error in self._delete_groups(group_ids, group_coordinator_id).items()}

    def _delete_groups(self, group_ids: list[str], group_coordinator_id: int | None
                       ) -> dict[str, type[KafkaError]]:
        one_node("group_coordinator_id", group_coordinator_id)
        out: dict[str, type[KafkaError]] = {}
        for group_id in group_ids:
            try:
                if live_members(self._root.storage, group_id)[1]:
                    raise NonEmptyGroupError(f"group {group_id!r} has live members")
                group_offsets.delete_group(self._root.storage, group_id)
                out[group_id] = NoError
            except (TxlogError, KafkaError) as exc:
                out[group_id] = type(as_kafka_error(exc))
        return out

    # --- kafka-python 2.x's names, with 2.x's result shapes -----------------------------

    def list_consumer_groups(self, broker_ids: list[int] | None = None
                             ) -> list[tuple[str, str]]:
        """2.x: ``[(group_id, protocol_type)]``."""
        return [(g["group_id"], g["protocol_type"]) for g in self.list_groups(broker_ids)]

    def describe_consumer_groups(self, group_ids: list[str],
                                 group_coordinator_id: int | None = None,
                                 include_authorized_operations: bool = False
                                 ) -> list[GroupInformation]:
        """2.x: a GroupInformation per group (GroupIdNotFoundError for an unknown one)."""
        out = []
        for group_id, g in self.describe_groups(group_ids, group_coordinator_id).items():
            if g["group_state"] == "Dead":
                raise GroupIdNotFoundError(f"group {group_id!r} does not exist in "
                                           f"{self._root.url}")
            members = [MemberInformation(m["member_id"], m["client_id"], m["client_host"],
                                         m["member_metadata"], m["member_assignment"])
                       for m in g["members"]]
            out.append(GroupInformation(0, group_id, g["group_state"], g["protocol_type"],
                                        g["protocol_data"], members, None))
        return out

    def list_consumer_group_offsets(self, group_id: str, group_coordinator_id: int | None = None,
                                    partitions: list[Any] | None = None
                                    ) -> dict[Any, OffsetAndMetadata]:
        """2.x: one group's ``{TopicPartition: OffsetAndMetadata}``."""
        one_node("group_coordinator_id", group_coordinator_id)
        return self.list_group_offsets({group_id: partitions})[group_id]

    def delete_consumer_groups(self, group_ids: list[str], group_coordinator_id: int | None = None
                               ) -> list[tuple[str, type[KafkaError]]]:
        """2.x: ``[(group_id, error class)]``, NoError for a deleted one."""
        return list(self._delete_groups(group_ids, group_coordinator_id).items())
