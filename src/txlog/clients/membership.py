"""A consumer's membership in a group, through the storage alone (Kafka's
ConsumerCoordinator and AbstractCoordinator, with no broker).

A member joins by publishing the next generation of the group's chain with
itself added and the assignment recomputed (transactions/group_members.py
stores it, clients/assignors.py computes it), heartbeats by publishing one
small object per ``heartbeat_interval_ms`` from a background thread, and in
``poll()`` catches up with newer generations, removes members past their
session timeout, triggers a rebalance when subscribed topics grow, and takes
over partitions once their previous owners have let go.  Each of those rules,
and why every interleaving of them is safe, is in docs/protocol.md, section 9.

The application drives it as it drives a Kafka consumer: ``poll()`` often
(at least every ``max_poll_interval_ms``, or the heartbeat thread leaves the
group for it), consume ``assignment()``, ``commit()`` offsets (fenced by the
generation), and ``close()`` to leave.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .. import clock
from ..errors import CommitFailedError, IllegalStateError, InvalidConfigError, UnknownTopicError
from ..integers import is_int
from ..storage.names import validate_name
from ..transactions.group_members import (GroupGeneration, GroupMembership, Heartbeat,
                                          MemberInfo, is_expired, take_over)
from ..transactions.groups import commit_offsets
from .assignors import COOPERATIVE, assign, check_assignors, select_protocol

if TYPE_CHECKING:
    from ..log import Log

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

# While partitions wait for their previous owner, poll() looks again this often.
HANDOFF_CHECK_S = 0.1
# A member lists the generation chain afresh this often (one LIST), in case it
# fell so far behind that gc removed the version after the one it knows.
RELIST_S = 60.0


class RebalanceListener(Protocol):
    """kafka-python's ConsumerRebalanceListener."""

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None: ...

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None: ...


@dataclass(frozen=True)
class ConsumerGroupMetadata:
    """What a transactional producer needs to fence its offsets (Kafka's
    ConsumerGroupMetadata)."""

    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None


def _positive_ms(name: str, value: Any) -> int:
    if not is_int(value) or value < 1:
        raise InvalidConfigError(f"{name} must be a positive int (milliseconds), not {value!r}")
    return value


def check_generation(log: Log, group_id: str, member_id: str | None, generation: int) -> None:
    """The send-time check of a commit (one probe of the generation chain): refuse
    (CommitFailedError) a member that is no longer in the group, or a generation the
    group never reached.

    A member still in the group may commit with the generation it has until a
    member of a newer one takes over partitions and fences the group's offsets
    (checked atomically with the commit, groups.py): as Kafka accepts commits of
    the current generation while a rebalance is only being prepared, so that
    ``on_partitions_revoked`` can commit what it hands over.
    """
    state = GroupMembership(log.storage, group_id).latest()
    if member_id and state.member(member_id) is None:
        raise CommitFailedError(
            f"commit for group {group_id!r} refused: member {member_id!r} of generation "
            f"{generation} is no longer in the group (now at generation {state.generation}: "
            "removed after its session timeout or max.poll.interval.ms, or it left); rejoin "
            "the group and retry")
    if generation > state.generation or generation < 0:
        raise CommitFailedError(
            f"commit for group {group_id!r} refused: generation {generation} is not one of "
            f"this group's (it is at generation {state.generation})")


