"""The producer's writes: batches staged, data objects, claims, and their outcomes.

Every way of sending ends in ``Sender.stage``, so sequences, idempotence,
transactions, max.message.bytes, LogAppendTime and the outcome-unknown rule
hold alike.  Staged batches gather into one data object per flush (or per
``data_object_bytes``), then each partition claims its batches in staged
order (docs/protocol.md, section 1.1).  A full data object may be written
behind, on a pool thread, while the caller stages the next; its outcome is
settled, and the transaction manager told what a failure means, only in the
caller's thread.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from .. import clock
from ..errors import (InvalidConfigError, InvalidProducerEpochError, InvalidTxnStateError,
                      OutOfOrderSequenceError, ProducerFencedError, TransactionAbortedError,
                      TxlogError)
from ..format.batch import (COMPRESSION_CODES, MAX_CLAIM_PARTS, NO_SEQUENCE,
                            TRANSACTIONAL_BIT, BatchHeader, Payload, encode_records)
from ..partition.appender import DataReference, write_data_object
from ..partition.state_manager import GUESS_WINDOW_S
from ..storage.fresh_reads import SharedReads
from ..storage.pools import shared_pool
from ..transactions.coordinator import FlushVerification
from .metrics import MetricConfig, ProducerSensors

if TYPE_CHECKING:
    from ..partition.partition_log import AppendResult, PartitionLog
    from ..root.root import Root
    from ..storage.contract import Storage
    from .partitioner import StickyPartitioner
    from .transaction_manager import TransactionManager

logger = logging.getLogger(__name__)

# A batch whose payload is at most this size is published inline, as one batch
# object, without a data object: a claim would be nearly as large as the payload
# and cost a second write.  (An environment override lets tests drive every batch
# through data objects.)
INLINE_PAYLOAD_BYTES = int(os.environ.get("TXLOG_INLINE_PAYLOAD_BYTES", 4096))
CLAIM_THREADS = 8  # partitions of one flush claimed at once
WRITE_BEHIND_THREADS = 4  # producers of one process writing a full data object behind at once
# Append failures that are raised before anything is published: the batch is
# certainly not in the log, so its sequence may be used again.
DEFINITIVE_REJECTIONS = (OutOfOrderSequenceError, InvalidProducerEpochError, InvalidTxnStateError,
                         InvalidConfigError)


@dataclass(eq=False)
class _Staged:
    """A batch encoded and waiting for its flush's data object and claim."""

    tp: tuple[str, int]
    part: PartitionLog
    header: BatchHeader
    payload: Payload
    log_append: bool
    sequence: int
    largest: int  # bytes of its largest record's key and value (record-size-max)
    done: Callable[[AppendResult], None] | None = None
    failed: Callable[[BaseException], None] | None = None
    reference: DataReference | None = None
    result: AppendResult | None = None
    error: BaseException | None = None
    # Not attempted: an earlier flush's batch of this partition failed, and this one's
    # sequence follows it (the earlier flush's settle reports that failure).
    follows_failure: bool = False


def _write_pool() -> ThreadPoolExecutor:
    """Threads that write a full data object and its claims while the producer's caller
    stages the next (each producer has at most two such writes at a time, the later
    waiting for the earlier's claims: one that waits has a running or finished one to
    wait for, since the earlier was queued first)."""
    return shared_pool("txlog-write-behind", WRITE_BEHIND_THREADS)


def _claim_pool() -> ThreadPoolExecutor:
    """Threads that claim the partitions of one flush at once (each mostly waits on a
    conditional write and an anchor read)."""
    return shared_pool("txlog-claim", CLAIM_THREADS)


