"""The transaction coordinator, as a library every process runs.

Kafka keeps transaction state in a coordinator broker; here it is a chain of
metadata versions per transactional id (``coordinator/transactions/<id>/``)
plus one decision object per transaction (``coordinator/decisions/<id>``).
Publishing the decision is the commit point: publish-if-absent means a
committer and a timeout-aborter cannot both win.  Everything after the
decision (markers, group offsets, the Complete* version) is idempotent and
is rolled forward by whichever process finds it unfinished.

State transitions follow Kafka's TransactionMetadata table; each transaction
ends with the epoch bumped (KIP-890), and its markers carry the bumped epoch.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

import msgpack

from .. import clock
from ..storage.chain import VersionChain
from ..errors import (ConcurrentTransactionsError, DecisionConflictError, InvalidPidMappingError,
                      InvalidTransactionTimeoutError, InvalidTxnStateError, ProducerFencedError,
                      TransactionAbortedError)
from .groups import apply_transactional_offsets, check_offsets
from ..storage.lru import LruDict
from ..storage.names import validate_name
from ..storage.paths import DECISION_DIR, LEASE_DIR, TXN_DIR
from ..storage.pools import shared_pool
from ..partition.producer_state import OpenTransaction, ProducerState
from ..format.batch import BatchHeader

if TYPE_CHECKING:
    from ..partition.partition_log import PartitionLog
    from ..storage.contract import Storage

logger = logging.getLogger(__name__)

MAX_TRANSACTION_TIMEOUT_MS = 900_000  # Kafka's transaction.max.timeout.ms default
MARKER_THREADS = 8  # partitions of one transaction marked at once (protocol.md, 4.6)


def _marker_pool() -> ThreadPoolExecutor:
    """Threads writing one transaction's markers at once: each partition's marker is an
    independent slot claim, so their requests need not wait on each other."""
    return shared_pool("txlog-marker", MARKER_THREADS)


MAX_EPOCH = 32767  # Short.MaxValue: an epoch this high is never handed to a producer
NO_PRODUCER_ID = -1
CACHED_CHAINS = 4096  # transactional ids (and decisions) whose chains a process keeps cached


class FlushVerification:
    """The partition verifications (KIP-890) of one flush's claims, shared among them
    (docs/protocol.md 2.6.1): the check depends on the transaction, not the partition,
    and every check of a flush runs after the flush began, so an end the writer saw
    before its flush is seen by the flush's own check.  A pass never outlives the flush:
    one kept for a later flush would answer for a transaction the writer may since have
    seen end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._passed: dict[tuple[str, str, int, int], int] = {}  # when its check began
        self._checking: dict[tuple[str, str, int, int], threading.Lock] = {}

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` with this flush's verifications shared (in any thread)."""
        token = _FLUSH.set(self)
        try:
            return fn(*args)
        finally:
            _FLUSH.reset(token)

    def is_open(self, header: BatchHeader, window_ms: int,
                check: Callable[[BatchHeader], bool]) -> bool:
        """``check(header)``, or a pass of the same transaction in this flush that began
        less than ``window_ms`` ago; partitions claimed at once wait for one check."""
        key = (header.transactional_id, header.decision_id, header.producer_id,
               header.producer_epoch)
        with self._lock:
            lock = self._checking.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                passed_ms = self._passed.get(key)
            if passed_ms is not None and clock.now_ms() - passed_ms < window_ms:
                return True
            started_ms = clock.now_ms()  # the pass holds from its first read on
            if not check(header):
                return False  # a refusal is never shared
            with self._lock:
                self._passed[key] = started_ms
            return True


_FLUSH: contextvars.ContextVar[FlushVerification | None] = contextvars.ContextVar(
    "txlog_flush_verification", default=None)


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


def plain_decision_id(producer_id: int, epoch: int) -> str:
    """The decision id of a transaction of one producer alone.

    A producer id and epoch start at most one transaction, so the id is
    fresh; a transaction under any other decision id is a shared one.
    """
    return f"{producer_id}-{epoch}"


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
    pending_offsets: dict[str, dict[tuple[str, int], int]] = field(default_factory=dict)
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

    def transition(self, state: TxnState, **changes: Any) -> TransactionMetadata:
        """The next version; refuses what Kafka's state table refuses."""
        if self.state not in VALID_PREVIOUS[state]:
            raise InvalidTxnStateError(
                f"transactional id {self.transactional_id!r}: cannot go from {self.state.value} "
                f"to {state.value}")
        return replace(self, state=state, update_ms=clock.now_ms(), **changes)

    @property
    def is_shared(self) -> bool:
        """Part of a multi-producer transaction (its decision id is not its own)."""
        return bool(self.decision_id) and \
            self.decision_id != plain_decision_id(self.txn_producer_id, self.txn_epoch)

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


@dataclass(frozen=True)
class TransactionMember:
    """One producer's part of a (possibly shared) transaction."""

    transactional_id: str
    producer_id: int
    epoch: int
    decision_id: str
    partitions: list[tuple[str, int]] = field(default_factory=list)


@dataclass(frozen=True)
class HangingTransaction:
    """An open transaction that holds a partition's LSO back and that nobody will end."""

    topic: str
    partition: int
    first_offset: int
    producer_id: int
    epoch: int
    transactional_id: str
    decision_id: str
    start_ms: int  # -1 when no coordinator state is left
    reason: str


@dataclass(frozen=True)
class Decision:
    commit: bool
    members: frozenset[tuple[int, int]]  # (producer id, epoch) of each committed member
    time_ms: int
    reason: str = ""

    def commits(self, producer_id: int, epoch: int) -> bool:
        return self.commit and (producer_id, epoch) in self.members


class TransactionCoordinator:
    """Transactions of one log root, given only what they touch of it.

    ``next_producer_id`` hands out a fresh producer id (producer_ids.py) and
    ``partition(topic, partition)`` opens a partition (raising for unknown
    ones), so that the coordinator can check the partitions a transaction
    adds, write its markers and find the transactions holding a partition
    back; it needs nothing else of the ``Log`` that builds it.
    """

    def __init__(self, storage: Storage, next_producer_id: Callable[[], int],
                 partition: Callable[[str, int], PartitionLog]) -> None:
        self.storage = storage
        self._next_producer_id = next_producer_id
        self._partition = partition
        # Per transactional id or decision this process touched: bounded, since a
        # process may live through many jobs (storage/lru.py); a dropped entry is read again.
        self._chains: LruDict[str, VersionChain] = LruDict(CACHED_CHAINS)
        self._decisions: LruDict[str, Decision] = LruDict(CACHED_CHAINS)
        self._local = threading.local()  # transactional ids this thread is ending itself

    def _ending(self) -> set[str]:
        ending = getattr(self._local, "ending", None)
        if ending is None:
            ending = self._local.ending = set()
        return ending

    @contextmanager
    def _owning(self, transactional_ids: list[str]) -> Iterator[None]:
        """Mark transactions this thread ends, so that finishing them is not logged."""
        ending = self._ending()
        added = [t for t in transactional_ids if t not in ending]
        ending.update(added)
        try:
            yield
        finally:
            ending.difference_update(added)

    # --- storage ----------------------------------------------------------------

    def _chain(self, transactional_id: str) -> VersionChain:
        chain = self._chains.get(transactional_id)
        if chain is None:
            validate_name(transactional_id, "transactional id")
            chain = self._chains.setdefault(
                transactional_id, VersionChain(self.storage, f"{TXN_DIR}/{transactional_id}"))
        return chain

    def metadata(self, transactional_id: str) -> TransactionMetadata | None:
        """Latest metadata of a transactional id (None if it never existed)."""
        _, value = self._chain(transactional_id).latest()
        return None if value is None else TransactionMetadata.from_dict(value)

    def _latest(self, transactional_id: str) -> tuple[int, TransactionMetadata | None]:
        version, value = self._chain(transactional_id).latest()
        return version, None if value is None else TransactionMetadata.from_dict(value)

    def _publish(self, version: int, meta: TransactionMetadata) -> bool:
        return self._chain(meta.transactional_id).publish(version, meta.to_dict())

    def transactional_ids(self) -> list[str]:
        return sorted(self.storage.list(TXN_DIR))

    def decision(self, decision_id: str) -> Decision | None:
        found = self._decisions.get(decision_id)
        if found is not None:
            return found
        try:
            raw = msgpack.unpackb(self.storage.read(f"{DECISION_DIR}/{decision_id}"))
        except FileNotFoundError:
            return None
        found = Decision(raw["outcome"] == "COMMIT",
                         frozenset((pid, epoch) for pid, epoch in raw["members"]),
                         raw["time_ms"], raw.get("reason", ""))
        self._decisions[decision_id] = found  # decisions never change once published
        return found

    def _decide(self, decision_id: str, commit: bool, members: list[tuple[int, int]],
                reason: str) -> Decision:
        """Publish the decision unless one exists; returns whichever decision stands."""
        validate_name(decision_id, "decision id")
        body = msgpack.packb({"outcome": "COMMIT" if commit else "ABORT",
                              "members": sorted([list(m) for m in members]) if commit else [],
                              "time_ms": clock.now_ms(), "reason": reason})
        self.storage.publish_if_absent(f"{DECISION_DIR}/{decision_id}", body)
        decision = self.decision(decision_id)
        assert decision is not None
        return decision

    def resolve(self, txn: OpenTransaction) -> bool | None:
        """Outcome of a transaction still open in a partition: None while undecided."""
        if not txn.decision_id:
            return None
        decision = self.decision(txn.decision_id)
        if decision is None:
            return None
        return decision.commits(txn.producer_id, txn.epoch)

    def verifier(self, expiration_ms: int) -> Callable[[BatchHeader], bool]:
        """``is_open`` for one partition; inside a ``FlushVerification`` (the claims of one
        flush), a pass is shared with the flush's other partitions (docs/protocol.md
        2.6.1), never for more than half the partition's ``producer.id.expiration.ms``."""
        window_ms = max(0, int(expiration_ms)) // 2

        def verify(header: BatchHeader) -> bool:
            flush = _FLUSH.get()
            if flush is None or not header.transactional_id:
                return self.is_open(header)
            return flush.is_open(header, window_ms, self.is_open)
        return verify

    def is_open(self, header: BatchHeader) -> bool:
        """Whether a transactional batch belongs to a transaction still open here: the
        id's metadata is Ongoing for this decision, producer id and epoch, and undecided
        (Kafka's partition verification, KIP-890).  Asked by partitions for producers they
        do not know; a fenced zombie whose entry expired fails it."""
        if not header.transactional_id:
            return False
        meta = self.metadata(header.transactional_id)
        return meta is not None and meta.state == S.ONGOING and \
            (meta.decision_id, meta.txn_producer_id, meta.txn_epoch) == (
                header.decision_id, header.producer_id, header.producer_epoch) and \
            self.decision(header.decision_id) is None

    # --- identities -------------------------------------------------------------------

    def _next_identity(self, producer_id: int, epoch: int) -> tuple[int, int]:
        """The identity after a bump; a new producer id once the epoch is exhausted."""
        if epoch + 1 >= MAX_EPOCH:
            return self._next_producer_id(), 0
        return producer_id, epoch + 1

    # --- InitProducerId ------------------------------------------------------------------

    def init_producer_id(self, transactional_id: str, timeout_ms: int,
                         expired: tuple[int, int] | None = None) -> tuple[int, int]:
        """Fence every older instance and return the new (producer id, epoch).

        ``expired`` is the (producer id, epoch) of a producer whose id expired under
        it (InvalidPidMappingError), starting again: it may only start a fresh
        incarnation, where the id is gone or Dead at that identity, never fence an
        instance that took the id meanwhile (Kafka checks the expected producer id
        and epoch of InitProducerId the same way, KIP-360)."""
        if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or \
                not 1 <= timeout_ms <= MAX_TRANSACTION_TIMEOUT_MS:
            raise InvalidTransactionTimeoutError(
                f"transaction_timeout_ms must be an integer from 1 to "
                f"{MAX_TRANSACTION_TIMEOUT_MS}, not {timeout_ms!r}")
        while True:
            version, meta = self._latest(transactional_id)
            if expired is not None and meta is not None and not (
                    meta.state == S.DEAD and (meta.producer_id, meta.epoch) == expired):
                raise ProducerFencedError(
                    f"producer {expired[0]} epoch {expired[1]} of transactional id "
                    f"{transactional_id!r} was fenced: after the id expired, another instance "
                    f"took it (now producer {meta.producer_id} epoch {meta.epoch}, state "
                    f"{meta.state.value})")
            if meta is None or meta.state == S.DEAD:
                # A new (or expired and removed) id starts a fresh incarnation.
                pid = self._next_producer_id()
                now = clock.now_ms()
                # A new incarnation: its generations sort after every earlier one's.
                incarnation = now if meta is None else max(now, meta.incarnation_ms + 1)
                fresh = TransactionMetadata(transactional_id, pid, 0, S.EMPTY, timeout_ms,
                                            update_ms=now, reason="init",
                                            incarnation_ms=incarnation)
                if self._publish(version + 1, fresh):
                    return pid, 0
                continue
            if meta.state == S.ONGOING:
                self._fence_and_abort(transactional_id, "fenced by a new instance")
                continue
            if meta.state in PREPARED or meta.state == S.PREPARE_EPOCH_FENCE:
                self.complete(transactional_id)
                continue
            pid, epoch = self._next_identity(meta.producer_id, meta.epoch)
            bumped = meta.transition(S.EMPTY, producer_id=pid, epoch=epoch,
                                     timeout_ms=timeout_ms, reason="init")
            if self._publish(version + 1, bumped):
                return pid, epoch

    # --- AddPartitionsToTxn / AddOffsetsToTxn -----------------------------------------------

    @staticmethod
    def _expired_under(member: TransactionMember) -> InvalidPidMappingError:
        return InvalidPidMappingError(
            f"transactional id {member.transactional_id!r} expired while producer "
            f"{member.producer_id} epoch {member.epoch} held it (idle longer than "
            "transactional.id.expiration.ms); abort the transaction to start the id again "
            "under a new producer id")

    def _check_member(self, meta: TransactionMetadata | None, member: TransactionMember
                      ) -> TransactionMetadata:
        if meta is None:  # a member exists only after InitProducerId: the id was deleted
            raise self._expired_under(member)
        if meta.producer_id != member.producer_id or meta.epoch != member.epoch:
            why = f" ({meta.reason})" if meta.reason else ""
            raise ProducerFencedError(
                f"producer {member.producer_id} epoch {member.epoch} of transactional id "
                f"{member.transactional_id!r} was fenced: the id is now at producer "
                f"{meta.producer_id} epoch {meta.epoch}, state {meta.state.value}{why}")
        if meta.state == S.DEAD:
            raise self._expired_under(member)
        if meta.state in PREPARED or meta.state == S.PREPARE_EPOCH_FENCE:
            raise ConcurrentTransactionsError(
                f"transactional id {member.transactional_id!r} is completing a transaction "
                f"({meta.state.value})")
        return meta

    def _join(self, member: TransactionMember, partitions: list[tuple[str, int]],
              offsets: dict[str, dict[tuple[str, int], int]]) -> None:
        """Move to (or stay in) Ongoing with more partitions and/or pending offsets."""
        expired = False
        decided = False

        def step(version: int, value: dict | None) -> dict | None:
            nonlocal expired, decided
            expired = decided = False  # a guessed run's findings are not kept (chain.update)
            meta = self._check_member(
                None if value is None else TransactionMetadata.from_dict(value), member)
            now = clock.now_ms()
            if meta.state == S.ONGOING:
                if meta.decision_id != member.decision_id:
                    raise InvalidTxnStateError(
                        f"transactional id {member.transactional_id!r}: decision id "
                        f"{member.decision_id!r} differs from the open transaction's "
                        f"{meta.decision_id!r}")
                # Published decision, metadata not rolled forward yet (the ender
                # failed or is still at it): nothing may join after the commit point.
                # Checked before expiry: a decided transaction is not aborted by age.
                if self.decision(meta.decision_id) is not None:
                    decided = True
                    return None
                if self._expired(meta, now):
                    expired = True
                    return None
            new_parts = tuple(sorted(set(meta.partitions if meta.state == S.ONGOING else ())
                                     | set(partitions)))
            pending = {g: dict(o) for g, o in meta.pending_offsets.items()} \
                if meta.state == S.ONGOING else {}
            for group, offs in offsets.items():
                pending.setdefault(group, {}).update(offs)
            if meta.state == S.ONGOING and new_parts == meta.partitions and \
                    pending == meta.pending_offsets:
                return None
            start = meta.txn_start_ms if meta.state == S.ONGOING else now
            return meta.transition(
                S.ONGOING, partitions=new_parts, pending_offsets=pending, txn_start_ms=start,
                decision_id=member.decision_id, txn_producer_id=member.producer_id,
                txn_epoch=member.epoch, reason="").to_dict()

        self._chain(member.transactional_id).update(step, guess_own_head=True)
        if decided:
            self.complete(member.transactional_id, only_decision=member.decision_id)
            raise InvalidTxnStateError(
                f"transaction {member.decision_id!r} of {member.transactional_id!r} is already "
                "decided; nothing can join it (call init_transactions() to go on)")
        if expired:
            self.abort_if_expired(member.transactional_id)
            raise ProducerFencedError(
                f"transaction of {member.transactional_id!r} exceeded its timeout and was "
                "aborted")

    def add_partitions(self, member: TransactionMember, partitions: list[tuple[str, int]]) -> None:
        for topic, partition in partitions:
            self._partition(topic, partition)  # fails clearly for an unknown one
        self._join(member, partitions, {})

    def add_offsets(self, member: TransactionMember, group_id: str,
                    offsets: dict[tuple[str, int], int]) -> None:
        validate_name(group_id, "group id")
        check_offsets(offsets)
        self._join(member, [], {group_id: dict(offsets)})

    # --- EndTxn ---------------------------------------------------------------------------------

    def end_transaction(self, member: TransactionMember, commit: bool) -> tuple[int, int]:
        """EndTxn for a producer's own transaction; returns its next (producer id, epoch)."""
        _, meta = self._latest(member.transactional_id)
        meta = self._check_member(meta, member)
        if meta.state != S.ONGOING:
            raise InvalidTxnStateError(
                f"transactional id {member.transactional_id!r} has no open transaction to "
                f"{'commit' if commit else 'abort'} (state {meta.state.value})")
        decision = self._decide(meta.decision_id, commit, [(member.producer_id, member.epoch)],
                                "EndTxn")
        with self._owning([member.transactional_id]):
            final = self.complete(member.transactional_id, only_decision=meta.decision_id)
        committed = decision.commits(member.producer_id, member.epoch)
        if commit and not committed:
            raise TransactionAbortedError(
                f"transaction of {member.transactional_id!r} was aborted before it could commit "
                f"({decision.reason or 'aborted'})")
        if final is not None and final.state in COMPLETE and \
                final.decision_id == meta.decision_id and \
                (final.txn_producer_id, final.txn_epoch) == (member.producer_id, member.epoch):
            return final.producer_id, final.epoch
        # Someone else finished the transaction and a newer instance has taken the
        # id since: the outcome stands, but this producer keeps its old identity,
        # so its next request is fenced.
        return member.producer_id, member.epoch

    def end_shared_transaction(self, decision_id: str, members: list[TransactionMember],
                               commit: bool) -> Decision:
        """Decide a multi-producer transaction once, then complete each member.

        Safe to call again and in any order: the first decision stands.  An
        ABORT request returns the standing decision, whatever it is (Spark
        aborts after a failed commit).  A COMMIT request that meets a decision
        not committing every member given (an ABORT, a COMMIT with fewer
        members, or an earlier job's decision under a re-used id) completes
        those members, whose records are then aborted, and raises
        ``DecisionConflictError``: the caller is never told "committed" for
        records that are not.
        """
        for m in members:
            if m.decision_id != decision_id:
                raise InvalidTxnStateError(
                    f"member {m.transactional_id!r} belongs to decision {m.decision_id!r}, "
                    f"not {decision_id!r}")
        decision = self._decide(decision_id, commit,
                                [(m.producer_id, m.epoch) for m in members], "EndTxn (shared)")
        with self._owning([m.transactional_id for m in members]):
            for m in members:
                self.complete(m.transactional_id, only_decision=decision_id)
        if commit:
            left_out = [m.transactional_id for m in members
                        if not decision.commits(m.producer_id, m.epoch)]
            if left_out:
                standing = "an ABORT" if not decision.commit else "a COMMIT of other members"
                raise DecisionConflictError(
                    f"decision {decision_id!r} already stands as {standing} "
                    f"({decision.reason or 'no reason recorded'}); the records of "
                    f"{', '.join(map(repr, left_out))} are aborted, not committed",
                    decision_id, left_out)
        return decision

    # --- completion, fencing, timeouts ---------------------------------------------------------------

    def complete(self, transactional_id: str,
                 only_decision: str | None = None) -> TransactionMetadata | None:
        """Roll a decided transaction forward: markers, group offsets, Complete*.

        Does nothing for an undecided transaction (or one of another decision
        than ``only_decision``).  Every step is idempotent, so any number of
        processes may run this at once.  Finishing a transaction that this
        thread is not ending itself is logged: it means its ender stopped
        half-way, or a fence or timeout aborted it.
        """
        while True:
            version, meta = self._latest(transactional_id)
            if meta is None:
                return None
            if only_decision is not None and meta.decision_id != only_decision:
                return meta
            if meta.state in (S.ONGOING, S.PREPARE_EPOCH_FENCE):
                decision = self.decision(meta.decision_id)
                if decision is None:
                    if meta.state == S.ONGOING:
                        return meta  # undecided: nothing to roll forward
                    # A fence is only published after its ABORT decision; repair if not.
                    decision = self._decide(meta.decision_id, False, [], meta.reason)
                if decision.commits(meta.txn_producer_id, meta.txn_epoch):
                    if meta.state == S.PREPARE_EPOCH_FENCE:
                        raise InvalidTxnStateError(
                            f"transactional id {transactional_id!r} was fenced for abort but "
                            f"its decision {meta.decision_id!r} commits it")
                    nxt = meta.transition(S.PREPARE_COMMIT)
                else:
                    nxt = meta.transition(S.PREPARE_ABORT)
                self._publish(version + 1, nxt)  # a lost race just means: reload
                continue
            if meta.state in PREPARED:
                return self._finish(version, meta)
            return meta

    def _finish(self, version: int, meta: TransactionMetadata) -> TransactionMetadata:
        commit = meta.state == S.PREPARE_COMMIT
        marker_epoch = meta.txn_epoch + 1

        def mark(tp: tuple[str, int]) -> None:
            self._partition(*tp).append_marker(
                meta.txn_producer_id, marker_epoch, commit, coordinator_epoch=version,
                decision_id=meta.decision_id, transactional_id=meta.transactional_id)

        def apply(group: str) -> None:
            apply_transactional_offsets(self.storage, group, meta.pending_offsets[group],
                                        meta.transactional_id, version,
                                        (meta.txn_producer_id, meta.txn_epoch),
                                        meta.incarnation_ms)

        # Every marker and group-offset update before the Complete version (each is
        # idempotent: 2.3, section 9), all at once: the decision already fixed the
        # outcome, and nothing orders one partition's marker, or a group's offsets,
        # after another's (protocol.md 4.6).
        steps = [(mark, tuple(tp)) for tp in meta.partitions]
        if commit:
            steps += [(apply, group) for group in meta.pending_offsets]
        if len(steps) > 1:
            # Every step ends before this returns or raises (the first error in order):
            # nothing of this roll-forward is still writing when the caller goes on.
            futures = [_marker_pool().submit(fn, arg) for fn, arg in steps]
            wait(futures)
            for future in futures:
                future.result()
        else:
            for fn, arg in steps:
                fn(arg)
        pid, epoch = self._next_identity(meta.txn_producer_id, meta.txn_epoch)
        done = meta.transition(
            S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT, producer_id=pid, epoch=epoch,
            partitions=(), pending_offsets={})
        if self._publish(version + 1, done):
            if meta.transactional_id not in self._ending():
                logger.info("rolled forward transaction %r of %r (producer %d epoch %d): %s in "
                            "%d partition(s)", meta.decision_id, meta.transactional_id,
                            meta.txn_producer_id, meta.txn_epoch,
                            "COMMIT" if commit else "ABORT", len(meta.partitions))
            return done
        _, latest = self._latest(meta.transactional_id)
        assert latest is not None
        return latest

    def _fence_and_abort(self, transactional_id: str, reason: str,
                         only: TransactionMetadata | None = None) -> None:
        """Abort the Ongoing transaction of ``transactional_id`` and fence its producer.

        With ``only``, abort nothing but that transaction (same decision id,
        producer id and epoch): a timeout seen on an older read must not
        abort the transaction that has replaced it since (Kafka checks the
        producer id and epoch before aborting a timed-out transaction).

        The ABORT decision is published first (unless a COMMIT won the race,
        which then rolls forward).  For a member of a shared transaction that
        decision is the shared one, so the whole shared transaction aborts:
        aborting one member alone would need a second commit point, and
        readers could then see the member flip from committed to aborted.
        """
        version, meta = self._latest(transactional_id)
        if meta is None or meta.state != S.ONGOING or (only is not None and (
                meta.decision_id, meta.txn_producer_id, meta.txn_epoch) != (
                only.decision_id, only.txn_producer_id, only.txn_epoch)):
            self.complete(transactional_id)
            return
        decision = self._decide(meta.decision_id, False, [], reason)
        if not decision.commits(meta.txn_producer_id, meta.txn_epoch):
            fenced = meta.transition(S.PREPARE_EPOCH_FENCE, epoch=meta.epoch + 1, reason=reason)
            self._publish(version + 1, fenced)  # losing the race is fine: complete() reloads
        self.complete(transactional_id)

    def fence_writer(self, transactional_id: str, producer_id: int, epoch: int,
                     reason: str) -> None:
        """Make sure the transaction of ``(producer_id, epoch)`` can no longer commit
        anything it has not committed yet: abort it if it is open and undecided, roll
        it forward if decided, and if the id is idle at exactly that identity, bump
        the epoch so that the identity can start nothing more.

        Used by a group member that takes over partitions from a stale generation
        (KIP-447, docs/protocol.md section 9.4): the stale member's transaction must
        be decided before the new owner reads the committed offsets.  An identity
        the id has already moved past needs nothing: its transaction is complete.
        """
        while True:
            version, meta = self._latest(transactional_id)
            if meta is None:
                return
            if meta.state in PREPARED or meta.state == S.PREPARE_EPOCH_FENCE:
                self.complete(transactional_id)
                continue
            if meta.state == S.ONGOING:
                if (meta.txn_producer_id, meta.txn_epoch) == (producer_id, epoch):
                    self._fence_and_abort(transactional_id, reason, only=meta)
                return
            if meta.state in (S.EMPTY, *COMPLETE) and \
                    (meta.producer_id, meta.epoch) == (producer_id, epoch):
                pid, new_epoch = self._next_identity(producer_id, epoch)
                if self._publish(version + 1, meta.transition(
                        S.EMPTY, producer_id=pid, epoch=new_epoch, reason=reason)):
                    return
                continue
            return

    def abort_if_expired(self, transactional_id: str) -> bool:
        meta = self.metadata(transactional_id)
        if meta is None or not self._expired(meta, clock.now_ms()):
            return False
        self._fence_and_abort(transactional_id, "transaction timed out", only=meta)
        # True only if it ended aborted: a commit decision may have come first.
        decision = self.decision(meta.decision_id)
        aborted = decision is not None and \
            not decision.commits(meta.txn_producer_id, meta.txn_epoch)
        if aborted:
            # Its producer stalled or died mid-transaction: its records will never be read.
            logger.info("aborted transaction %r of %r (producer %d epoch %d): ongoing for "
                        "longer than its timeout of %d ms", meta.decision_id, transactional_id,
                        meta.txn_producer_id, meta.txn_epoch, meta.timeout_ms)
        return aborted

    def abort_expired(self) -> list[str]:
        """Abort every expired Ongoing transaction and roll forward decided ones."""
        aborted = []
        for txn_id in self.transactional_ids():
            if self.abort_if_expired(txn_id):
                aborted.append(txn_id)
            else:
                self.complete(txn_id)
        return aborted

    def abort_expired_in(self, topic: str, partition: int, state: ProducerState | None = None,
                         own: tuple[int, int] | None = None) -> list[str]:
        """Abort expired transactions holding back one partition; finish decided ones.

        A producer sweeping after its own append passes the state that append
        just proved (no refresh) and ``own``, its producer id and epoch: its own
        open transaction is live, so no coordinator read is spent on it
        (docs/protocol.md, 4.9).
        """
        if state is None:
            state = self._partition(topic, partition).state()
        aborted = []
        for txn in state.open_transactions():
            if not txn.transactional_id or (txn.producer_id, txn.epoch) == own:
                continue
            if self.resolve(txn) is not None:
                self.complete(txn.transactional_id, only_decision=txn.decision_id)
            elif self.abort_if_expired(txn.transactional_id):
                aborted.append(txn.transactional_id)
        return aborted

    def find_hanging(self, partitions: list[tuple[str, int]], older_than_ms: int | None = None,
                     now_ms: int | None = None) -> list[HangingTransaction]:
        """Undecided transactions holding back an LSO with no live owner (kafka-transactions'
        find-hanging).

        A transaction open in a partition hangs when nothing will end it by
        itself: its coordinator state no longer describes it (the id is gone,
        or has moved on to another producer id or epoch), or it has outlived
        its timeout (a shared one: its lease too), so its producer is dead or
        would be fenced at its next request. With ``older_than_ms``, also any
        open longer than that, whatever its timeout.
        """
        now = clock.now_ms() if now_ms is None else now_ms
        found = []
        for topic, partition in partitions:
            for txn in self._partition(topic, partition).state().open_transactions():
                if self.resolve(txn) is not None:
                    continue  # decided: its markers are only late, it holds no LSO
                meta = self.metadata(txn.transactional_id) if txn.transactional_id else None
                if meta is None or meta.state != S.ONGOING or \
                        (meta.txn_producer_id, meta.txn_epoch) != (txn.producer_id, txn.epoch):
                    reason = "no coordinator state describes it"
                elif self._expired(meta, now):
                    reason = f"open past its timeout of {meta.timeout_ms} ms"
                elif older_than_ms is not None and now - meta.txn_start_ms > older_than_ms:
                    reason = f"open longer than {older_than_ms} ms"
                else:
                    continue
                found.append(HangingTransaction(
                    topic, partition, txn.first_offset, txn.producer_id, txn.epoch,
                    txn.transactional_id, txn.decision_id,
                    meta.txn_start_ms if meta is not None else -1, reason))
        return found

    def expire_transactional_ids(self, max_idle_ms: int) -> list[str]:
        """Mark ids idle (Empty or Complete*) for longer than ``max_idle_ms`` as Dead.

        A Dead id starts over with a new producer id at its next InitProducerId;
        gc deletes its chain once the Dead version is old (``delete_dead``).
        """
        return [txn_id for txn_id in self.transactional_ids()
                if self.expire_idle(txn_id, max_idle_ms)]

    def expire_idle(self, transactional_id: str, max_idle_ms: int) -> bool:
        """Move one id to Dead if it is idle (Empty or Complete*) for longer than
        ``max_idle_ms`` (Kafka's transactional.id.expiration.ms); True if it moved."""
        def step(version: int, value: dict | None) -> dict | None:
            if value is None:
                return None
            meta = TransactionMetadata.from_dict(value)
            idle = clock.now_ms() - meta.update_ms
            if meta.state not in (S.EMPTY, *COMPLETE) or idle <= max_idle_ms:
                return None
            return meta.transition(S.DEAD, reason="transactional id expired").to_dict()

        chain = self._chain(transactional_id)
        before, _ = chain.latest()
        after, _ = chain.update(step)
        return after != before

    def delete_dead(self, transactional_id: str, dead_before_ms: int) -> list[str]:
        """Delete the whole chain of an id whose newest version is Dead since before
        ``dead_before_ms``; returns the paths deleted (docs/protocol.md, 4.10).

        Oldest version first, the Dead one last: until it goes, the chain still
        says Dead.  An InitProducerId racing with this either finds the Dead
        version and publishes the next one (which stays, as a chain's newest
        version may lack its predecessor, and carries a new incarnation), or
        finds its predecessor gone and reads the chain again.
        """
        directory = f"{TXN_DIR}/{validate_name(transactional_id, 'transactional id')}"
        names = sorted(n for n in self.storage.list(directory) if n.isdigit())
        if not names:
            return []
        try:
            newest = msgpack.unpackb(self.storage.read(f"{directory}/{names[-1]}"),
                                     strict_map_key=False)
        except FileNotFoundError:
            return []
        if newest.get("state") != S.DEAD.value or newest.get("update_ms", 0) >= dead_before_ms:
            return []
        deleted = []
        for name in names:
            self.storage.delete(f"{directory}/{name}")
            deleted.append(f"{directory}/{name}")
        self.storage.delete(directory)
        self._chains.pop(transactional_id, None)
        return deleted

    def forget(self, transactional_id: str) -> None:
        """Drop this process's cached chain of an id whose chain was just deleted (a finished
        job attempt's, exactly_once/shared_transaction.py): its next use lists it afresh."""
        self._chains.pop(transactional_id, None)

    # --- leases of shared transactions ------------------------------------------------------

    def renew_lease(self, decision_id: str, unless_younger_than_ms: int = 0) -> int:
        """Record that a participant of shared transaction ``decision_id`` is alive now.

        A member of a shared transaction times out only when the lease of
        its decision is older than its timeout: a member that prepared early
        must not be aborted while the rest of its job still runs (Kafka's
        KIP-939 problem), and a job whose every participant and driver died
        stops renewing and is aborted after the timeout.  A lease renewed
        less than ``unless_younger_than_ms`` ago is left as it is (a task
        joining a job its driver or another task has just renewed; protocol
        5, "the lease").  Returns the lease's time after the call.
        """
        validate_name(decision_id, "decision id")
        now = clock.now_ms()
        def step(version: int, value: dict | None) -> dict | None:
            if value is not None and (value["time_ms"] >= now or
                                      now - value["time_ms"] < unless_younger_than_ms):
                return None
            return {"time_ms": now}
        _, value = self._lease(decision_id).update(step)
        return -1 if value is None else int(value["time_ms"])

    def lease_ms(self, decision_id: str) -> int:
        """When the lease of ``decision_id`` was last renewed (-1: never)."""
        _, value = self._lease(decision_id).latest()
        return -1 if value is None else value["time_ms"]

    def _lease(self, decision_id: str) -> VersionChain:
        key = f"lease:{decision_id}"
        chain = self._chains.get(key)
        if chain is None:
            validate_name(decision_id, "decision id")
            chain = self._chains.setdefault(key, VersionChain(self.storage,
                                                              f"{LEASE_DIR}/{decision_id}"))
        return chain

    def _expired(self, meta: TransactionMetadata, now_ms: int) -> bool:
        if not meta.expired(now_ms):
            return False  # the lease can only make it younger
        lease = self.lease_ms(meta.decision_id) if meta.is_shared else -1
        return meta.expired(now_ms, lease)

    def abort_decision(self, decision_id: str, reason: str) -> Decision:
        """Decide ABORT for a (shared) transaction unless a decision stands; returns the
        standing one.  For a job declared dead whose attempts have not all opened yet."""
        return self._decide(decision_id, False, [], reason)

    def abort_open(self, transactional_id: str, reason: str) -> None:
        """Abort the open transaction of ``transactional_id`` now, whatever its age (an operator's
        or a new job's call; a member of a shared transaction aborts it whole)."""
        self._fence_and_abort(transactional_id, reason)