class GroupMember:
    """One consumer's membership of ``group_id``, subscribed to ``topics``."""

    def __init__(self, log: Log, group_id: str, topics: Sequence[str], *,
                 assignors: Sequence[str] = ("range", "cooperative-sticky"),
                 session_timeout_ms: int = 45000, heartbeat_interval_ms: int = 3000,
                 max_poll_interval_ms: int = 300000, group_instance_id: str | None = None,
                 client_id: str = "txlog", listener: RebalanceListener | None = None) -> None:
        validate_name(group_id, "group id")
        if isinstance(topics, str) or not topics:
            raise InvalidConfigError(f"topics must be a non-empty list of topic names, "
                                     f"not {topics!r}")
        for topic in topics:
            validate_name(topic, "topic")
        if not isinstance(client_id, str) or not client_id:
            raise InvalidConfigError(f"client_id must be a non-empty string, not {client_id!r}")
        if group_instance_id is not None:
            validate_name(group_instance_id, "group instance id")
        self.session_timeout_ms = _positive_ms("session_timeout_ms", session_timeout_ms)
        self.heartbeat_interval_ms = _positive_ms("heartbeat_interval_ms", heartbeat_interval_ms)
        self.max_poll_interval_ms = _positive_ms("max_poll_interval_ms", max_poll_interval_ms)
        if heartbeat_interval_ms >= session_timeout_ms:
            raise InvalidConfigError(
                f"heartbeat_interval_ms ({heartbeat_interval_ms}) must be lower than "
                f"session_timeout_ms ({session_timeout_ms})")
        self.log = log
        self.group_id = group_id
        self.topics = tuple(dict.fromkeys(topics))
        self.assignors = check_assignors(assignors)
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.listener = listener
        self.member_id = ""  # Kafka's UNKNOWN_MEMBER_ID until the first join
        self.generation = -1
        self._membership = GroupMembership(log.storage, group_id)
        self._state: GroupGeneration | None = None
        self._owned: set[TopicPartition] = set()  # handed to the application
        self._target: set[TopicPartition] = set()  # assigned in self.generation
        self._kept: set[TopicPartition] = set()  # revoked (eager) and assigned again
        self._heartbeat_name: str | None = None
        self._lock = threading.RLock()  # poll, commit, close, and a poll-interval leave
        self._hb_lock = threading.Lock()  # heartbeat publishes
        self._last_poll = time.monotonic()
        self._next_check = 0.0
        self._relist_at = time.monotonic() + RELIST_S
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._left = False  # left for max.poll.interval.ms: no heartbeats until poll()
        self._closed = False

    # --- what the application sees ---------------------------------------------------------

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member may consume now (handed over by their earlier owners)."""
        return set(self._owned)

    def waiting(self) -> set[TopicPartition]:
        """Partitions assigned to this member that their earlier owner has not let go of yet."""
        return self._target - self._owned

    def metadata(self) -> ConsumerGroupMetadata:
        return ConsumerGroupMetadata(self.group_id, self.generation, self.member_id,
                                     self.group_instance_id)

    def poll(self) -> None:
        """Join if needed, follow rebalances, expire dead members, take over partitions.

        Costs no request unless a heartbeat interval has passed (then one probe
        of the generation chain and one listing of the heartbeats) or
        partitions are waiting for their previous owner.
        """
        with self._lock:
            if self._closed:
                raise IllegalStateError("the group member is closed")
            self._last_poll = time.monotonic()
            if not self.member_id:
                self._join()
            now = time.monotonic()
            waiting = bool(self._target - self._owned)
            if now < self._next_check:
                return
            self._next_check = now + (HANDOFF_CHECK_S if waiting
                                      else self.heartbeat_interval_ms / 1000)
            if now > self._relist_at:
                # Probing forward from a version gc has removed would find nothing:
                # list the chain afresh now and then (admin/gc.py, protocol.md 9.2).
                self._membership.chain._listed = False
                self._relist_at = now + RELIST_S
            state = self._membership.latest()
            if state.generation != self.generation:
                self._adopt(state)
                state = self._state  # type: ignore[assignment]
            beats = self._membership.heartbeats()
            self._expire(state, beats)
            self._check_partitions()
            self._acquire(beats)
            if self._target - self._owned:
                self._next_check = min(self._next_check, time.monotonic() + HANDOFF_CHECK_S)
            self._ensure_thread()

    def commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit offsets for this member's generation; CommitFailedError if the member
        is gone, or a member of a newer generation has taken over partitions (checked
        against the newest generation, then atomically against the group's fence)."""
        with self._lock:
            if not self.member_id or self.generation < 0:
                raise CommitFailedError(
                    f"commit for group {self.group_id!r} refused: this consumer is not a member "
                    "of the group (poll() first, or rejoin after it was removed)")
            check_generation(self.log, self.group_id, self.member_id, self.generation)
            commit_offsets(self.log.storage, self.group_id,
                           {(t, p): o for (t, p), o in offsets.items()},
                           generation=self.generation)

    def close(self) -> None:
        """Revoke (listener), leave the group (a static member stays until its session
        times out, as in Kafka) and stop heartbeating."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            if self._owned:
                self._revoke(sorted(self._owned))
            if self.member_id and self.group_instance_id is None:
                self._leave("left the group")
                with self._hb_lock:
                    self._membership.delete_heartbeats({self.member_id})
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def __enter__(self) -> GroupMember:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- the protocol ------------------------------------------------------------------

    def _counts(self, topics: set[str]) -> dict[str, int]:
        counts = {}
        for topic in sorted(topics):
            try:
                counts[topic] = self.log.describe_topic(topic, refresh=True).partitions
            except UnknownTopicError:
                counts[topic] = 0  # nothing to assign until it exists
        return counts

    def _next(self, current: GroupGeneration, members: list[MemberInfo], reason: str,
              renamed: dict[str, str] | None = None) -> GroupGeneration:
        """The generation after ``current`` with ``members``: assignment recomputed, and
        every partition that changes owner waits for the owners it had."""
        renamed = renamed or {}
        counts = self._counts({t for m in members for t in m.topics})
        protocol = select_protocol(members) if members else None
        previous = {renamed.get(m, m): parts for m, parts in current.assignment.items()}
        assignment = {m: tuple(p) for m, p in
                      assign(protocol, members, counts, previous).items()} if protocol else {}
        ids = {m.member_id for m in members}
        waiting: dict[TopicPartition, tuple[str, ...]] = {}
        for member_id, parts in assignment.items():
            for tp in parts:
                earlier = {renamed.get(w, w) for w in current.waiting.get(tp, ())}
                owner = current.owner_of(tp)
                if owner is not None:
                    earlier.add(renamed.get(owner, owner))
                wait = (earlier & ids) - {member_id}
                if wait:
                    waiting[tp] = tuple(sorted(wait))
        return GroupGeneration(current.generation + 1, protocol, tuple(members), assignment,
                               waiting, counts, reason, clock.now_ms())

    def _join(self) -> None:
        # Kafka's member id is "<client id>-<uuid>"; here it becomes part of object
        # names, so the client id's characters outside the naming rule become '_'.
        prefix = re.sub(r"[^A-Za-z0-9._-]", "_", self.client_id)[:100]
        member_id = f"{prefix}-{uuid.uuid4().hex}"
        info = MemberInfo(member_id, self.client_id, self.group_instance_id, self.topics,
                          self.assignors, self.session_timeout_ms, self.max_poll_interval_ms,
                          clock.now_ms())

        def step(current: GroupGeneration) -> GroupGeneration:
            renamed = {}
            members = []
            for m in current.members:
                if self.group_instance_id is not None and \
                        m.group_instance_id == self.group_instance_id:
                    renamed[m.member_id] = member_id  # a static member's restart
                else:
                    members.append(m)
            return self._next(current, [*members, info], f"{member_id} joined", renamed)

        state = self._membership.update(step)
        self.member_id = member_id
        self.generation = -1
        self._left = False
        self._heartbeat()
        self._adopt(state)

    def _adopt(self, state: GroupGeneration) -> None:
        """Catch up with ``state``: revoke what this member loses (all of it under an
        eager assignor), say so with a heartbeat, then take what is free."""
        if state.member(self.member_id) is None:
            lost = sorted(self._owned)
            self._owned.clear()
            self._target.clear()
            if lost:
                logger.warning("member %s of group %r is no longer in it (generation %d: %s); "
                               "its partitions %s are lost, rejoining", self.member_id,
                               self.group_id, state.generation, state.reason, lost)
                self._revoke(lost)
            with self._hb_lock:
                self._membership.delete_heartbeats({self.member_id})
                self._heartbeat_name = None
            self.member_id = ""
            self.generation = -1
            self._join()
            return
        target = set(state.assignment.get(self.member_id, ()))
        revoked = self._owned if state.protocol not in COOPERATIVE else self._owned - target
        # Revoked by an eager assignor only to be assigned again: nobody else owned
        # them in between, so taking them back needs no fence (which would refuse the
        # revoke-time commits of members that have not caught up yet).
        self._kept = set(revoked & target)
        if revoked:
            self._revoke(sorted(revoked))
        self._state = state
        self.generation = state.generation
        self._target = target
        self._heartbeat()  # tells the new owners of the revoked partitions they are free
        self._acquire(None)

    def _revoke(self, parts: list[TopicPartition]) -> None:
        self._owned.difference_update(parts)
        if self.listener is not None:
            self.listener.on_partitions_revoked(parts)

    def _acquire(self, beats: dict[str, Heartbeat] | None) -> None:
        """Take the assigned partitions whose earlier owners have caught up with this
        generation (or left it); fence the group before reading their offsets."""
        state = self._state
        wanted = sorted(self._target - self._owned)
        if state is None or not wanted:
            return
        if beats is None and any(tp in state.waiting for tp in wanted):
            beats = self._membership.heartbeats()
        ids = {m.member_id for m in state.members}
        free = []
        for tp in wanted:
            waiters = state.waiting.get(tp, ())
            if all(w not in ids or (beats is not None and w in beats
                                    and beats[w].generation >= state.generation)
                   for w in waiters):
                free.append(tp)
        if not free:
            return
        moved = [tp for tp in free if tp not in self._kept]
        if moved:
            take_over(self.log.storage, self.log.coordinator, self.group_id, state.generation,
                      moved)
        self._kept.difference_update(free)
        self._owned.update(free)
        if self.listener is not None:
            self.listener.on_partitions_assigned(free)

    def _expire(self, state: GroupGeneration, beats: dict[str, Heartbeat]) -> None:
        now = clock.now_ms()
        dead = {m.member_id for m in state.members
                if m.member_id != self.member_id and is_expired(m, beats, now)}
        if not dead:
            return

        def step(current: GroupGeneration) -> GroupGeneration | None:
            gone = [m for m in current.members if m.member_id in dead
                    and is_expired(m, beats, clock.now_ms())]
            if not gone:
                return None
            keep = [m for m in current.members if m not in gone]
            return self._next(current, keep, "session timeout of "
                              + ", ".join(m.member_id for m in gone))

        new = self._membership.update(step)
        logger.info("group %r: removed member(s) %s past their session timeout (generation %d)",
                    self.group_id, ", ".join(sorted(dead)), new.generation)
        self._membership.delete_heartbeats(dead)
        if new.generation != self.generation:
            self._adopt(new)

    def _check_partitions(self) -> None:
        """The leader notices subscribed topics that grew (Kafka's metadata refresh)."""
        state = self._state
        if state is None or state.leader != self.member_id:
            return
        counts = self._counts({t for m in state.members for t in m.topics})
        if counts == state.partition_counts:
            return

        def step(current: GroupGeneration) -> GroupGeneration | None:
            if current.generation != state.generation:
                return None  # changed meanwhile: its publisher counted afresh
            return self._next(current, list(current.members), "partitions added")

        new = self._membership.update(step)
        if new.generation != self.generation:
            self._adopt(new)

    def _leave(self, reason: str) -> None:
        member_id = self.member_id

        def step(current: GroupGeneration) -> GroupGeneration | None:
            if current.member(member_id) is None:
                return None
            return self._next(current, [m for m in current.members if m.member_id != member_id],
                              f"{member_id} {reason}")

        self._membership.update(step)

    # --- heartbeats --------------------------------------------------------------------

    def _heartbeat(self) -> None:
        with self._hb_lock:
            if self.member_id and not self._left:
                self._heartbeat_name = self._membership.heartbeat(
                    self.member_id, max(self.generation, 0), self._heartbeat_name)

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                            name=f"txlog-heartbeat-{self.group_id}")
            self._thread.start()

    def _heartbeat_loop(self) -> None:
        interval = self.heartbeat_interval_ms / 1000
        while not self._stop.wait(interval):
            try:
                idle_ms = (time.monotonic() - self._last_poll) * 1000
                if idle_ms > self.max_poll_interval_ms:
                    self._leave_for_poll_interval()
                else:
                    self._heartbeat()
            except Exception:  # a storage hiccup: the next beat tries again
                logger.warning("group %r: heartbeat failed", self.group_id, exc_info=True)

    def _leave_for_poll_interval(self) -> None:
        with self._lock:
            if self._closed or not self.member_id or \
                    (time.monotonic() - self._last_poll) * 1000 <= self.max_poll_interval_ms:
                return
            logger.warning(
                "group %r: poll() was not called for more than max_poll_interval_ms (%d ms); "
                "member %s leaves the group, its partitions go to others", self.group_id,
                self.max_poll_interval_ms, self.member_id)
            self._leave("exceeded max.poll.interval.ms")
            self._left = True
            self._next_check = 0.0  # poll() finds itself gone, revokes (lost) and rejoins