class Sender:
    """One producer's staged batches and the write of them (Kafka's Sender, run by the
    producer's caller rather than a thread of its own, except for a write behind)."""

    def __init__(self, services: Root, transactions: TransactionManager,
                 partitioner: StickyPartitioner, compression: str | None,
                 data_object_bytes: int, metric_config: MetricConfig) -> None:
        self._services = services
        self._transactions = transactions
        self._partitioner = partitioner
        self._compression = compression
        # The codec's bits are each batch's own (encode_records may leave a small one
        # uncompressed).
        self._attributes = TRANSACTIONAL_BIT if transactions.transactional_id is not None \
            else 0
        self._idempotent = transactions.enable_idempotence
        self.data_object_bytes = data_object_bytes
        self.staged: list[_Staged] = []
        self.staged_bytes = 0
        self.staged_since = 0.0  # time.monotonic() when the oldest staged batch was staged
        # A full data object being written behind: its batches and the write; settled,
        # in the caller's thread, before anything else is written or decided.
        self.behind: tuple[list[_Staged], Future[tuple[float, float]]] | None = None
        self.sensors = ProducerSensors(metric_config, lambda: int(self.behind is not None))

    def stage(self, tp: tuple[str, int], records: pa.Table, base_timestamp: int,
              max_timestamp: int, done: Callable[[AppendResult], None] | None = None,
              failed: Callable[[BaseException], None] | None = None,
              largest: int | None = None) -> None:
        """Encode one batch of ``records`` (RECORD_SCHEMA) for ``tp`` and stage it: the
        one write path (``write_staged`` publishes it).  The sequence is taken now:
        batches of one partition are claimed in the order they were staged.  ``largest``
        is the bytes of its largest record's key and value, where the caller knows them."""
        topic, partition = tp
        transactions = self._transactions
        if transactions.needs_new_id:
            transactions.renew_id()
        payload, codec = encode_records(records, self._compression)
        desc = self._services.describe_topic(topic)
        max_bytes = desc.config.get("max.message.bytes")
        if max_bytes is not None and len(payload) > max_bytes:
            raise InvalidConfigError(
                f"batch of {len(payload)} bytes for {topic}-{partition} exceeds the topic's "
                f"max.message.bytes={max_bytes}")
        log_append = desc.config.get("message.timestamp.type") == "LogAppendTime"
        part = self._services.partition(topic, partition)
        count = records.num_rows
        sequence = transactions.take_sequence(tp, count) if self._idempotent else NO_SEQUENCE
        header = BatchHeader(
            base_offset=0, record_count=count,
            attributes=self._attributes | COMPRESSION_CODES[codec],
            base_timestamp=base_timestamp, max_timestamp=max_timestamp,
            producer_id=transactions.producer_id, producer_epoch=transactions.epoch,
            base_sequence=sequence, decision_id=transactions.decision_id,
            transactional_id=transactions.transactional_id or "")
        if not self.staged:
            self.staged_since = time.monotonic()
        self.staged.append(_Staged(tp, part, header, payload, log_append, sequence,
                                   _largest_record(records) if largest is None else largest,
                                   done, failed))
        self.staged_bytes += len(payload)
        self._partitioner.batch_sent(topic, partition, desc.partitions)

    def write_if_full(self, behind: bool = False) -> None:
        if self.staged_bytes >= self.data_object_bytes:
            if behind:
                self.write_behind()
            else:
                self.write_staged()

    def write_staged(self) -> None:
        """Write what is staged: one data object with every payload above
        INLINE_PAYLOAD_BYTES, then each partition's claims (small batches inline), the
        partitions at once, each in its staged order (docs/protocol.md, section 1.1).

        Raises the first failure in staged order, after every batch's futures
        learnt its outcome; a failed batch stops its partition's later batches
        (their sequences follow it), not the other partitions'.  With a write
        behind, this flush is written as the next one behind and both are settled
        here, so its data object goes up while the one behind claims.
        """
        if self.behind is not None:
            first_error: BaseException | None = None
            try:
                self.write_behind()
            except BaseException as exc:  # what is behind is settled all the same
                first_error = exc
            try:
                self.settle_behind()
            except BaseException as exc:
                first_error = first_error or exc
            if first_error is not None:
                raise first_error
            return
        self._settle_joins()
        staged, self.staged, self.staged_bytes = self.staged, [], 0
        if staged:
            self._sent(staged, _timed_publish(self._services.storage, staged))
            self._settle(staged)

    def write_behind(self) -> None:
        """Write what is staged in a thread, and return: the caller encodes the next data
        object while this one's bytes reach the disk or the store (Kafka's producer
        leaves its sends to a sender thread for the same reason).  Its outcome is
        settled, and its first failure raised, by the next write, flush or decision
        (docs/protocol.md, section 1.1).

        A write still behind is settled here, after this one has started: this
        one's data object is written while that one claims, and its claims wait
        for that one's, so each partition's claims keep the staged order.  So a
        producer holds at most two data objects' worth.
        """
        self._settle_joins()
        staged, self.staged, self.staged_bytes = self.staged, [], 0
        previous, self.behind = self.behind, None
        if staged:
            before = None if previous is None else previous[0]
            waiting = None if previous is None else previous[1]
            self.behind = (staged, _write_pool().submit(
                _timed_publish, self._services.storage, staged, before, waiting))
        if previous is not None:
            self._settle_written(*previous)

    def settle_behind(self, raise_error: bool = True) -> None:
        """Wait for the write behind, if any, and settle it here (the producer's state
        is only ever changed by its caller's thread)."""
        if self.behind is None:
            return
        behind, self.behind = self.behind, None
        self._settle_written(*behind, raise_error=raise_error)

    def _settle_written(self, staged: list[_Staged], writing: Future[tuple[float, float]],
                        raise_error: bool = True) -> None:
        try:
            self._sent(staged, writing.result())
        except BaseException as exc:  # _publish records failures; this is an interrupt
            for b in staged:
                if b.result is None and b.error is None:
                    b.error = exc
        try:
            self._settle(staged)
        except BaseException:
            if raise_error:
                raise

    def _settle_joins(self) -> None:
        """No byte before AddPartitionsToTxn: wait for the joins of what is staged.  If one
        failed, the staged batches can never be written: their records fail with it, and
        count as errors, as a batch the partition refused does."""
        if not self.staged:
            return
        try:
            self._transactions.settle_joins()
        except BaseException as exc:
            for b in self.staged:
                self.sensors.errors.record(b.header.record_count)
            self.fail_staged(exc)
            raise

    def fail_staged(self, error: BaseException) -> None:
        """Drop every staged batch, failing its futures with ``error`` (an abort)."""
        for b in self.staged:
            if b.failed is not None:
                b.failed(error)
        self.staged, self.staged_bytes = [], 0

    def _sent(self, staged: list[_Staged], timing: tuple[float, float]) -> None:
        """Count one flush written (producer-metrics), once per batch, not per record;
        ``timing`` is when it began (the metrics' clock) and how long it took, in ms."""
        self.sensors.request([(b.header.record_count, len(b.payload), b.largest)
                              for b in staged], *timing)

    def _settle(self, staged: list[_Staged]) -> None:
        """Tell each batch's futures its outcome and apply the outcome rules, in staged
        order; raise the first failure."""
        first_error: BaseException | None = None
        failed_tps: set[tuple[str, int]] = set()
        written_tps: list[tuple[str, int]] = []
        for b in staged:
            if b.error is None and b.result is not None:
                if b.done is not None:
                    b.done(b.result)
                if b.tp not in written_tps:
                    written_tps.append(b.tp)
                continue
            exc = b.error or RuntimeError("batch was not written")
            self.sensors.errors.record(b.header.record_count)
            if b.follows_failure:  # as _fail_followers: reported with the earlier flush
                if b.failed is not None:
                    b.failed(exc)
                continue
            if b.tp not in failed_tps:  # the first failed batch of its partition
                failed_tps.add(b.tp)
                self._append_failed(b.tp, exc)
                self._transactions.rewind(b.tp, b.sequence)  # neither it nor later ones landed
                first_error = first_error or exc
            if b.failed is not None:
                b.failed(exc)
        if failed_tps and self.staged:
            self._fail_followers(failed_tps, first_error or RuntimeError("batch was not written"))
        for tp in written_tps:
            self._transactions.abort_expired_in(tp)
        if first_error is not None:
            raise first_error

    def _fail_followers(self, failed_tps: set[tuple[str, int]], error: BaseException) -> None:
        """Staged while a write behind failed: a failed partition's later batches follow
        the failed one's sequence, so they fail too, as in one flush."""
        kept = []
        for b in self.staged:
            if b.tp in failed_tps:
                self.sensors.errors.record(b.header.record_count)
                if b.failed is not None:
                    b.failed(error)
            else:
                kept.append(b)
        self.staged = kept
        self.staged_bytes = sum(len(b.payload) for b in kept)

    def _append_failed(self, tp: tuple[str, int], exc: BaseException) -> None:
        """Decide what a failed append means for the batches that follow it.

        A validation error is raised before anything is published, so the
        producer may go on as it was.  Any other failure, whatever its type,
        may come after the object was created: reusing the batch's sequence
        for other records would make them look like a duplicate of it and
        drop them (Kafka bumps the epoch or fails the producer for the same
        reason).  An idempotent producer therefore takes a new producer id
        before its next batch; a transactional one cannot commit this
        transaction and must abort it (which bumps its epoch) or re-initialise.
        """
        transactions = self._transactions
        if isinstance(exc, ProducerFencedError):
            transactions.poison(exc)
            return
        if transactions.transactional_id is not None:
            if isinstance(exc, TxlogError):
                transactions.poison(exc)
            else:
                fatal = TransactionAbortedError(
                    f"transaction of {transactions.transactional_id!r}: a batch for "
                    f"{tp[0]}-{tp[1]} failed with {type(exc).__name__} ({exc}) and may or may "
                    "not have been written; call abort_transaction()")
                fatal.__cause__ = exc
                transactions.poison(fatal)
            return
        if isinstance(exc, DEFINITIVE_REJECTIONS) or not self._idempotent:
            return
        transactions.outcome_unknown()
        logger.warning("producer %d: a batch for %s-%d ended with %s (%s); its outcome is "
                       "unknown, so the next batch uses a new producer id",
                       transactions.producer_id, tp[0], tp[1], type(exc).__name__, exc)


