"""A consumer group's members as stored objects: what Kafka's GroupCoordinator holds.

Two kinds of objects per group (docs/format.md, section 8a):

* a version chain ``coordinator/members/<group>/generations/``: each version
  is one generation (its members, the chosen assignor, the assignment and the
  partitions still being handed over), published by whichever member
  changes the member set; the exclusive publish orders every join, leave
  and expiry;
* heartbeat objects ``coordinator/members/<group>/heartbeats/<member id>@
  <generation>@<time ms>``: the member's own clock and the generation it has
  caught up with, both in the name, so one listing tells every member's
  liveness and which handovers are done without reading any object.

Liveness is judged by readers from the writer's timestamp plus the member's
session timeout plus ``CLOCK_SKEW_MARGIN_MS``.  The assignment itself is
computed by the clients (clients/assignors.py) inside the chain update; this
module only stores, reads and judges.  The generation fence of committed
offsets lives in groups.py; ``take_over`` joins the two with the coordinator.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import clock
from ..errors import GroupNotEmptyError
from ..storage.contract import Storage
from ..storage.chain import VersionChain
from ..storage.names import validate_name
from ..storage.paths import MEMBERS_DIR, generations_dir, heartbeats_dir
from .coordinator import TransactionCoordinator
from .groups import (OffsetsStep, StaleGroupFence, drop_pending, fence_generation, fence_state,
                     reset_offsets)

logger = logging.getLogger(__name__)

# Readers allow this much clock difference between a member's clock (which
# stamps its heartbeats) and their own before calling a member dead.
CLOCK_SKEW_MARGIN_MS = 250
HEARTBEAT_SEPARATOR = "@"

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class MemberInfo:
    """A member as its JoinGroup described it."""

    member_id: str
    client_id: str
    group_instance_id: str | None
    topics: tuple[str, ...]
    assignors: tuple[str, ...]
    session_timeout_ms: int
    max_poll_interval_ms: int
    joined_ms: int

    def to_list(self) -> list[Any]:
        return [self.member_id, self.client_id, self.group_instance_id, list(self.topics),
                list(self.assignors), self.session_timeout_ms, self.max_poll_interval_ms,
                self.joined_ms]

    @classmethod
    def from_list(cls, v: list[Any]) -> MemberInfo:
        return cls(v[0], v[1], v[2], tuple(v[3]), tuple(v[4]), v[5], v[6], v[7])


@dataclass(frozen=True)
class GroupGeneration:
    """One version of the generation chain.

    ``waiting`` maps a partition that changed owner in this generation to the
    earlier owners that must first show (in a heartbeat) that they have
    caught up with this generation, i.e. stopped consuming it; the new owner
    starts only then.  That is cooperative rebalancing's revoke-then-assign
    in two phases, done with heartbeats instead of a second JoinGroup round.
    """

    generation: int
    protocol: str | None
    members: tuple[MemberInfo, ...]
    assignment: dict[str, tuple[TopicPartition, ...]]
    waiting: dict[TopicPartition, tuple[str, ...]] = field(default_factory=dict)
    partition_counts: dict[str, int] = field(default_factory=dict)
    reason: str = ""
    time_ms: int = -1

    @property
    def state(self) -> str:
        """Kafka's group state as far as the chain alone tells it."""
        return "Stable" if self.members else "Empty"

    @property
    def leader(self) -> str | None:
        """The oldest member: its assignor preference breaks protocol ties."""
        return self.members[0].member_id if self.members else None

    def member(self, member_id: str) -> MemberInfo | None:
        return next((m for m in self.members if m.member_id == member_id), None)

    def owner_of(self, tp: TopicPartition) -> str | None:
        for member_id, parts in self.assignment.items():
            if tp in parts:
                return member_id
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "generation": self.generation, "protocol": self.protocol,
            "members": [m.to_list() for m in self.members],
            "assignment": {m: [list(tp) for tp in parts]
                           for m, parts in sorted(self.assignment.items())},
            "waiting": [[t, p, list(prev)] for (t, p), prev in sorted(self.waiting.items())],
            "partition_counts": dict(sorted(self.partition_counts.items())),
            "reason": self.reason, "time_ms": self.time_ms,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GroupGeneration:
        return cls(d["generation"], d["protocol"],
                   tuple(MemberInfo.from_list(m) for m in d["members"]),
                   {m: tuple((t, p) for t, p in parts) for m, parts in d["assignment"].items()},
                   {(t, p): tuple(prev) for t, p, prev in d["waiting"]},
                   dict(d["partition_counts"]), d["reason"], d["time_ms"])


