"""The records of the transaction coordinator's chains, and their transitions.

Three kinds of stored values (docs/format.md, section 8): a version of a
transactional id's metadata chain (``TransactionMetadata``), a transaction's
decision object (``Decision``) and a version of a shared transaction's lease
chain (``Lease``).  Each is a frozen value: the coordinator never edits one,
it computes the next version with a named transition, so every state change
of the protocol has one name and one place.  The encodings are msgpack maps
whose keys and key order are the format; old executors and new drivers share
a root, so they must never change.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from .. import clock
from ..errors import (ConcurrentTransactionsError, InvalidPidMappingError, InvalidTxnStateError,
                      ProducerFencedError)

MAX_EPOCH = 32767  # Short.MaxValue: an epoch this high is never handed to a producer
NO_PRODUCER_ID = -1


class TxnState(str, Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"
    DEAD = "Dead"


S = TxnState
# Kafka's TransactionState.validPreviousStates
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}
COMPLETE = frozenset({S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
PREPARED = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})
IDLE = frozenset({S.EMPTY, *COMPLETE})  # no transaction open or ending


def plain_decision_id(producer_id: int, epoch: int) -> str:
    """The decision id of a transaction of one producer alone.

    A producer id and epoch start at most one transaction, so the id is
    fresh; a transaction under any other decision id is a shared one.
    """
    return f"{producer_id}-{epoch}"


@dataclass(frozen=True)
class TransactionMember:
    """One producer's part of a (possibly shared) transaction."""

    transactional_id: str
    producer_id: int
    epoch: int
    decision_id: str
    partitions: list[tuple[str, int]] = field(default_factory=list)


Offsets = dict[tuple[str, int], int]


@dataclass(frozen=True)
class TransactionMetadata:
    """One version of a transactional id's state (Kafka's TransactionMetadata)."""

    transactional_id: str
    producer_id: int
    epoch: int
    state: TxnState
    timeout_ms: int
    partitions: tuple[tuple[str, int], ...] = ()
    # group id -> {(topic, partition): offset}, applied only if the transaction commits
    pending_offsets: dict[str, Offsets] = field(default_factory=dict)
    txn_start_ms: int = -1
    update_ms: int = -1
    decision_id: str = ""
    # Identity that wrote the open transaction's data (markers carry txn_epoch + 1).
    txn_producer_id: int = NO_PRODUCER_ID
    txn_epoch: int = -1
    reason: str = ""
    # When this incarnation of the id began (the writer's clock, ms); 0 for chains
    # written before incarnations were recorded.  With the version number it is
    # the generation group offsets are marked with (groups.py): a chain deleted
    # whole starts again at version 0, under a later incarnation.
    incarnation_ms: int = 0

    @classmethod
    def incarnation(cls, transactional_id: str, producer_id: int, timeout_ms: int,
                    previous: TransactionMetadata | None) -> TransactionMetadata:
        """The first version of a new incarnation of the id (new, or after ``previous``,
        its Dead version): its generations sort after every earlier one's."""
        now = clock.now_ms()
        started = now if previous is None else max(now, previous.incarnation_ms + 1)
        return cls(transactional_id, producer_id, 0, S.EMPTY, timeout_ms, update_ms=now,
                   reason="init", incarnation_ms=started)

    def transition(self, state: TxnState, **changes: Any) -> TransactionMetadata:
        """The next version; refuses what Kafka's state table refuses."""
        if self.state not in VALID_PREVIOUS[state]:
            raise InvalidTxnStateError(
                f"transactional id {self.transactional_id!r}: cannot go from {self.state.value} "
                f"to {state.value}")
        return replace(self, state=state, update_ms=clock.now_ms(), **changes)

    def bumped(self, producer_id: int, epoch: int, reason: str,
               timeout_ms: int | None = None) -> TransactionMetadata:
        """Idle again under a new identity: every older instance is fenced."""
        return self.transition(S.EMPTY, producer_id=producer_id, epoch=epoch,
                               timeout_ms=self.timeout_ms if timeout_ms is None else timeout_ms,
                               reason=reason)

    def joined(self, member: TransactionMember, partitions: list[tuple[str, int]],
               offsets: dict[str, Offsets], now_ms: int) -> TransactionMetadata | None:
        """Ongoing for ``member`` with more partitions and/or pending offsets; None if the
        open transaction holds them all already."""
        ongoing = self.state == S.ONGOING
        new_parts = tuple(sorted(set(self.partitions if ongoing else ()) | set(partitions)))
        pending = {g: dict(o) for g, o in self.pending_offsets.items()} if ongoing else {}
        for group, offs in offsets.items():
            pending.setdefault(group, {}).update(offs)
        if ongoing and new_parts == self.partitions and pending == self.pending_offsets:
            return None
        return self.transition(
            S.ONGOING, partitions=new_parts, pending_offsets=pending,
            txn_start_ms=self.txn_start_ms if ongoing else now_ms,
            decision_id=member.decision_id, txn_producer_id=member.producer_id,
            txn_epoch=member.epoch, reason="")

    def prepared(self, commit: bool) -> TransactionMetadata:
        """PrepareCommit or PrepareAbort, as the decision says."""
        return self.transition(S.PREPARE_COMMIT if commit else S.PREPARE_ABORT)

    def fenced(self, reason: str) -> TransactionMetadata:
        """PrepareEpochFence: the open transaction's producer can no longer end it."""
        return self.transition(S.PREPARE_EPOCH_FENCE, epoch=self.epoch + 1, reason=reason)

    def completed(self, producer_id: int, epoch: int, commit: bool) -> TransactionMetadata:
        """Complete* under the identity after the transaction's: after a Prepare*, or, for
        a plain producer's transaction, straight after its decided Ongoing version, whose
        decision object stands in for PrepareCommit (docs/protocol.md 4.2)."""
        state = S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT
        changes: dict[str, Any] = {"producer_id": producer_id, "epoch": epoch,
                                   "partitions": (), "pending_offsets": {}}
        if self.state == S.ONGOING and not self.is_shared:
            return replace(self, state=state, update_ms=clock.now_ms(), **changes)
        return self.transition(state, **changes)

    def dead(self) -> TransactionMetadata:
        """Dead: the id expired; its next InitProducerId starts a new incarnation."""
        return self.transition(S.DEAD, reason="transactional id expired")

    @property
    def is_shared(self) -> bool:
        """Part of a multi-producer transaction (its decision id is not its own)."""
        return bool(self.decision_id) and \
            self.decision_id != plain_decision_id(self.txn_producer_id, self.txn_epoch)

    def writes_as(self, decision_id: str, producer_id: int, epoch: int) -> bool:
        """Whether the open (or ending) transaction is that one of that writer."""
        return (self.decision_id, self.txn_producer_id, self.txn_epoch) == (
            decision_id, producer_id, epoch)

    def expired(self, now_ms: int, lease_ms: int = -1) -> bool:
        """Ongoing for longer than the timeout, counted from the start or the last lease."""
        return self.state == S.ONGOING and \
            now_ms > max(self.txn_start_ms, lease_ms) + self.timeout_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "transactional_id": self.transactional_id, "producer_id": self.producer_id,
            "epoch": self.epoch, "state": self.state.value, "timeout_ms": self.timeout_ms,
            "partitions": [list(tp) for tp in self.partitions],
            "pending_offsets": {g: [[t, p, o] for (t, p), o in sorted(offs.items())]
                                for g, offs in sorted(self.pending_offsets.items())},
            "txn_start_ms": self.txn_start_ms, "update_ms": self.update_ms,
            "decision_id": self.decision_id, "txn_producer_id": self.txn_producer_id,
            "txn_epoch": self.txn_epoch, "reason": self.reason,
            "incarnation_ms": self.incarnation_ms,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TransactionMetadata:
        return cls(
            d["transactional_id"], d["producer_id"], d["epoch"], TxnState(d["state"]),
            d["timeout_ms"], tuple((t, p) for t, p in d["partitions"]),
            {g: {(t, p): o for t, p, o in offs} for g, offs in d["pending_offsets"].items()},
            d["txn_start_ms"], d["update_ms"], d["decision_id"], d["txn_producer_id"],
            d["txn_epoch"], d["reason"], d.get("incarnation_ms", 0))