def _largest_record(records: pa.Table) -> int:
    """The bytes of the batch's largest record, key and value (with Arrow's kernels)."""
    if not records.num_rows:
        return 0
    sizes = pc.add(pc.fill_null(pc.binary_length(records["key"]), 0),
                   pc.fill_null(pc.binary_length(records["value"]), 0))
    return int(pc.max(sizes).as_py())


def _timed_publish(storage: Storage, staged: list[_Staged], before: list[_Staged] | None = None,
                   writing: Future[tuple[float, float]] | None = None) -> tuple[float, float]:
    """``_publish``, returning when it began on the metrics' clock and how long it took,
    in milliseconds (request-latency)."""
    began_ms, started = clock.monotonic_ms(), time.perf_counter()
    _publish(storage, staged, before, writing)
    return began_ms, (time.perf_counter() - started) * 1000


def _publish(storage: Storage, staged: list[_Staged], before: list[_Staged] | None = None,
             writing: Future[tuple[float, float]] | None = None) -> None:
    """Write one flush: its data object, then each partition's claims, the partitions at
    once.  Each batch's ``result`` or ``error`` records its outcome; the sender settles
    them (in its caller's thread, for a write behind).

    ``writing`` is the flush before this one (its batches ``before``), still being
    written: this one's data object goes up meanwhile, and its claims wait for that
    flush to end.  A partition one of its batches failed in is not claimed here.
    """
    large = [b for b in staged if len(b.payload) > INLINE_PAYLOAD_BYTES]
    # Each partition's payloads back to back in staged order, so that its batches of
    # this flush form one byte range: one claim and one ranged read cover them.
    order: dict[tuple[str, int], int] = {}
    large.sort(key=lambda b: order.setdefault(b.tp, len(order)))
    unwritten: BaseException | None = None
    if large:
        try:
            placed = write_data_object(storage, [b.payload for b in large])
        except BaseException as exc:
            # No claim points at it: the batches are certainly not in the log, but
            # their sequences were taken, so the usual rule decides what follows.
            unwritten = exc
        else:
            for b, (path, offset, started) in zip(large, placed, strict=True):
                b.reference = DataReference(path, offset, started)
    failed = _failed_partitions(before, writing)
    cut: set[tuple[str, int]] = set()
    runs: dict[tuple[str, int], list[_Staged]] = {}
    for b in staged:
        if b.tp in failed:
            b.error, b.follows_failure = failed[b.tp], True
        elif unwritten is not None and (len(b.payload) > INLINE_PAYLOAD_BYTES or b.tp in cut):
            b.error = unwritten  # its payload, or its partition's before it, unwritten
            cut.add(b.tp)
        else:
            runs.setdefault(b.tp, []).append(b)
    if not runs:
        return
    flush = FlushVerification()  # one KIP-890 check per transaction per flush (2.6.1)
    reads = SharedReads(GUESS_WINDOW_S)  # topic.json once before, once after (1.8)

    def claim(run: list[_Staged]) -> None:
        with reads.active():
            flush.run(_claim_run, run)
    if len(runs) == 1:
        claim(next(iter(runs.values())))
    else:
        list(_claim_pool().map(claim, runs.values()))