EMPTY = GroupGeneration(0, None, (), {})


@dataclass(frozen=True)
class Heartbeat:
    member_id: str
    generation: int
    time_ms: int
    name: str


class GroupMembership:
    """One group's generation chain and heartbeats, as seen by one process."""

    def __init__(self, storage: Storage, group_id: str) -> None:
        validate_name(group_id, "group id")
        self.storage = storage
        self.group_id = group_id
        self.chain = VersionChain(storage, generations_dir(group_id))
        self._heartbeats = heartbeats_dir(group_id)

    def latest(self) -> GroupGeneration:
        """The newest generation (generation 0, no members, if the group never had any)."""
        _, value = self.chain.latest()
        return EMPTY if value is None else GroupGeneration.from_dict(value)

    def update(self, step: Callable[[GroupGeneration], GroupGeneration | None]
               ) -> GroupGeneration:
        """Publish the next generation ``step`` computes from the newest, retrying on a
        lost race; ``step`` returns None to change nothing."""
        def chain_step(version: int, value: dict | None) -> dict | None:
            current = EMPTY if value is None else GroupGeneration.from_dict(value)
            new = step(current)
            return None if new is None else new.to_dict()

        _, value = self.chain.update(chain_step)
        return EMPTY if value is None else GroupGeneration.from_dict(value)

    # --- heartbeats ------------------------------------------------------------------------

    def heartbeat(self, member_id: str, generation: int, previous: str | None) -> str:
        """Publish a heartbeat (one PUT) and delete the previous one (one DELETE);
        returns the new object's name."""
        now = clock.now_ms()
        name = HEARTBEAT_SEPARATOR.join((member_id, str(generation), str(now)))
        if name != previous:
            self.storage.publish_if_absent(f"{self._heartbeats}/{name}", b"\x01")
            if previous is not None:
                self._delete(previous)
        return name

    def _delete(self, name: str) -> None:
        try:
            self.storage.delete(f"{self._heartbeats}/{name}")
        except FileNotFoundError:
            pass

    def heartbeats(self) -> dict[str, Heartbeat]:
        """Every member's newest heartbeat, from one listing."""
        newest: dict[str, Heartbeat] = {}
        for name in self.storage.list(self._heartbeats):
            parts = name.split(HEARTBEAT_SEPARATOR)
            if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
                continue
            hb = Heartbeat(parts[0], int(parts[1]), int(parts[2]), name)
            old = newest.get(hb.member_id)
            if old is None or hb.time_ms > old.time_ms:
                newest[hb.member_id] = hb
        return newest

    def delete_heartbeats(self, member_ids: set[str],
                          found: dict[str, Heartbeat] | None = None) -> None:
        """Remove the heartbeat objects of members that are gone (best effort)."""
        if not member_ids:
            return
        for name in self.storage.list(self._heartbeats):
            if name.split(HEARTBEAT_SEPARATOR)[0] in member_ids:
                self._delete(name)


def last_seen_ms(member: MemberInfo, heartbeats: dict[str, Heartbeat]) -> int:
    hb = heartbeats.get(member.member_id)
    return max(member.joined_ms, hb.time_ms if hb is not None else -1)


def is_expired(member: MemberInfo, heartbeats: dict[str, Heartbeat], now_ms: int) -> bool:
    """Past its session timeout, with the clock-skew margin (docs/protocol.md, 9.2)."""
    return now_ms > last_seen_ms(member, heartbeats) + member.session_timeout_ms + \
        CLOCK_SKEW_MARGIN_MS