def _expired_under(member: TransactionMember) -> InvalidPidMappingError:
    return InvalidPidMappingError(
        f"transactional id {member.transactional_id!r} expired while producer "
        f"{member.producer_id} epoch {member.epoch} held it (idle longer than "
        "transactional.id.expiration.ms); abort the transaction to start the id again "
        "under a new producer id")


def check_member(meta: TransactionMetadata | None, member: TransactionMember
                 ) -> TransactionMetadata:
    """``meta`` if ``member`` may still act in its id; else the error its producer gets."""
    if meta is None:  # a member exists only after InitProducerId: the id was deleted
        raise _expired_under(member)
    if meta.producer_id != member.producer_id or meta.epoch != member.epoch:
        why = f" ({meta.reason})" if meta.reason else ""
        raise ProducerFencedError(
            f"producer {member.producer_id} epoch {member.epoch} of transactional id "
            f"{member.transactional_id!r} was fenced: the id is now at producer "
            f"{meta.producer_id} epoch {meta.epoch}, state {meta.state.value}{why}")
    if meta.state == S.DEAD:
        raise _expired_under(member)
    if meta.state in PREPARED or meta.state == S.PREPARE_EPOCH_FENCE:
        raise ConcurrentTransactionsError(
            f"transactional id {member.transactional_id!r} is completing a transaction "
            f"({meta.state.value})")
    return meta


@dataclass(frozen=True)
class Decision:
    """A transaction's decision object: published once, never changed (the commit point)."""

    commit: bool
    members: frozenset[tuple[int, int]]  # (producer id, epoch) of each committed member
    time_ms: int
    reason: str = ""

    @classmethod
    def taken(cls, commit: bool, members: list[tuple[int, int]], reason: str) -> Decision:
        """The decision to propose now; an ABORT names no member."""
        return cls(commit, frozenset(members) if commit else frozenset(), clock.now_ms(), reason)

    def commits(self, producer_id: int, epoch: int) -> bool:
        return self.commit and (producer_id, epoch) in self.members

    def to_value(self) -> dict[str, Any]:
        return {"outcome": "COMMIT" if self.commit else "ABORT",
                "members": sorted([list(m) for m in self.members]),
                "time_ms": self.time_ms, "reason": self.reason}

    @classmethod
    def from_value(cls, raw: dict[str, Any]) -> Decision:
        return cls(raw["outcome"] == "COMMIT",
                   frozenset((pid, epoch) for pid, epoch in raw["members"]),
                   raw["time_ms"], raw.get("reason", ""))


@dataclass(frozen=True)
class Lease:
    """A version of a shared transaction's lease chain: when a participant was last alive."""

    time_ms: int

    def renewed(self, now_ms: int, unless_younger_than_ms: int = 0) -> Lease | None:
        """The lease renewed at ``now_ms``; None if it is that fresh already, or was
        renewed less than ``unless_younger_than_ms`` before."""
        if self.time_ms >= now_ms or now_ms - self.time_ms < unless_younger_than_ms:
            return None
        return Lease(now_ms)

    def to_value(self) -> dict[str, Any]:
        return {"time_ms": self.time_ms}

    @classmethod
    def from_value(cls, value: dict[str, Any]) -> Lease:
        return cls(value["time_ms"])
