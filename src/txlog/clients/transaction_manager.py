"""The producer's side of idempotence and transactions (Kafka's TransactionManager).

Who the producer is (producer id and epoch), the next sequence of each
partition, where it is in its transactional life and what it has joined to
the transaction, and the error that poisons it: one object, so that every
rule about them is written once, and the coordinator is called from here
only (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and the
expiry sweep).  It never writes a batch: the sender asks it for sequences
and tells it what a failed append means.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, wait
from contextlib import contextmanager
from enum import Enum
from typing import TYPE_CHECKING

from ..errors import (CommitFailedError, IllegalStateError, InvalidConfigError,
                      InvalidPidMappingError, InvalidTxnStateError, ProducerFencedError)
from ..format.batch import NO_PRODUCER_EPOCH, NO_PRODUCER_ID
from ..storage.names import validate_name
from ..storage.pools import shared_pool
from ..transactions.metadata import TransactionMember, plain_decision_id
from ..transactions.groups import check_offsets, register_transactional_offsets
from .membership import check_generation

if TYPE_CHECKING:
    from ..root.root import Root

JOIN_THREADS = 8  # AddPartitionsToTxn requests of all producers of a process running at once

# How often a producer looks for expired or decided-but-unfinished transactions
# holding back a partition it writes to (there is no coordinator timer).
EXPIRY_CHECK_INTERVAL_S = 1.0


class ClientState(Enum):
    """Where a producer is in its transactional life (Kafka's TransactionManager.State).

    One value instead of a flag per question, so that every method asks the
    same thing the same way and a transition the table below does not allow
    is a bug found at once rather than a state nobody thought of.  The error
    that poisons a producer (a fence, a failed batch of a transaction) is
    kept beside it in ``TransactionManager.fatal``, as Kafka keeps ``lastError``.
    """

    UNINITIALIZED = "Uninitialized"  # transactional, before init_transactions()
    READY = "Ready"  # may begin a transaction (a producer without a transactional id: always)
    IN_TRANSACTION = "InTransaction"
    PREPARED = "Prepared"  # handed to a shared transaction's coordinator: init again first
    CLOSED = "Closed"


_S = ClientState
_TRANSITIONS: dict[ClientState, frozenset[ClientState]] = {
    _S.UNINITIALIZED: frozenset({_S.READY, _S.CLOSED}),
    _S.READY: frozenset({_S.READY, _S.IN_TRANSACTION, _S.CLOSED}),
    _S.IN_TRANSACTION: frozenset({_S.READY, _S.PREPARED, _S.CLOSED}),
    _S.PREPARED: frozenset({_S.READY, _S.CLOSED}),
    _S.CLOSED: frozenset(),
}


class TransactionManager:
    """One producer's identity, sequences and transactional state.

    Only the producer's caller's thread reads or changes it (a write behind
    reports to the sender, which settles in that thread).
    """

    def __init__(self, services: Root, transactional_id: str | None,
                 transaction_timeout_ms: int, enable_idempotence: bool) -> None:
        self._services = services
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.enable_idempotence = enable_idempotence
        self.producer_id = NO_PRODUCER_ID
        self.epoch = NO_PRODUCER_EPOCH
        self.sequences: dict[tuple[str, int], int] = {}
        self.fatal: BaseException | None = None
        self.needs_new_id = False  # set when a batch's outcome is unknown
        self.state = _S.READY if transactional_id is None else _S.UNINITIALIZED
        self.decision_id = ""
        self.partitions: set[tuple[str, int]] = set()
        self.has_offsets = False
        self._expiry_checked: dict[tuple[str, int], float] = {}
        # The previous transaction's roll-forward (its decision id and future) and the
        # AddPartitionsToTxn requests still running, oldest last (docs/protocol.md 4.5).
        self.completion: tuple[str, Future] | None = None
        self.joining: Future[None] | None = None
        if enable_idempotence and transactional_id is None:
            self.producer_id = services.producer_ids.next_id()
            self.epoch = 0

    # --- the state table -----------------------------------------------------------------

    def transition(self, state: ClientState) -> None:
        if state not in _TRANSITIONS[self.state]:
            raise IllegalStateError(f"producer {self.transactional_id!r}: no transition from "
                                    f"{self.state.value} to {state.value}")
        self.state = state

    def check_usable(self) -> None:
        if self.state is _S.CLOSED:
            raise IllegalStateError("the producer is closed")
        if self.fatal is not None:
            raise self.fatal
        if self.transactional_id is not None:
            if self.state in (_S.UNINITIALIZED, _S.PREPARED):
                raise IllegalStateError(
                    f"transactional producer {self.transactional_id!r}: call init_transactions() "
                    "first")

    def check_can_send(self, what: str) -> None:
        self.check_usable()
        if self.transactional_id is not None and self.state is not _S.IN_TRANSACTION:
            raise IllegalStateError(
                f"transactional producer {self.transactional_id!r}: {what} outside a "
                "transaction; call begin_transaction() first")
        if self.state is _S.PREPARED:
            raise IllegalStateError("the transaction was handed to its coordinator; "
                                    "no more records may join it")

    def require_transactional(self) -> str:
        if self.transactional_id is None:
            raise IllegalStateError(
                "this producer has no transactional_id; create it with "
                "log.producer(transactional_id=...)")
        return self.transactional_id

    def check_in_transaction(self, what: str) -> None:
        self.require_transactional()
        self.check_usable()
        if self.state is not _S.IN_TRANSACTION:
            raise IllegalStateError(f"{what} outside a transaction; call begin_transaction()")

    def close(self) -> None:
        self.transition(_S.CLOSED)

    # --- sequences and the errors that end them ---------------------------------------------

    def renew_id(self) -> None:
        """After an unknown outcome, before the next batch: a batch of the old id may
        have landed, so its sequences are never used again."""
        self.producer_id = self._services.producer_ids.next_id()
        self.epoch = 0
        self.sequences.clear()
        self.needs_new_id = False

    def take_sequence(self, tp: tuple[str, int], count: int) -> int:
        """The base sequence of ``tp``'s next batch of ``count`` records, taken now:
        batches of one partition are claimed in the order they took theirs."""
        sequence = self.sequences.get(tp, 0)
        self.sequences[tp] = (sequence + count) & 0x7FFFFFFF
        return sequence

    def rewind(self, tp: tuple[str, int], sequence: int) -> None:
        """A definitive rejection of the batch at ``sequence``: neither it nor the later
        ones landed, so the sequence is used again (unless the id is being replaced)."""
        if self.enable_idempotence and not self.needs_new_id and tp in self.sequences:
            self.sequences[tp] = sequence

    def outcome_unknown(self) -> None:
        """A batch may or may not have landed: the next batch goes under a new id."""
        self.needs_new_id = True
        self.sequences.clear()

    def poison(self, error: BaseException) -> None:
        """Raised by every later call until init or abort clears it (Kafka's lastError)."""
        self.fatal = error

    # --- the coordinator ---------------------------------------------------------------------

    def member(self) -> TransactionMember:
        return TransactionMember(self.require_transactional(), self.producer_id, self.epoch,
                                 self.decision_id, sorted(self.partitions))

    def init_transactions(self) -> None:
        """InitProducerId: fence older instances, abort or finish their transaction."""
        txn_id = self.require_transactional()
        if self.state is _S.CLOSED:
            raise IllegalStateError("the producer is closed")
        if self.state is _S.IN_TRANSACTION:
            raise IllegalStateError("init_transactions() during a transaction")
        self.settle_joins(raise_error=False)
        try:
            self.settle_completion()
        except Exception:  # InitProducerId completes the transaction again, or raises
            self.completion = None
        self.producer_id, self.epoch = self._services.coordinator.init_producer_id(
            txn_id, self.transaction_timeout_ms)
        self.sequences.clear()
        self.transition(_S.READY)
        self.fatal = None

    def begin(self, decision_id: str | None) -> None:
        self.require_transactional()
        self.check_usable()
        if self.state is _S.IN_TRANSACTION:
            raise IllegalStateError("a transaction is already in progress")
        if decision_id is not None:
            validate_name(decision_id, "decision id")
        self.decision_id = decision_id or self.plain_decision_id()
        self.partitions = set()
        self.has_offsets = False
        self.transition(_S.IN_TRANSACTION)

    def new_partitions(self, tps: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Which of ``tps`` a transactional producer has yet to join to its transaction."""
        if self.transactional_id is None:
            return []
        return [tp for tp in tps if tp not in self.partitions]

    def add_partitions(self, new: list[tuple[str, int]]) -> None:
        """AddPartitionsToTxn before any byte reaches a partition, so that whoever
        ends or fences this transaction knows to mark it.

        Sent in a thread, after the requests before it and the previous transaction's
        markers (the metadata chain has one head: the first join publishes that
        transaction's Complete* with its own version where the roll-forward has not yet):
        the caller stages its records meanwhile, and the sender settles it
        (``settle_joins``) before it writes."""
        member = self.member()
        previous, completion = self.joining, self.completion
        self.partitions.update(new)
        self.joining = shared_pool("txlog-join", JOIN_THREADS).submit(
            self._join, previous, completion, member, new)

    def _join(self, previous: Future[None] | None, completion: tuple[str, Future] | None,
              member: TransactionMember, new: list[tuple[str, int]]) -> None:
        """One AddPartitionsToTxn, in a join thread: it touches no state of this object.
        The previous transaction's roll-forward goes with it: the coordinator waits for
        its markers and publishes its Complete* with this join where it can."""
        if previous is not None:
            previous.result()
        self._services.coordinator.add_partitions(member, new, completion)

    def settle_joins(self, raise_error: bool = True) -> None:
        """Wait for the AddPartitionsToTxn requests in flight; a failure poisons the
        transaction (fenced: the producer; otherwise abortable)."""
        joining, self.joining = self.joining, None
        if joining is None:
            return
        try:
            joining.result()
        except BaseException as exc:
            self.fatal = self.fatal or exc
            if raise_error:
                raise

    def settle_completion(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` for the previous transaction's roll-forward (markers,
        offsets, Complete*); raises what stops it.  False if it is still running."""
        if self.completion is None:
            return True
        decision_id, future = self.completion
        self._services.coordinator.hurry_roll_forward(self.require_transactional())
        done, _ = wait([future], timeout)
        if not done:
            return False
        self.completion = None
        try:
            self._services.coordinator.await_roll_forward(self.require_transactional(),
                                                          decision_id, future)
        except BaseException:
            self.completion = (decision_id, future)  # the next call tries again
            raise
        return True

    @contextmanager
    def _abortable_on_expiry(self) -> Iterator[None]:
        """Joining failed for good: fenced (fatal), or the id expired under this producer
        (commit_transaction() raises it again; abort_transaction() starts the id again)."""
        try:
            yield
        except (InvalidPidMappingError, ProducerFencedError) as exc:
            self.fatal = exc
            raise

    def add_offsets(self, offsets: dict[tuple[str, int], int], group_id: str,
                    member_id: str | None, generation: int | None) -> None:
        """AddOffsetsToTxn + TxnOffsetCommit, fenced by the consumer's generation when
        it has one (Producer.send_offsets_to_transaction says how).  Registered in the
        group first, with or without a generation, so that an offset fetch that meets
        the transaction decided but not applied rolls it forward (stable_offsets.py)."""
        if generation == -1 and not member_id:
            generation = member_id = None  # Kafka's UNKNOWN_GENERATION_ID: no fencing
        check_offsets(offsets)
        if generation is None and member_id is not None:
            raise InvalidConfigError("send_offsets_to_transaction: member_id needs a "
                                     "generation (the consumer's group metadata)")
        self.settle_joins()
        self.settle_completion()
        member = self.member()
        try:
            if generation is not None:
                check_generation(self._services, group_id, member_id, generation)
            register_transactional_offsets(
                self._services.storage, group_id, member.transactional_id,
                (member.producer_id, member.epoch), -1 if generation is None else generation,
                member_id or "", list(offsets))
        except CommitFailedError as exc:
            self.fatal = exc  # abortable: commit_transaction() raises it, abort clears it
            raise
        with self._abortable_on_expiry():
            self._services.coordinator.add_offsets(member, group_id, offsets)
        self.has_offsets = True

    def plain_decision_id(self) -> str:
        return plain_decision_id(self.producer_id, self.epoch)

    def check_can_commit(self) -> None:
        self.check_in_transaction("commit_transaction()")
        if self.decision_id != self.plain_decision_id():
            raise IllegalStateError(
                f"producer {self.transactional_id!r} is a member of shared transaction "
                f"{self.decision_id!r}: call prepare_transaction() and let the coordinator run "
                "log.coordinator.end_shared_transaction(); a member cannot commit alone")

    def end(self, commit: bool) -> None:
        """EndTxn, unless nothing joined the transaction (then nothing is decided).

        Returns once the decision is durable; the roll-forward runs on, and the next
        request on the id's chain waits for it (``settle_completion``)."""
        self.settle_joins(raise_error=commit)
        self.settle_completion()
        member = self.member()
        self.transition(_S.READY)
        try:
            if not self.partitions and not self.has_offsets:
                return
            ending = self._services.coordinator.end_transaction(member, commit)
        except ProducerFencedError as exc:
            self.fatal = exc
            raise
        except InvalidTxnStateError:
            if commit:
                raise
            self.sequences.clear()  # an abort whose every join failed: nothing is open, and
            return  # the staged batches' sequences were never used
        self.producer_id, self.epoch = ending.producer_id, ending.epoch
        self.completion = (member.decision_id, ending.completion)
        self.sequences.clear()

    def check_can_abort(self) -> None:
        self.require_transactional()
        if self.state is _S.CLOSED:
            raise IllegalStateError("the producer is closed")
        if self.fatal is not None and isinstance(self.fatal, ProducerFencedError):
            raise self.fatal
        if self.state is not _S.IN_TRANSACTION:
            raise IllegalStateError("abort_transaction() outside a transaction")

    def abort(self) -> None:
        """EndTxn(abort); after the id expired under this producer, start it again."""
        expired = isinstance(self.fatal, InvalidPidMappingError)
        self.fatal = None
        try:
            if not expired:
                self.end(commit=False)
                return
        except InvalidPidMappingError:
            pass
        self._restart_expired()

    def _restart_expired(self) -> None:
        """After the id expired under this producer (nothing of the transaction was
        written: an id with an open transaction never expires), start it again under a
        new producer id, unless another instance took it meanwhile: then this one is
        fenced, as Kafka's producer is when InitProducerId's expected epoch is stale."""
        self.transition(_S.READY)
        try:
            self.producer_id, self.epoch = self._services.coordinator.init_producer_id(
                self.require_transactional(), self.transaction_timeout_ms,
                expired=(self.producer_id, self.epoch))
        except ProducerFencedError as exc:
            self.fatal = exc
            raise
        self.sequences.clear()

    def prepare(self) -> TransactionMember:
        """Hand this producer's part to a shared transaction's coordinator, which bumps
        the id's epoch when it ends it: this instance cannot go on without a new
        InitProducerId."""
        self.settle_joins()
        self.transition(_S.PREPARED)
        return self.member()

    def abort_expired_in(self, tp: tuple[str, int]) -> None:
        """Abort other producers' expired transactions in ``tp``, at most once a second.

        Kafka's coordinator aborts them on a timer; with no server, the
        processes that write to a partition take that duty, so a dead
        producer cannot hold the LSO back for longer than its timeout.  The
        sweep looks at the state this producer's append just proved (no
        refresh) and skips its own transaction, which is live: while only it
        is open here, the sweep costs no request (docs/protocol.md, 4.9).
        """
        now = time.monotonic()
        if now - self._expiry_checked.get(tp, 0.0) < EXPIRY_CHECK_INTERVAL_S:
            return
        self._expiry_checked[tp] = now
        state = self._services.partition(*tp).proven_state()
        self._services.coordinator.abort_expired_in(*tp, state=state,
                                                    own=(self.producer_id, self.epoch))