def group_state_name(state: GroupGeneration, beats: dict, now: int) -> str:
    """Kafka's names: Empty without members, PreparingRebalance while a member past its
    session timeout is still listed, CompletingRebalance while partitions wait for their
    earlier owner to let go, Stable otherwise."""
    if not state.members:
        return "Empty"
    if any(is_expired(m, beats, now) for m in state.members):
        return "PreparingRebalance"
    ids = {m.member_id for m in state.members}
    for waiters in state.waiting.values():
        if any(w in ids and (w not in beats or beats[w].generation < state.generation)
               for w in waiters):
            return "CompletingRebalance"
    return "Stable"


def live_members(storage: Storage, group_id: str) -> tuple[GroupGeneration, list[MemberInfo]]:
    """The newest generation and those of its members not past their session timeout."""
    membership = GroupMembership(storage, group_id)
    state = membership.latest()
    if not state.members:
        return state, []
    beats = membership.heartbeats()
    now = clock.now_ms()
    return state, [m for m in state.members if not is_expired(m, beats, now)]


def membership_group_ids(storage: Storage) -> list[str]:
    """Groups that have (or had) members."""
    return sorted(storage.list(MEMBERS_DIR))


def take_over(storage: Storage, coordinator: TransactionCoordinator, group_id: str,
              generation: int, partitions: list[TopicPartition]) -> None:
    """What a member does before it reads the committed offsets of ``partitions`` it
    gained in ``generation`` (KIP-447's stable offset fetch, docs/protocol.md 9.4):
    fence the group's offsets at ``generation``, so that no commit or transactional
    send of an older generation can land any more, then decide every transaction an
    older generation registered for these partitions (abort it if undecided, roll it
    forward if it committed), and forget those registrations."""
    pending = fence_generation(storage, group_id, generation, partitions)
    for tid, pid, epoch, gen in pending:
        coordinator.fence_writer(tid, pid, epoch,
                                 f"fenced by group {group_id} generation {generation} "
                                 f"(its member of generation {gen} lost the partitions)")
    drop_pending(storage, group_id, pending)


def reset_offsets_if_inactive(storage: Storage, group_id: str, step: OffsetsStep,
                              forget: tuple[TopicPartition, ...] = ()
                              ) -> dict[TopicPartition, int]:
    """Reset offsets only while the group has no live member, as Kafka's tool refuses.

    The check and the reset cannot be one publish (they are two chains), so
    the reset is published only if the group's generation fence is still the
    one read before the check: a member that joined in between fences the
    offsets before it reads them (``take_over``), which changes the fence, and
    the check runs again (section 9.4).
    """
    while True:
        _, fenced = fence_state(storage, group_id)
        state, live = live_members(storage, group_id)
        if live:
            raise GroupNotEmptyError(
                f"Assignments can only be reset if the group {group_id!r} is inactive, but the "
                f"current state is {state.state} (generation {state.generation}, "
                f"{len(live)} live member(s): "
                f"{', '.join(m.member_id for m in live[:5])}{'...' if len(live) > 5 else ''})")
        if state.members:
            # Members past their session timeout that nobody removed yet: remove them
            # (as Kafka's coordinator would have), and fence their generation below, so
            # that one coming back to life cannot commit over the reset.
            remaining = _remove_expired(storage, group_id, state)
            if remaining is None:
                continue  # the group changed meanwhile: check again
            state = remaining
        try:
            return reset_offsets(storage, group_id, step, fenced_at=fenced,
                                 fence_to=state.generation if state.generation else None,
                                 forget=forget)
        except StaleGroupFence:
            continue


def _remove_expired(storage: Storage, group_id: str, seen: GroupGeneration
                    ) -> GroupGeneration | None:
    """Publish an empty generation after ``seen`` if every member is still expired;
    None if the chain moved on or someone came back to life."""
    membership = GroupMembership(storage, group_id)
    beats = membership.heartbeats()

    def step(current: GroupGeneration) -> GroupGeneration | None:
        if current.generation != seen.generation:
            raise StaleGroupFence(group_id)
        now = clock.now_ms()
        if any(not is_expired(m, beats, now) for m in current.members):
            raise StaleGroupFence(group_id)
        return GroupGeneration(current.generation + 1, None, (), {}, {}, {},
                               "expired members removed by reset-offsets", now)

    try:
        new = membership.update(step)
    except StaleGroupFence:
        return None
    membership.delete_heartbeats({m.member_id for m in seen.members})
    return new
