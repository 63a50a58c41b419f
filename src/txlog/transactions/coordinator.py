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

``TransactionCoordinator`` is the one entry point every caller uses.  It
answers the producer's requests itself and hands the rest to its parts: the
records and their transitions (metadata.py), where they are stored
(store.py), ending and rolling forward (ending.py), and the sweeps over many
transactions (sweeps.py).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from .. import clock
from ..errors import (InvalidTransactionTimeoutError, InvalidTxnStateError,
                      ProducerFencedError)
from ..integers import is_int
from ..format.batch import BatchHeader
from ..partition.producer_state import OpenTransaction, ProducerState
from ..storage.names import validate_name
from .ending import Ending, TransactionEnder
from .groups import check_offsets
from .metadata import (PREPARED, Decision, TransactionMember, TransactionMetadata,
                       TxnState as S, check_member, plain_decision_id)
from .store import CoordinatorStore
from .sweeps import HangingTransaction, Sweeps

if TYPE_CHECKING:
    from ..partition.partition_log import PartitionLog
    from ..storage.contract import Storage

MAX_TRANSACTION_TIMEOUT_MS = 900_000  # Kafka's transaction.max.timeout.ms default


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

class TransactionCoordinator:
    """Transactions of one log root, given only what they touch of it.

    ``next_producer_id`` hands out a fresh producer id (producer_ids.py) and
    ``partition(topic, partition)`` opens a partition (raising for unknown
    ones), so that the coordinator can check the partitions a transaction
    adds, write its markers and find the transactions holding a partition
    back; it needs nothing else of the ``Log`` that builds it.

    It answers a producer's requests (InitProducerId, AddPartitionsToTxn,
    AddOffsetsToTxn, EndTxn) itself and composes the rest: ``store`` (the
    metadata chains, decisions and leases), ``ender`` (decisions, markers,
    roll-forward, fencing) and ``sweeps`` (timeouts, hanging transactions,
    expired ids).
    """

    def __init__(self, storage: Storage, next_producer_id: Callable[[], int],
                 partition: Callable[[str, int], PartitionLog]) -> None:
        self.storage = storage
        self._partition = partition
        self.store = CoordinatorStore(storage, next_producer_id)
        self.ender = TransactionEnder(self.store, partition)
        self.sweeps = Sweeps(self.store, self.ender, partition)

    # --- state --------------------------------------------------------------------------------

    def metadata(self, transactional_id: str) -> TransactionMetadata | None:
        """Latest metadata of a transactional id (None if it never existed)."""
        return self.store.metadata(transactional_id)

    def transactional_ids(self) -> list[str]:
        return self.store.transactional_ids()

    def decision(self, decision_id: str) -> Decision | None:
        return self.store.decision(decision_id)

    def resolve(self, txn: OpenTransaction) -> bool | None:
        """Outcome of a transaction still open in a partition: None while undecided."""
        return self.store.resolve(txn)

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
        meta = self.store.metadata(header.transactional_id)
        return meta is not None and meta.state == S.ONGOING and \
            meta.writes_as(header.decision_id, header.producer_id, header.producer_epoch) and \
            self.store.decision(header.decision_id) is None

    # --- InitProducerId ------------------------------------------------------------------

    def init_producer_id(self, transactional_id: str, timeout_ms: int,
                         expired: tuple[int, int] | None = None) -> tuple[int, int]:
        """Fence every older instance and return the new (producer id, epoch).

        ``expired`` is the (producer id, epoch) of a producer whose id expired under
        it (InvalidPidMappingError), starting again: it may only start a fresh
        incarnation, where the id is gone or Dead at that identity, never fence an
        instance that took the id meanwhile (Kafka checks the expected producer id
        and epoch of InitProducerId the same way, KIP-360)."""
        if not is_int(timeout_ms) or not 1 <= timeout_ms <= MAX_TRANSACTION_TIMEOUT_MS:
            raise InvalidTransactionTimeoutError(
                f"transaction_timeout_ms must be an integer from 1 to "
                f"{MAX_TRANSACTION_TIMEOUT_MS}, not {timeout_ms!r}")
        while True:
            version, meta = self.store.latest(transactional_id)
            if expired is not None and meta is not None and not (
                    meta.state == S.DEAD and (meta.producer_id, meta.epoch) == expired):
                raise ProducerFencedError(
                    f"producer {expired[0]} epoch {expired[1]} of transactional id "
                    f"{transactional_id!r} was fenced: after the id expired, another instance "
                    f"took it (now producer {meta.producer_id} epoch {meta.epoch}, state "
                    f"{meta.state.value})")
            if meta is None or meta.state == S.DEAD:
                # A new (or expired and removed) id starts a fresh incarnation.
                pid = self.store.new_producer_id()
                fresh = TransactionMetadata.incarnation(transactional_id, pid, timeout_ms, meta)
                if self.store.publish(version + 1, fresh):
                    return pid, 0
                continue
            if meta.state == S.ONGOING:
                self.ender.fence_and_abort(transactional_id, "fenced by a new instance")
                continue
            if meta.state in PREPARED or meta.state == S.PREPARE_EPOCH_FENCE:
                self.ender.complete(transactional_id)
                continue
            pid, epoch = self.store.next_identity(meta.producer_id, meta.epoch)
            if self.store.publish(version + 1, meta.bumped(pid, epoch, "init", timeout_ms)):
                return pid, epoch

    # --- AddPartitionsToTxn / AddOffsetsToTxn -----------------------------------------------

    def _join(self, member: TransactionMember, partitions: list[tuple[str, int]],
              offsets: dict[str, dict[tuple[str, int], int]],
              complete: TransactionMetadata | None = None) -> None:
        """Move to (or stay in) Ongoing with more partitions and/or pending offsets.

        ``complete``: the Complete* version of the producer's previous transaction, whose
        markers and offsets are written, left unpublished by its roll-forward; published
        in one version with this Ongoing one while that transaction's decided Ongoing
        version is still the newest (protocol.md 4.5.2)."""
        expired = decided = opened = False
        shared = member.decision_id != plain_decision_id(member.producer_id, member.epoch)

        def step(current: TransactionMetadata | None) -> TransactionMetadata | None:
            nonlocal expired, decided, opened
            expired = decided = opened = False  # a guessed run's findings are not kept
            if complete is not None and current is not None and \
                    current.state == S.ONGOING and current.writes_as(
                        complete.decision_id, complete.txn_producer_id, complete.txn_epoch):
                current = complete
            meta = check_member(current, member)
            now = clock.now_ms()
            if meta.state != S.ONGOING and shared:
                # A late participant (a killed task's worker, a speculative loser) must
                # not open a transaction under a job already decided (protocol.md 4.4).
                decided = self.store.decision(member.decision_id) is not None
                opened = not decided
                if decided:
                    return None
            if meta.state == S.ONGOING:
                if meta.decision_id != member.decision_id:
                    raise InvalidTxnStateError(
                        f"transactional id {member.transactional_id!r}: decision id "
                        f"{member.decision_id!r} differs from the open transaction's "
                        f"{meta.decision_id!r}")
                # Published decision, metadata not rolled forward yet (the ender
                # failed or is still at it): nothing may join after the commit point.
                # Checked before expiry: a decided transaction is not aborted by age.
                if self.store.decision(meta.decision_id) is not None:
                    decided = True
                    return None
                if self.store.expired(meta, now):
                    expired = True
                    return None
            return meta.joined(member, partitions, offsets, now)

        self.store.update(member.transactional_id, step, guess_own_head=True)
        if opened and self.store.decision(member.decision_id) is not None:
            decided = True  # decided between the check and the publish: end it here
        if decided:
            self.ender.complete(member.transactional_id, only_decision=member.decision_id)
            raise InvalidTxnStateError(
                f"transaction {member.decision_id!r} of {member.transactional_id!r} is already "
                "decided; nothing can join it (call init_transactions() to go on)")
        if expired:
            self.sweeps.abort_if_expired(member.transactional_id)
            raise ProducerFencedError(
                f"transaction of {member.transactional_id!r} exceeded its timeout and was "
                "aborted")

    def add_partitions(self, member: TransactionMember, partitions: list[tuple[str, int]],
                       previous: tuple[str, Future[TransactionMetadata | None]] | None = None
                       ) -> None:
        """AddPartitionsToTxn.  ``previous``: the decision id and roll-forward (its
        ``Ending.completion``) of the producer's previous transaction, run by this process,
        which the join waits for; where its Complete* version is not published yet, the
        join publishes it with its own Ongoing version, one durable step instead of two
        (protocol.md 4.5.2)."""
        for topic, partition in partitions:
            self._partition(topic, partition)  # fails clearly for an unknown one
        if previous is None:
            self._join(member, partitions, {})
            return
        decision_id, completion = previous
        complete = self.ender.outcome_written(member.transactional_id, decision_id, completion)
        try:
            self._join(member, partitions, {}, complete)
        except BaseException:
            if complete is not None:  # its Complete* may be unpublished: publish it now
                self.ender.complete(member.transactional_id, only_decision=decision_id)
            raise

    def add_offsets(self, member: TransactionMember, group_id: str,
                    offsets: dict[tuple[str, int], int]) -> None:
        validate_name(group_id, "group id")
        check_offsets(offsets)
        self._join(member, [], {group_id: dict(offsets)})

    # --- EndTxn ---------------------------------------------------------------------------------

    def await_roll_forward(self, transactional_id: str, decision_id: str,
                           completion: Future[TransactionMetadata | None]) -> None:
        """Wait for an ``Ending.completion``; one that failed is completed here again,
        raising the error if it persists (protocol.md 4.5.1)."""
        self.ender.await_roll_forward(transactional_id, decision_id, completion)

    def hurry_roll_forward(self, transactional_id: str) -> None:
        """The caller is about to wait for this process's roll-forward of
        ``transactional_id``: it publishes its Complete* now rather than keep it a moment
        for the producer's next join (protocol.md 4.5.2)."""
        self.ender.hurry(transactional_id)

    def end_transaction(self, member: TransactionMember, commit: bool) -> Ending:
        """EndTxn for a producer's own transaction, answered once the decision is durable:
        its outcome, the producer's next (producer id, epoch), and the roll-forward
        (markers, group offsets, Complete*) running behind it (docs/protocol.md 4.5)."""
        return self.ender.end_transaction(member, commit)

    def decide_shared_transaction(self, decision_id: str, members: list[TransactionMember],
                                  commit: bool) -> tuple[Decision, Future[None]]:
        """``end_shared_transaction``, answered once the decision is durable: every member
        is completed at once behind the returned future (its error: the first member's
        that failed)."""
        return self.ender.end_shared_transaction(decision_id, members, commit)

    def end_shared_transaction(self, decision_id: str, members: list[TransactionMember],
                               commit: bool) -> Decision:
        """Decide a multi-producer transaction once, then complete every member at once.

        Safe to call again and in any order: the first decision stands.  An
        ABORT request returns the standing decision, whatever it is (Spark
        aborts after a failed commit).  A COMMIT request that meets a decision
        not committing every member given (an ABORT, a COMMIT with fewer
        members, or an earlier job's decision under a re-used id) completes
        those members, whose records are then aborted, and raises
        ``DecisionConflictError``: the caller is never told "committed" for
        records that are not.
        """
        decision, completion = self.ender.end_shared_transaction(decision_id, members, commit)
        completion.result()
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
        return self.ender.complete(transactional_id, only_decision)

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
        self.ender.fence_writer(transactional_id, producer_id, epoch, reason)

    def abort_if_expired(self, transactional_id: str) -> bool:
        """Abort the transaction if it outlived its timeout; True if it ended aborted."""
        return self.sweeps.abort_if_expired(transactional_id)

    def abort_expired(self) -> list[str]:
        """Abort every expired Ongoing transaction and roll forward decided ones."""
        return self.sweeps.abort_expired()

    def abort_expired_in(self, topic: str, partition: int, state: ProducerState | None = None,
                         own: tuple[int, int] | None = None) -> list[str]:
        """Abort expired transactions holding back one partition; finish decided ones.

        A producer sweeping after its own append passes the state that append
        just proved (no refresh) and ``own``, its producer id and epoch: its own
        open transaction is live, so no coordinator read is spent on it
        (docs/protocol.md, 4.9).
        """
        return self.sweeps.abort_expired_in(topic, partition, state, own)

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
        return self.sweeps.find_hanging(partitions, older_than_ms, now_ms)

    def undecided_transactions(self, partitions: list[tuple[str, int]],
                               now_ms: int | None = None) -> list[HangingTransaction]:
        """Every undecided transaction open in these partitions (one entry per partition it
        holds), hanging ones with find_hanging's reason, the others with an empty one: what
        an operator counts and ages (txlog metrics)."""
        return self.sweeps.undecided(partitions, None, now_ms)

    def expire_transactional_ids(self, max_idle_ms: int) -> list[str]:
        """Mark ids idle (Empty or Complete*) for longer than ``max_idle_ms`` as Dead.

        A Dead id starts over with a new producer id at its next InitProducerId;
        gc deletes its chain once the Dead version is old (``delete_dead``).
        """
        return self.sweeps.expire_transactional_ids(max_idle_ms)

    def expire_idle(self, transactional_id: str, max_idle_ms: int) -> bool:
        """Move one id to Dead if it is idle (Empty or Complete*) for longer than
        ``max_idle_ms`` (Kafka's transactional.id.expiration.ms); True if it moved."""
        return self.sweeps.expire_idle(transactional_id, max_idle_ms)

    def delete_dead(self, transactional_id: str, dead_before_ms: int) -> list[str]:
        """Delete the whole chain of an id whose newest version is Dead since before
        ``dead_before_ms``; returns the paths deleted (docs/protocol.md, 4.10).

        Oldest version first, the Dead one last: until it goes, the chain still
        says Dead.  An InitProducerId racing with this either finds the Dead
        version and publishes the next one (which stays, as a chain's newest
        version may lack its predecessor, and carries a new incarnation), or
        finds its predecessor gone and reads the chain again.
        """
        return self.sweeps.delete_dead(transactional_id, dead_before_ms)

    def forget(self, transactional_id: str) -> None:
        """Drop this process's cached chain of an id whose chain was just deleted (a finished
        job attempt's, exactly_once/shared_transaction.py): its next use lists it afresh."""
        self.store.forget(transactional_id)

    # --- shared transactions ------------------------------------------------------------------

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
        return self.store.renew_lease(decision_id, unless_younger_than_ms)

    def lease_ms(self, decision_id: str) -> int:
        """When the lease of ``decision_id`` was last renewed (-1: never)."""
        return self.store.lease_ms(decision_id)

    def abort_decision(self, decision_id: str, reason: str) -> Decision:
        """Decide ABORT for a (shared) transaction unless a decision stands; returns the
        standing one.  For a job declared dead whose attempts have not all opened yet."""
        return self.store.decide(decision_id, False, [], reason)

    def abort_open(self, transactional_id: str, reason: str) -> None:
        """Abort the open transaction of ``transactional_id`` now, whatever its age (an operator's
        or a new job's call; a member of a shared transaction aborts it whole)."""
        self.ender.fence_and_abort(transactional_id, reason)
