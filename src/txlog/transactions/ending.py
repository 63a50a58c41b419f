"""Ending transactions: the decision, the markers, the Complete* version, roll-forward.

Publishing the decision is the commit point: publish-if-absent means a
committer and a timeout-aborter cannot both win.  Everything after it
(markers, group offsets, the Complete* version) is idempotent and is rolled
forward by whichever process finds it unfinished (docs/protocol.md, 4.5-4.7).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from ..errors import DecisionConflictError, InvalidTxnStateError, TransactionAbortedError
from ..partition.state_manager import GUESS_WINDOW_S
from ..storage.fresh_reads import SharedReads
from ..storage.pools import shared_pool
from .groups import apply_transactional_offsets
from .metadata import (COMPLETE, IDLE, MAX_EPOCH, PREPARED, Decision, TransactionMember,
                       TransactionMetadata, TxnState as S, check_member)
from .store import CoordinatorStore

if TYPE_CHECKING:
    from ..partition.partition_log import PartitionLog

# The coordinator's parts log under its name, which operators watch for transactions
# ended by anyone but their own producer (docs/protocol.md, 4.9).
COORDINATOR_LOGGER = "txlog.transactions.coordinator"
logger = logging.getLogger(COORDINATOR_LOGGER)

MARKER_THREADS = 8  # partitions of one transaction marked at once (protocol.md, 4.6)
ROLL_FORWARD_THREADS = 8  # decided transactions (members) completed at once behind EndTxn
# How long a roll-forward whose markers are written keeps a plain producer's Complete*
# version for that producer's next AddPartitionsToTxn to publish folded into its own
# (protocol.md 4.5.2): a producer that begins its next transaction within it pays one
# chain version on that join's path instead of two.  Anything in this process that
# waits for the roll-forward ends the wait at once (``hurry``).
COMPLETE_LINGER_S = 0.02


def _foldable(done: TransactionMetadata) -> bool:
    """Whether a join may publish ``done`` folded into its own version (protocol.md
    4.5.2): not a shared member's, and not a new producer id's (epoch 0), which only
    Complete* records."""
    return not done.is_shared and done.epoch != 0


def _marker_pool() -> ThreadPoolExecutor:
    """Threads writing one transaction's markers at once: each partition's marker is an
    independent slot claim, so their requests need not wait on each other."""
    return shared_pool("txlog-marker", MARKER_THREADS)


def _roll_forward_pool() -> ThreadPoolExecutor:
    """Threads completing decided transactions after EndTxn returned (protocol.md 4.5).
    Separate from the marker pool, whose threads these wait on.  A pool's threads are
    joined when the interpreter exits, so a process that ends normally finishes its
    roll-forwards first; one that is killed leaves them to the next reader or writer."""
    return shared_pool("txlog-roll-forward", ROLL_FORWARD_THREADS)


@dataclass(eq=False)
class _Successor:
    """A join of this process waiting for a roll-forward of the same id (protocol.md
    4.5.2): the roll-forward leaves it the Complete* version it would have published."""

    decision_id: str
    ready: threading.Event
    complete: TransactionMetadata | None = None


@dataclass(frozen=True)
class Ending:
    """What EndTxn answers once its decision is durable: whether this producer's part
    committed, the identity its next transaction uses, and the roll-forward (markers,
    group offsets, Complete*) still running behind it."""

    committed: bool
    producer_id: int
    epoch: int
    completion: Future[TransactionMetadata | None]


class TransactionEnder:
    """Decides transactions and rolls decided ones forward, for ``TransactionCoordinator``.

    ``partition(topic, partition)`` opens a partition, to write its marker.
    """

    def __init__(self, store: CoordinatorStore,
                 partition: Callable[[str, int], PartitionLog]) -> None:
        self.store = store
        self._partition = partition
        self._local = threading.local()  # transactional ids this thread is ending itself
        self._lock = threading.Lock()
        # Roll-forwards this process runs behind EndTxn, by transactional id: complete()
        # waits for one rather than racing it with the same writes.
        self._running: dict[str, Future[TransactionMetadata | None]] = {}
        # Joins of this process waiting for a roll-forward, by transactional id.
        self._successors: dict[str, _Successor] = {}
        # Roll-forwards whose markers are written, keeping Complete* a moment for a join
        # (COMPLETE_LINGER_S), by transactional id: setting the event ends the wait.
        self._lingering: dict[str, threading.Event] = {}

    def _ending(self) -> set[str]:
        ending = getattr(self._local, "ending", None)
        if ending is None:
            ending = self._local.ending = set()
        return ending

    @contextmanager
    def _owning(self, transactional_ids: list[str], behind: bool = False) -> Iterator[None]:
        """Mark transactions this thread ends, so that finishing them is not logged.
        ``behind``: this thread is the roll-forward pool's, behind EndTxn, the one caller
        that may keep Complete* a moment for the producer's next join (``_linger``)."""
        ending = self._ending()
        added = [t for t in transactional_ids if t not in ending]
        ending.update(added)
        outer, self._local.behind = getattr(self._local, "behind", False), behind
        try:
            yield
        finally:
            ending.difference_update(added)
            self._local.behind = outer

    # --- EndTxn ---------------------------------------------------------------------------------

    def end_transaction(self, member: TransactionMember, commit: bool) -> Ending:
        """EndTxn for a producer's own transaction (``TransactionCoordinator.end_transaction``):
        returns once the decision is durable, its roll-forward running behind."""
        _, meta = self.store.latest(member.transactional_id)
        meta = check_member(meta, member)
        if meta.state != S.ONGOING:
            raise InvalidTxnStateError(
                f"transactional id {member.transactional_id!r} has no open transaction to "
                f"{'commit' if commit else 'abort'} (state {meta.state.value})")
        decision = self.store.decide(meta.decision_id, commit,
                                     [(member.producer_id, member.epoch)], "EndTxn")
        completion = self.roll_forward(member.transactional_id, meta.decision_id)
        committed = decision.commits(member.producer_id, member.epoch)
        if commit and not committed:
            self.hurry(member.transactional_id)
            wait([completion])
            raise TransactionAbortedError(
                f"transaction of {member.transactional_id!r} was aborted before it could commit "
                f"({decision.reason or 'aborted'})")
        if member.epoch + 1 < MAX_EPOCH:
            # The Complete* version will carry exactly this identity, whoever writes it
            # (next_identity is a plain bump below MAX_EPOCH): the producer need not wait.
            return Ending(committed, member.producer_id, member.epoch + 1, completion)
        final = completion.result()  # a new producer id: only the Complete* version knows it
        if final is not None and final.state in COMPLETE and \
                final.writes_as(meta.decision_id, member.producer_id, member.epoch):
            return Ending(committed, final.producer_id, final.epoch, completion)
        # Someone else finished the transaction and a newer instance has taken the
        # id since: the outcome stands, but this producer keeps its old identity,
        # so its next request is fenced.
        return Ending(committed, member.producer_id, member.epoch, completion)

    def end_shared_transaction(self, decision_id: str, members: list[TransactionMember],
                               commit: bool) -> tuple[Decision, Future[None]]:
        """Decide a multi-producer transaction once, then complete every member at once,
        behind the returned future (``TransactionCoordinator.end_shared_transaction``)."""
        for m in members:
            if m.decision_id != decision_id:
                raise InvalidTxnStateError(
                    f"member {m.transactional_id!r} belongs to decision {m.decision_id!r}, "
                    f"not {decision_id!r}")
        decision = self.store.decide(decision_id, commit,
                                     [(m.producer_id, m.epoch) for m in members],
                                     "EndTxn (shared)")
        completion = _all_of([self.roll_forward(m.transactional_id, decision_id)
                              for m in members])
        if commit:
            left_out = [m.transactional_id for m in members
                        if not decision.commits(m.producer_id, m.epoch)]
            if left_out:
                wait([completion])
                standing = "an ABORT" if not decision.commit else "a COMMIT of other members"
                raise DecisionConflictError(
                    f"decision {decision_id!r} already stands as {standing} "
                    f"({decision.reason or 'no reason recorded'}); the records of "
                    f"{', '.join(map(repr, left_out))} are aborted, not committed",
                    decision_id, left_out)
        return decision, completion

    # --- roll-forward behind EndTxn -------------------------------------------------------------

    def roll_forward(self, transactional_id: str,
                     decision_id: str) -> Future[TransactionMetadata | None]:
        """Complete ``transactional_id``'s decided transaction in a thread; the future
        holds its final metadata or the error that stopped it (retried by whoever
        completes it next: every step is idempotent)."""
        def run(on_pool: bool) -> TransactionMetadata | None:
            with self._owning([transactional_id], behind=on_pool):
                return self.complete(transactional_id, only_decision=decision_id)

        try:
            with self._lock:
                future = _roll_forward_pool().submit(run, True)
                self._running[transactional_id] = future
        except RuntimeError:  # the interpreter is exiting: its pools take no more work
            future = Future()
            try:
                future.set_result(run(False))
            except Exception as exc:
                future.set_exception(exc)
            return future
        future.add_done_callback(partial(self._finished, transactional_id))
        return future

    def _finished(self, transactional_id: str, future: Future) -> None:
        with self._lock:
            if self._running.get(transactional_id) is future:
                del self._running[transactional_id]

    def outcome_written(self, transactional_id: str, decision_id: str,
                        completion: Future[TransactionMetadata | None]
                        ) -> TransactionMetadata | None:
        """Wait for this process's roll-forward ``completion`` of ``decision_id`` to write
        its markers and group offsets.  Returns the Complete* version it left unpublished
        for the caller, the producer's next AddPartitionsToTxn, to publish in its place
        (protocol.md 4.5.2); None once the roll-forward ended, Complete* published (a
        roll-forward that failed is completed here again, raising what persists)."""
        successor = _Successor(decision_id, threading.Event())
        with self._lock:
            waits = not completion.done() and transactional_id not in self._successors
            if waits:
                self._successors[transactional_id] = successor
        if waits:
            self.hurry(transactional_id)  # a roll-forward keeping Complete* hands it over
            completion.add_done_callback(lambda _: successor.ready.set())
            successor.ready.wait()
            with self._lock:
                if self._successors.get(transactional_id) is successor:
                    del self._successors[transactional_id]
            if successor.complete is not None:
                return successor.complete
        self.await_roll_forward(transactional_id, decision_id, completion)
        return None

    def await_roll_forward(self, transactional_id: str, decision_id: str,
                           completion: Future[TransactionMetadata | None]) -> None:
        """Wait for a roll-forward behind EndTxn; if it failed, complete the transaction
        here, so that its error reaches the producer's caller if it persists."""
        self.hurry(transactional_id)
        wait([completion])
        if completion.exception() is not None:
            logger.warning("completing transaction %r of %r failed in the background (%s); "
                           "trying again", decision_id, transactional_id,
                           completion.exception())
            self.complete(transactional_id, only_decision=decision_id)

    def _hand_over(self, done: TransactionMetadata) -> bool:
        """Leave ``done``, a plain producer's Complete* version whose markers and offsets
        are written, to a join of the same producer waiting for it; True if one took it."""
        if not _foldable(done):
            return False
        with self._lock:
            successor = self._successors.get(done.transactional_id)
            if successor is None or successor.decision_id != done.decision_id:
                return False
            del self._successors[done.transactional_id]
            successor.complete = done
        successor.ready.set()
        return True

    def _linger(self, done: TransactionMetadata) -> bool:
        """Keep ``done`` up to COMPLETE_LINGER_S for the producer's next join, which
        registers as a successor and ends the wait (``outcome_written``); True if one took
        it.  Only behind EndTxn, on the pool's thread: any other caller of ``complete``
        (a retry in the producer's own thread, InitProducerId, a sweep) has no join to
        wait for, or is the producer itself.  Nothing new can be seen meanwhile: the chain
        says what it says between the markers and any Complete* publish (protocol.md
        4.5.1)."""
        if not _foldable(done) or not getattr(self._local, "behind", False):
            return False
        arrived = threading.Event()
        with self._lock:
            if done.transactional_id in self._lingering:
                return False
            self._lingering[done.transactional_id] = arrived
        arrived.wait(COMPLETE_LINGER_S)
        with self._lock:
            if self._lingering.get(done.transactional_id) is arrived:
                del self._lingering[done.transactional_id]
        return self._hand_over(done)

    def hurry(self, transactional_id: str) -> None:
        """End the wait of a roll-forward of ``transactional_id`` that keeps its Complete*
        for a join: the caller is about to wait for that roll-forward to end."""
        with self._lock:
            arrived = self._lingering.pop(transactional_id, None)
        if arrived is not None:
            arrived.set()

    def settle(self, transactional_id: str) -> None:
        """Wait for this process's roll-forward of ``transactional_id``, if one runs
        (its error is its producer's to report; the caller completes it again)."""
        with self._lock:
            future = self._running.get(transactional_id)
        if future is not None and transactional_id not in self._ending():
            self.hurry(transactional_id)
            wait([future])

    # --- completion ---------------------------------------------------------------------------

    def complete(self, transactional_id: str,
                 only_decision: str | None = None) -> TransactionMetadata | None:
        """Roll a decided transaction forward (``TransactionCoordinator.complete``)."""
        self.settle(transactional_id)
        while True:
            version, meta = self.store.latest(transactional_id)
            if meta is None:
                return None
            if only_decision is not None and meta.decision_id != only_decision:
                return meta
            if meta.state in (S.ONGOING, S.PREPARE_EPOCH_FENCE):
                decision = self.store.decision(meta.decision_id)
                if decision is None:
                    if meta.state == S.ONGOING:
                        return meta  # undecided: nothing to roll forward
                    # A fence is only published after its ABORT decision; repair if not.
                    decision = self.store.decide(meta.decision_id, False, [], meta.reason)
                commits = decision.commits(meta.txn_producer_id, meta.txn_epoch)
                if commits and meta.state == S.PREPARE_EPOCH_FENCE:
                    raise InvalidTxnStateError(
                        f"transactional id {transactional_id!r} was fenced for abort but "
                        f"its decision {meta.decision_id!r} commits it")
                if meta.state == S.ONGOING and not meta.is_shared:
                    # A plain producer's decision object says all PrepareCommit would:
                    # straight to the markers and Complete* (protocol.md 4.6).
                    return self._finish(version, meta, commits)
                self.store.publish(version + 1, meta.prepared(commits))  # lost race: reload
                continue
            if meta.state in PREPARED:
                return self._finish(version, meta, meta.state == S.PREPARE_COMMIT)
            return meta

    def _write_outcome(self, version: int, meta: TransactionMetadata, commit: bool) -> None:
        """Every marker and, for a commit, group-offset update of a decided transaction.

        Each is idempotent (2.3, section 9) and all run at once: the decision
        already fixed the outcome, and nothing orders one partition's marker,
        or a group's offsets, after another's (protocol.md 4.6).
        """

        # The markers share their topics' ``topic.json`` reads before the publish, as the
        # claims of one flush do (protocol.md 1.8): all of them are written at once.
        reads = SharedReads(GUESS_WINDOW_S)

        def mark(tp: tuple[str, int]) -> None:
            with reads.active():
                self._partition(*tp).append_marker(
                    meta.txn_producer_id, meta.txn_epoch + 1, commit,
                    coordinator_epoch=version, decision_id=meta.decision_id,
                    transactional_id=meta.transactional_id)

        def apply(group: str) -> None:
            apply_transactional_offsets(self.store.storage, group, meta.pending_offsets[group],
                                        meta.transactional_id, version,
                                        (meta.txn_producer_id, meta.txn_epoch),
                                        meta.incarnation_ms)

        steps: list[Callable[[], None]] = [partial(mark, (topic, p)) for topic, p in meta.partitions]
        if commit:
            steps += [partial(apply, group) for group in meta.pending_offsets]
        futures = []
        try:
            if len(steps) > 1:
                futures = [_marker_pool().submit(step) for step in steps]
        except RuntimeError:  # the interpreter is exiting: its pools take no more work
            futures = []
        # Every step ends before this returns or raises (the first error in order):
        # nothing of this roll-forward is still writing when the caller goes on.
        wait(futures)
        for future in futures:
            future.result()
        if not futures:
            for step in steps:
                step()

    def _finish(self, version: int, meta: TransactionMetadata,
                commit: bool) -> TransactionMetadata:
        """Markers and group offsets, then the Complete* version, unless the producer's
        next AddPartitionsToTxn waits to publish its Ongoing version in its place (or,
        behind EndTxn, comes to wait within COMPLETE_LINGER_S: ``_linger``)."""
        self._write_outcome(version, meta, commit)
        done = meta.completed(*self.store.next_identity(meta.txn_producer_id, meta.txn_epoch),
                              commit)
        if self._hand_over(done) or self._linger(done):
            return done
        if self.store.publish(version + 1, done):
            if meta.transactional_id not in self._ending():
                logger.info("rolled forward transaction %r of %r (producer %d epoch %d): %s in "
                            "%d partition(s)", meta.decision_id, meta.transactional_id,
                            meta.txn_producer_id, meta.txn_epoch,
                            "COMMIT" if done.state == S.COMPLETE_COMMIT else "ABORT",
                            len(meta.partitions))
            return done
        _, latest = self.store.latest(meta.transactional_id)
        assert latest is not None
        return latest

    # --- fencing ------------------------------------------------------------------------------

    def fence_and_abort(self, transactional_id: str, reason: str,
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
        version, meta = self.store.latest(transactional_id)
        if meta is None or meta.state != S.ONGOING or (only is not None and not meta.writes_as(
                only.decision_id, only.txn_producer_id, only.txn_epoch)):
            self.complete(transactional_id)
            return
        decision = self.store.decide(meta.decision_id, False, [], reason)
        if not decision.commits(meta.txn_producer_id, meta.txn_epoch):
            # losing the race is fine: complete() reloads
            self.store.publish(version + 1, meta.fenced(reason))
        self.complete(transactional_id)

    def fence_writer(self, transactional_id: str, producer_id: int, epoch: int,
                     reason: str) -> None:
        """End or fence the transaction of ``(producer_id, epoch)``
        (``TransactionCoordinator.fence_writer``)."""
        while True:
            version, meta = self.store.latest(transactional_id)
            if meta is None:
                return
            if meta.state in PREPARED or meta.state == S.PREPARE_EPOCH_FENCE:
                self.complete(transactional_id)
                continue
            if meta.state == S.ONGOING:
                if (meta.txn_producer_id, meta.txn_epoch) == (producer_id, epoch):
                    self.fence_and_abort(transactional_id, reason, only=meta)
                return
            if meta.state in IDLE and \
                    (meta.producer_id, meta.epoch) == (producer_id, epoch):
                pid, new_epoch = self.store.next_identity(producer_id, epoch)
                if self.store.publish(version + 1, meta.bumped(pid, new_epoch, reason)):
                    return
                continue
            return


def _all_of(futures: list[Future]) -> Future[None]:
    """One future done when all of ``futures`` are, failing with the first error."""
    joined: Future[None] = Future()
    left = [len(futures)]
    lock = threading.Lock()

    def one_done(_: Future) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            joined.set_exception(errors[0])
        else:
            joined.set_result(None)

    if not futures:
        joined.set_result(None)
    for f in futures:
        f.add_done_callback(one_done)
    return joined