def _failed_partitions(before: list[_Staged] | None, writing: Future[tuple[float, float]] | None
                       ) -> dict[tuple[str, int], BaseException]:
    """Once the flush ``writing`` has ended: the partitions a batch of it failed in, and
    the first such failure of each."""
    if writing is None or before is None:
        return {}
    wait([writing])
    interrupted = writing.exception()
    failed: dict[tuple[str, int], BaseException] = {}
    for b in before:
        if b.result is None and b.tp not in failed:
            failed[b.tp] = b.error or interrupted or RuntimeError("batch was not written")
    return failed


def _claim_run(run: list[_Staged]) -> None:
    """Claim one partition's batches of a flush in order, consecutive batches of one data
    object under one claim (up to MAX_CLAIM_PARTS); the first failure stops the rest
    (they would follow a batch that is not, or not surely, in the log)."""
    for i, group in enumerate(_claim_groups(run)):
        b = group[0]
        try:  # after the first, each claim tries its slot before refreshing (protocol.md 1)
            if len(group) > 1:
                assert b.reference is not None
                results = b.part.append_claims([g.header for g in group],
                                               [g.payload for g in group], b.reference,
                                               b.log_append, continuing=i > 0)
                for g, result in zip(group, results, strict=True):
                    g.result = result
            elif b.reference is not None:
                b.result = b.part.append_claim(b.header, b.payload, b.reference, b.log_append,
                                               continuing=i > 0)
            else:
                b.result = b.part.append(b.header, b.payload, b.log_append, continuing=i > 0)
        except BaseException as exc:
            for later in run[run.index(b):]:
                later.error = exc
            return


def _claim_groups(run: list[_Staged]) -> list[list[_Staged]]:
    """The run cut into claims: batches whose payloads follow each other in one data
    object, with one header's worth of producer, transaction and attributes, go together
    (at most MAX_CLAIM_PARTS); inline batches stand alone."""
    groups: list[list[_Staged]] = []
    for b in run:
        prev = groups[-1][-1] if groups else None
        if prev is not None and b.reference is not None and prev.reference is not None and \
                len(groups[-1]) < MAX_CLAIM_PARTS and \
                b.reference.path == prev.reference.path and \
                b.reference.offset == prev.reference.offset + len(prev.payload) and \
                b.log_append == prev.log_append and _same_claim(prev.header, b.header):
            groups[-1].append(b)
        else:
            groups.append([b])
    return groups


def _same_claim(a: BatchHeader, b: BatchHeader) -> bool:
    """Whether ``b`` may follow ``a`` inside one claim (appender.combined_header's rule)."""
    follows = b.base_sequence == NO_SEQUENCE == a.base_sequence or \
        (a.base_sequence != NO_SEQUENCE and
         b.base_sequence == (a.base_sequence + a.record_count) & 0x7FFFFFFF)
    return follows and (a.producer_id, a.producer_epoch, a.attributes, a.decision_id,
                        a.transactional_id) == (b.producer_id, b.producer_epoch, b.attributes,
                                                b.decision_id, b.transactional_id)
