"""The producer: batching, Kafka's partitioner, idempotence and transactions.

Names follow kafka-python.  There is no background sender thread: records
accumulate per partition and a batch is published when it reaches
``batch_size``, when it is older than ``linger_ms`` at the next ``send``, on
``flush()``, or when a caller waits on one of its futures.  Nothing is ever
published behind the caller's back, which keeps transaction boundaries exact.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa

from .. import clock
from ..format.batch import (HEADER_TYPE, MAX_CLAIM_PARTS, NO_PRODUCER_EPOCH, NO_PRODUCER_ID,
                            NO_SEQUENCE, RECORD_SCHEMA, TRANSACTIONAL_BIT, BatchHeader,
                            Payload, compression_attribute, encode_records)
from ..partition.appender import DataReference, write_data_object
from ..transactions.coordinator import FlushVerification
from ..transactions.metadata import plain_decision_id
from ..transactions.groups import check_offsets, register_transactional_offsets
from ..errors import (CommitFailedError, IllegalStateError, InvalidConfigError,
                      InvalidPidMappingError, InvalidProducerEpochError, InvalidTxnStateError,
                      OutOfOrderSequenceError,
                      ProducerFencedError, TransactionAbortedError, TxlogError)
from ..storage.names import validate_name
from ..storage.pools import shared_pool
from .membership import check_generation
from .accumulator import (RECORD_OVERHEAD, FutureRecordMetadata, Pending, RecordMetadata,
                          as_bytes, normalise_table)
from .partitioner import StickyPartitioner, partition_for_key, partitions_for_keys

if TYPE_CHECKING:
    from ..transactions.metadata import TransactionMember
    from ..log import Log
    from ..partition.partition_log import AppendResult, PartitionLog

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 1 << 20  # bytes; each batch is one claim, so larger than Kafka's 16 KiB
# Bytes of payload a producer gathers (over all partitions) into one data object
# before writing it; flush(), commit and future.get() write what there is sooner.
DEFAULT_DATA_OBJECT_BYTES = 8 << 20
# A batch whose payload is at most this size is published inline, as one batch
# object, without a data object: a claim would be nearly as large as the payload
# and cost a second write.  (An environment override lets tests drive every batch
# through data objects.)
INLINE_PAYLOAD_BYTES = int(os.environ.get("TXLOG_INLINE_PAYLOAD_BYTES", 4096))
CLAIM_THREADS = 8  # partitions of one flush claimed at once
WRITE_BEHIND_THREADS = 4  # producers of one process writing a full data object behind at once
DEFAULT_LINGER_MS = 5
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
# How often a producer looks for expired or decided-but-unfinished transactions
# holding back a partition it writes to (there is no coordinator timer).
EXPIRY_CHECK_INTERVAL_S = 1.0
# Append failures that are raised before anything is published: the batch is
# certainly not in the log, so its sequence may be used again.
DEFINITIVE_REJECTIONS = (OutOfOrderSequenceError, InvalidProducerEpochError, InvalidTxnStateError,
                         InvalidConfigError)


class ClientState(Enum):
    """Where a producer is in its transactional life (Kafka's TransactionManager.State).

    One value instead of a flag per question, so that every method asks the
    same thing the same way and a transition the table below does not allow
    is a bug found at once rather than a state nobody thought of.  The error
    that poisons a producer (a fence, a failed batch of a transaction) is
    kept beside it in ``Producer._fatal``, as Kafka keeps ``lastError``.
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


class SentBatch(NamedTuple):
    """One batch written by ``send_table``."""

    partition: int
    base_offset: int
    last_offset: int


@dataclass(eq=False)
class _Staged:
    """A batch encoded and waiting for its flush's data object and claim."""

    tp: tuple[str, int]
    part: PartitionLog
    header: BatchHeader
    payload: Payload
    log_append: bool
    sequence: int
    done: Callable[[AppendResult], None] | None = None
    failed: Callable[[BaseException], None] | None = None
    reference: DataReference | None = None
    result: AppendResult | None = None
    error: BaseException | None = None


def _write_pool() -> ThreadPoolExecutor:
    """Threads that write a full data object and its claims while the producer's caller
    stages the next (each producer has at most one such write at a time)."""
    return shared_pool("txlog-write-behind", WRITE_BEHIND_THREADS)


def _claim_pool() -> ThreadPoolExecutor:
    """Threads that claim the partitions of one flush at once (each mostly waits on a
    conditional write and an anchor read)."""
    return shared_pool("txlog-claim", CLAIM_THREADS)


def _runs(bounds: np.ndarray, n: int) -> list[tuple[int, int]]:
    """The ``[lo, hi)`` runs of ``range(n)`` that ``bounds`` (ascending cut points) cut
    it into, as Python ints (np.r_ cost more than the rest of a small send)."""
    cuts = [0, *bounds.tolist(), n]
    return list(zip(cuts[:-1], cuts[1:]))


class Producer:
    """Kafka-style producer over a Log (see kafka-python's KafkaProducer).

    Unlike Kafka's, one instance is not meant to be shared between threads:
    without a sender thread, batches are published by the calling thread, so
    give each thread its own producer (they may share the Log), or use
    ``txlog.kafka.KafkaProducer``, which puts a lock and a sender thread
    around this class.
    """

    def __init__(self, log: Log, *, enable_idempotence: bool = True,
                 transactional_id: str | None = None,
                 transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
                 batch_size: int = DEFAULT_BATCH_SIZE, linger_ms: int = DEFAULT_LINGER_MS,
                 compression: str | None = None,
                 key_serializer: Callable[[Any], bytes] | None = None,
                 value_serializer: Callable[[Any], bytes] | None = None,
                 compression_type: str | None = None,
                 data_object_bytes: int = DEFAULT_DATA_OBJECT_BYTES) -> None:
        self.log = log
        if compression_type is not None:  # kafka-python's name for the same option
            compression = compression_type
        self._compression = None if compression == "none" else compression
        self._compression_bits = compression_attribute(compression)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidConfigError(f"batch_size must be a positive integer, not {batch_size!r}")
        if not isinstance(data_object_bytes, int) or isinstance(data_object_bytes, bool) or \
                data_object_bytes < 1:
            raise InvalidConfigError(f"data_object_bytes must be a positive integer, not "
                                     f"{data_object_bytes!r}")
        if not isinstance(linger_ms, (int, float)) or linger_ms < 0:
            raise InvalidConfigError(f"linger_ms must be >= 0, not {linger_ms!r}")
        if transactional_id is not None:
            validate_name(transactional_id, "transactional id")
            if not enable_idempotence:
                raise InvalidConfigError(
                    "a transactional producer needs enable_idempotence=True")
        self.batch_size = batch_size
        self.data_object_bytes = data_object_bytes
        self._staged: list[_Staged] = []
        self._staged_bytes = 0
        self._staged_since = 0.0  # time.monotonic() when the oldest staged batch was staged
        # A full data object being written behind (send_table(wait=False)): its batches and
        # the write; settled, in this thread, before anything else is written or decided.
        self._behind: tuple[list[_Staged], Future[None]] | None = None
        self.linger_ms = linger_ms
        self.enable_idempotence = enable_idempotence
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self._key_serializer = key_serializer
        self._value_serializer = value_serializer
        self._partitioner = StickyPartitioner()
        self._pending: dict[tuple[str, int], Pending] = {}
        self._sequences: dict[tuple[str, int], int] = {}
        self._producer_id = NO_PRODUCER_ID
        self._epoch = NO_PRODUCER_EPOCH
        self._fatal: BaseException | None = None
        self._needs_new_id = False  # set when a batch's outcome is unknown
        # transactions
        self._state = _S.READY if transactional_id is None else _S.UNINITIALIZED
        self._decision_id = ""
        self._txn_partitions: set[tuple[str, int]] = set()
        self._txn_has_offsets = False
        self._expiry_checked: dict[tuple[str, int], float] = {}
        if enable_idempotence and transactional_id is None:
            self._producer_id = log.producer_ids.next_id()
            self._epoch = 0

    # --- introspection -------------------------------------------------------------

    @property
    def producer_id(self) -> int:
        return self._producer_id

    @property
    def epoch(self) -> int:
        return self._epoch

    def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.log.describe_topic(topic).partitions))

    # --- sending -----------------------------------------------------------------------

    def _transition(self, state: ClientState) -> None:
        if state not in _TRANSITIONS[self._state]:
            raise IllegalStateError(f"producer {self.transactional_id!r}: no transition from "
                                    f"{self._state.value} to {state.value}")
        self._state = state

    def _check_usable(self) -> None:
        if self._state is _S.CLOSED:
            raise IllegalStateError("the producer is closed")
        if self._fatal is not None:
            raise self._fatal
        if self.transactional_id is not None:
            if self._state in (_S.UNINITIALIZED, _S.PREPARED):
                raise IllegalStateError(
                    f"transactional producer {self.transactional_id!r}: call init_transactions() "
                    "first")

    def _check_can_send(self, what: str) -> None:
        self._check_usable()
        if self.transactional_id is not None and self._state is not _S.IN_TRANSACTION:
            raise IllegalStateError(
                f"transactional producer {self.transactional_id!r}: {what} outside a "
                "transaction; call begin_transaction() first")
        if self._state is _S.PREPARED:
            raise IllegalStateError("the transaction was handed to its coordinator; "
                                    "no more records may join it")

    def _join_partitions(self, tps: list[tuple[str, int]]) -> None:
        """AddPartitionsToTxn before any byte reaches a partition, so that whoever
        ends or fences this transaction knows to mark it."""
        new = [tp for tp in tps if tp not in self._txn_partitions]
        if self.transactional_id is not None and new:
            self._settle_behind()  # the coordinator's state changes one step at a time
            with self._abortable_on_expiry():
                self.log.coordinator.add_partitions(self._member(), new)
            self._txn_partitions.update(new)

    @contextmanager
    def _abortable_on_expiry(self) -> Iterator[None]:
        """Joining failed for good: fenced (fatal), or the id expired under this producer
        (commit_transaction() raises it again; abort_transaction() starts the id again)."""
        try:
            yield
        except (InvalidPidMappingError, ProducerFencedError) as exc:
            self._fatal = exc
            raise

    def send(self, topic: str, value: Any = None, key: Any = None,
             partition: int | None = None, headers: list[tuple[str, bytes]] | None = None,
             timestamp_ms: int | None = None) -> FutureRecordMetadata:
        self._check_can_send("send()")
        if self._key_serializer is not None and key is not None:
            key = self._key_serializer(key)
        if self._value_serializer is not None and value is not None:
            value = self._value_serializer(value)
        key = as_bytes(key, "key")
        value = as_bytes(value, "value")
        num_partitions = self._partition_count(topic, partition)
        if partition is None:
            partition = partition_for_key(key, num_partitions) if key is not None \
                else self._partitioner.partition(topic, num_partitions)
        elif not isinstance(partition, int) or not 0 <= partition < num_partitions:
            raise InvalidConfigError(
                f"topic {topic!r} has partitions 0 to {num_partitions - 1}; "
                f"cannot send to partition {partition!r}")
        if timestamp_ms is None:
            timestamp_ms = clock.now_ms()
        elif not isinstance(timestamp_ms, int) or timestamp_ms < 0:
            raise InvalidConfigError(f"timestamp_ms must be a non-negative int, "
                                     f"not {timestamp_ms!r}")
        header_list = []
        for item in headers or ():
            hkey, hvalue = item
            if not isinstance(hkey, str):
                raise TypeError(f"header keys must be str, got {type(hkey).__name__}")
            header_list.append({"key": hkey, "value": as_bytes(hvalue, "header value")})
        tp = (topic, partition)
        self._join_partitions([tp])
        pending = self._pending.get(tp)
        if pending is None:
            pending = self._pending[tp] = Pending(created=time.monotonic())
        future = FutureRecordMetadata(self, topic, partition)
        pending.keys.append(key)
        pending.values.append(value)
        pending.timestamps.append(timestamp_ms)
        pending.headers.append(header_list)
        pending.futures.append(future)
        pending.size += RECORD_OVERHEAD + len(key or b"") + len(value or b"") + sum(
            len(h["key"]) + len(h["value"] or b"") for h in header_list)
        if pending.size >= self.batch_size:
            self._drain(tp, write=False)  # staged: its data object is written when full
            self._write_if_full()
        elif self.linger_ms == 0:
            self._drain(tp)
        else:
            self._drain_lingering()
        return future

    def send_table(self, topic: str, table: pa.Table | pa.RecordBatch,
                   partition: int | None = None, *, wait: bool = True) -> list[SentBatch]:
        """Send a whole Arrow table: the bulk path of the Spark writer.

        Columns: ``value`` (binary or string, required, may be null), and
        optionally ``key`` (binary or string), ``headers``
        (list<struct<key string, value binary>>), ``timestamp`` (int64 ms or
        any Arrow timestamp; null means now) and ``partition`` (int32/int64;
        null lets the partitioner choose).  ``partition`` as an argument sends
        every row there.  Keyed rows go where Kafka's partitioner puts them,
        null keys stick to one partition per batch's worth of bytes (KIP-480).
        Rows are grouped per partition keeping their order, cut into batches
        of ``batch_size`` bytes and published one by one through the same path
        as ``send`` (records pending from ``send`` for a partition go first).
        Returns ``(partition, base offset, last offset)`` of each batch
        written.  If a batch fails, the exception propagates and later batches
        are not sent; batches before it stay written unless the producer is
        transactional and the transaction is aborted.

        Batches gather into data objects of ``data_object_bytes``; with
        ``wait=False`` the last, partly filled one stays staged for the next
        call, ``flush()`` or the commit (fewer, larger writes: the Spark
        writer's way), a full one is written behind while the call returns
        (docs/protocol.md 1.1: its failure is raised by the next call that
        writes), and the returned list fills as the call's batches are
        written, by this call or a later one.
        """
        self._check_can_send("send_table()")
        records, chosen, sizes = normalise_table(table, clock.now_ms())
        highest = partition if partition is not None else \
            int(chosen.max()) if chosen is not None and len(chosen) else None
        num_partitions = self._partition_count(topic, highest)
        n = records.num_rows
        if n == 0:
            return []
        if partition is not None:
            if not isinstance(partition, int) or isinstance(partition, bool) or \
                    not 0 <= partition < num_partitions:
                raise InvalidConfigError(
                    f"topic {topic!r} has partitions 0 to {num_partitions - 1}; "
                    f"cannot send to partition {partition!r}")
            parts = np.full(n, partition, dtype=np.int32)
        else:
            parts = partitions_for_keys(records.column("key"), num_partitions)
            if chosen is not None:
                given = chosen >= 0
                bad = given & (chosen >= num_partitions)
                if bad.any():
                    raise InvalidConfigError(
                        f"topic {topic!r} has partitions 0 to {num_partitions - 1}; row "
                        f"{int(np.argmax(bad))} asks for partition {int(chosen[bad][0])}")
                parts = np.where(given, chosen, parts).astype(np.int32)
            unkeyed = np.flatnonzero(parts < 0)
            if len(unkeyed):
                parts[unkeyed] = self._sticky_partitions(topic, num_partitions, sizes[unkeyed])
        # Per partition, rows keep their input order (a stable sort; numpy's is a radix
        # sort for 16-bit keys, over three times as fast as for int32 ones).
        order = np.argsort(parts.astype(np.int16) if num_partitions <= 1 << 15 else parts,
                           kind="stable")
        sorted_parts = parts[order]
        bounds = np.flatnonzero(np.diff(sorted_parts)) + 1
        groups = [(int(sorted_parts[lo]), lo, hi)
                  for lo, hi in _runs(bounds, n)]
        self._join_partitions([(topic, p) for p, _, _ in groups])
        # One take into partition order, then a slice per partition: the rows are
        # copied once, in one pass (a take per partition scanned the table each time).
        grouped = records.take(pa.array(order)) if len(groups) > 1 else records
        # Every batch's first and last timestamp at once (a min_max call per batch cost
        # more than the rest of its staging).
        times = grouped.column("timestamp").to_numpy()
        sent: list[SentBatch] = []
        for p, first, end in groups:
            tp = (topic, p)
            self._drain(tp, write=False)  # records sent before, to this partition, go first
            part_records = grouped.slice(first, end - first)
            row_sizes = sizes[order[first:end]]
            starts = np.cumsum(row_sizes) - row_sizes
            batch_ids = starts // self.batch_size
            cuts = np.flatnonzero(np.diff(batch_ids)) + 1
            runs = _runs(cuts, end - first)
            part_times = times[first:end]
            heads = np.concatenate(([0], cuts))  # where each run starts
            lows = np.minimum.reduceat(part_times, heads).tolist()
            highs = np.maximum.reduceat(part_times, heads).tolist()
            for (lo, hi), low, high in zip(runs, lows, highs, strict=True):
                batch = part_records.slice(lo, hi - lo)
                self._stage_batch(tp, batch, low, high, done=lambda r, p=p:
                                  sent.append(SentBatch(p, r.base_offset, r.last_offset)))
                self._write_if_full(behind=not wait)
        if wait:
            self._write_staged()
        return sent

    def _partition_count(self, topic: str, wanted: object = None) -> int:
        """The topic's partition count, looked up again when ``wanted`` is past the cached
        one (a partition added since, as a Kafka producer refreshes its metadata)."""
        count = self.log.describe_topic(topic).partitions
        if isinstance(wanted, int) and wanted >= count:
            count = self.log.describe_topic(topic, refresh=True).partitions
        return count

    def _sticky_partitions(self, topic: str, num_partitions: int,
                           sizes: np.ndarray) -> np.ndarray:
        """KIP-480 for a bulk send: unkeyed rows fill one partition per batch's worth of
        bytes, then move on, as ``send`` would with one record at a time."""
        chunk = (np.cumsum(sizes) - sizes) // self.batch_size
        out = np.empty(len(sizes), dtype=np.int32)
        bounds = np.flatnonzero(np.diff(chunk)) + 1
        for lo, hi in _runs(bounds, len(sizes)):
            p = self._partitioner.partition(topic, num_partitions)
            out[lo:hi] = p
            self._partitioner.batch_sent(topic, p, num_partitions)
        return out

    def _drain_lingering(self) -> None:
        now = time.monotonic()
        lingering = [tp for tp, pending in self._pending.items()
                     if (now - pending.created) * 1000 >= self.linger_ms]
        for tp in lingering:
            self._drain(tp, write=False)
        # A full batch is staged until its data object fills; linger_ms bounds that
        # wait too, as it bounds a Kafka batch's.
        if lingering or (self._staged and
                         (now - self._staged_since) * 1000 >= self.linger_ms):
            self._write_staged()

    def next_due(self) -> float | None:
        """When (``time.monotonic()``) the oldest pending batch's ``linger_ms`` runs out,
        or None with nothing pending: for a caller that publishes in the background."""
        created = [p.created for p in self._pending.values()]
        if self._staged:
            created.append(self._staged_since)
        if not created:
            return None
        return min(created) + self.linger_ms / 1000

    def drain_due(self) -> None:
        """Publish the pending batches whose ``linger_ms`` has run out.

        A background sender (``txlog.kafka``'s) calls this so that records do
        not wait for the next ``send``; errors fail the batch's futures and
        are raised, as ``flush`` raises them.
        """
        self._drain_lingering()

    def drain(self, tp: tuple[str, int]) -> None:
        """Publish ``tp``'s pending batch now (what a future's ``get()`` does)."""
        self._drain((tp[0], tp[1]))

    def _drain(self, tp: tuple[str, int], write: bool = True) -> None:
        """Turn the records pending for ``tp`` into a staged batch; with ``write``, write
        everything staged (a future's ``get()`` needs its offset now)."""
        pending = self._pending.pop(tp, None)
        if pending is not None:
            topic, partition = tp

            def done(result: AppendResult) -> None:
                for i, f in enumerate(pending.futures):
                    timestamp = result.log_append_time if result.log_append_time >= 0 \
                        else pending.timestamps[i]
                    f._resolve(RecordMetadata(topic, partition, result.base_offset + i,
                                              timestamp))

            def failed(exc: BaseException) -> None:
                for f in pending.futures:
                    f._fail(exc)

            try:
                table = pa.Table.from_arrays([
                    pa.array(pending.keys, pa.binary()),
                    pa.array(pending.values, pa.binary()),
                    pa.array(pending.timestamps, pa.int64()),
                    pa.array(pending.headers, HEADER_TYPE),
                ], schema=RECORD_SCHEMA)
                self._stage_batch(tp, table, min(pending.timestamps), max(pending.timestamps),
                                  done, failed)
            except BaseException as exc:
                failed(exc)
                raise
        if write:
            self._write_staged()

    def _stage_batch(self, tp: tuple[str, int], records: pa.Table, base_timestamp: int,
                     max_timestamp: int, done: Callable[[AppendResult], None] | None = None,
                     failed: Callable[[BaseException], None] | None = None) -> None:
        """Encode one batch of ``records`` (RECORD_SCHEMA) for ``tp`` and stage it: the
        one write path (``_write_staged`` publishes it).

        Every way of sending ends here, so sequences, idempotence, transactions,
        max.message.bytes, LogAppendTime and the outcome-unknown rule hold alike.
        The sequence is taken now: batches of one partition are claimed in the
        order they were staged.
        """
        topic, partition = tp
        if self._needs_new_id:
            # A batch of the old id may have landed: its sequences are never reused.
            self._producer_id = self.log.producer_ids.next_id()
            self._epoch = 0
            self._sequences.clear()
            self._needs_new_id = False
        payload = encode_records(records, self._compression)
        desc = self.log.describe_topic(topic)
        max_bytes = desc.config.get("max.message.bytes")
        if max_bytes is not None and len(payload) > max_bytes:
            raise InvalidConfigError(
                f"batch of {len(payload)} bytes for {topic}-{partition} exceeds the topic's "
                f"max.message.bytes={max_bytes}")
        log_append = desc.config.get("message.timestamp.type") == "LogAppendTime"
        part = self.log.partition(topic, partition)
        count = records.num_rows
        sequence = self._sequences.get(tp, 0) if self.enable_idempotence else NO_SEQUENCE
        attributes = self._compression_bits
        if self.transactional_id is not None:
            attributes |= TRANSACTIONAL_BIT
        header = BatchHeader(
            base_offset=0, record_count=count, attributes=attributes,
            base_timestamp=base_timestamp, max_timestamp=max_timestamp,
            producer_id=self._producer_id, producer_epoch=self._epoch,
            base_sequence=sequence, decision_id=self._decision_id,
            transactional_id=self.transactional_id or "")
        if self.enable_idempotence:
            self._sequences[tp] = (sequence + count) & 0x7FFFFFFF
        if not self._staged:
            self._staged_since = time.monotonic()
        self._staged.append(_Staged(tp, part, header, payload, log_append, sequence, done,
                                    failed))
        self._staged_bytes += len(payload)
        self._partitioner.batch_sent(topic, partition, desc.partitions)

    def _write_if_full(self, behind: bool = False) -> None:
        if self._staged_bytes >= self.data_object_bytes:
            if behind:
                self._write_behind()
            else:
                self._write_staged()

    def _write_staged(self) -> None:
        """Write what is staged: one data object with every payload above
        INLINE_PAYLOAD_BYTES, then each partition's claims (small batches inline), the
        partitions at once, each in its staged order (docs/protocol.md, section 1.1).

        Raises the first failure in staged order, after every batch's futures
        learnt its outcome; a failed batch stops its partition's later batches
        (their sequences follow it), not the other partitions'.  A write behind
        is settled first, so batches reach each partition in staged order.
        """
        first_error: BaseException | None = None
        try:
            self._settle_behind()
        except BaseException as exc:  # the other partitions' staged batches still go
            first_error = exc
        staged, self._staged, self._staged_bytes = self._staged, [], 0
        if staged:
            _publish(self.log, staged)
            try:
                self._settle(staged)
            except BaseException as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error

    def _write_behind(self) -> None:
        """Write what is staged in a thread, and return: the caller encodes the next data
        object while this one's bytes reach the disk or the store (Kafka's producer
        leaves its sends to a sender thread for the same reason).  At most one write is
        behind, so a producer holds at most two data objects' worth.  Its outcome is
        settled, and its first failure raised, by the next write, flush or decision
        (docs/protocol.md, section 1.1)."""
        self._settle_behind()
        staged, self._staged, self._staged_bytes = self._staged, [], 0
        if staged:
            self._behind = (staged, _write_pool().submit(_publish, self.log, staged))

    def _settle_behind(self, raise_error: bool = True) -> None:
        """Wait for the write behind, if any, and settle it here (the producer's state
        is only ever changed by its caller's thread)."""
        if self._behind is None:
            return
        staged, writing = self._behind
        self._behind = None
        try:
            writing.result()
        except BaseException as exc:  # _publish records failures; this is an interrupt
            for b in staged:
                if b.result is None and b.error is None:
                    b.error = exc
        try:
            self._settle(staged)
        except BaseException:
            if raise_error:
                raise

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
            if b.tp not in failed_tps:  # the first failed batch of its partition
                failed_tps.add(b.tp)
                self._append_failed(b.tp, exc)
                if self.enable_idempotence and not self._needs_new_id and \
                        b.tp in self._sequences:
                    self._sequences[b.tp] = b.sequence  # neither it nor later ones landed
                first_error = first_error or exc
            if b.failed is not None:
                b.failed(exc)
        if failed_tps and self._staged:
            # Staged while a write behind failed: a failed partition's later batches
            # follow the failed one's sequence, so they fail too, as in one flush.
            kept = []
            for b in self._staged:
                if b.tp in failed_tps:
                    if b.failed is not None:
                        b.failed(first_error or RuntimeError("batch was not written"))
                else:
                    kept.append(b)
            self._staged = kept
            self._staged_bytes = sum(len(b.payload) for b in kept)
        for tp in written_tps:
            self._maybe_abort_expired(tp)
        if first_error is not None:
            raise first_error

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
        if isinstance(exc, ProducerFencedError):
            self._fatal = exc
            return
        if self.transactional_id is not None:
            if isinstance(exc, TxlogError):
                self._fatal = exc
            else:
                fatal = TransactionAbortedError(
                    f"transaction of {self.transactional_id!r}: a batch for {tp[0]}-{tp[1]} "
                    f"failed with {type(exc).__name__} ({exc}) and may or may not have been "
                    "written; call abort_transaction()")
                fatal.__cause__ = exc
                self._fatal = fatal
            return
        if isinstance(exc, DEFINITIVE_REJECTIONS) or not self.enable_idempotence:
            return
        self._needs_new_id = True
        self._sequences.clear()
        logger.warning("producer %d: a batch for %s-%d ended with %s (%s); its outcome is "
                       "unknown, so the next batch uses a new producer id", self._producer_id,
                       tp[0], tp[1], type(exc).__name__, exc)

    def _maybe_abort_expired(self, tp: tuple[str, int]) -> None:
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
        state = self.log.partition(*tp).proven_state()
        self.log.coordinator.abort_expired_in(*tp, state=state,
                                              own=(self._producer_id, self._epoch))

    def flush(self, timeout: float | None = None) -> None:
        """Publish every pending batch; raises the first error a batch met."""
        first_error: BaseException | None = None
        for tp in list(self._pending):
            try:
                self._drain(tp, write=False)
            except BaseException as exc:  # keep draining the others, report the first
                first_error = first_error or exc
        try:
            self._write_staged()
        except BaseException as exc:
            first_error = first_error or exc
        if first_error is not None:
            raise first_error

    def close(self, timeout: float | None = None) -> None:
        """Flush and close.  An open transaction is left for its coordinator (or timeout)."""
        if self._state is _S.CLOSED:
            return
        try:
            if self._fatal is None and not (self.transactional_id
                                            and self._state is _S.IN_TRANSACTION):
                self.flush()
            else:  # nothing more is written, but what is on its way is let finish
                self._settle_behind(raise_error=False)
        finally:
            self._transition(_S.CLOSED)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transactions --------------------------------------------------------------------

    def _require_transactional(self) -> str:
        if self.transactional_id is None:
            raise IllegalStateError(
                "this producer has no transactional_id; create it with "
                "log.producer(transactional_id=...)")
        return self.transactional_id

    def _member(self) -> TransactionMember:
        from ..transactions.metadata import TransactionMember

        return TransactionMember(self._require_transactional(), self._producer_id, self._epoch,
                                 self._decision_id, sorted(self._txn_partitions))

    def init_transactions(self) -> None:
        """InitProducerId: fence older instances, abort or finish their transaction."""
        txn_id = self._require_transactional()
        if self._state is _S.CLOSED:
            raise IllegalStateError("the producer is closed")
        if self._state is _S.IN_TRANSACTION:
            raise IllegalStateError("init_transactions() during a transaction")
        self._producer_id, self._epoch = self.log.coordinator.init_producer_id(
            txn_id, self.transaction_timeout_ms)
        self._sequences.clear()
        self._transition(_S.READY)
        self._fatal = None

    def begin_transaction(self, decision_id: str | None = None) -> None:
        """Start a transaction; ``decision_id`` joins a multi-producer transaction."""
        self._require_transactional()
        self._check_usable()
        if self._state is _S.IN_TRANSACTION:
            raise IllegalStateError("a transaction is already in progress")
        if decision_id is not None:
            validate_name(decision_id, "decision id")
        self._decision_id = decision_id or self._plain_decision_id()
        self._txn_partitions = set()
        self._txn_has_offsets = False
        self._transition(_S.IN_TRANSACTION)

    def _check_in_transaction(self, what: str) -> None:
        self._require_transactional()
        self._check_usable()
        if self._state is not _S.IN_TRANSACTION:
            raise IllegalStateError(f"{what} outside a transaction; call begin_transaction()")

    def send_offsets_to_transaction(self, offsets: dict[tuple[str, int], int],
                                    group_id: str, *, member_id: str | None = None,
                                    generation: int | None = None) -> None:
        """AddOffsetsToTxn + TxnOffsetCommit: offsets visible only if the transaction commits.

        With the consumer's ``generation`` (and ``member_id``), the commit is
        fenced as KIP-447 fences it: refused with CommitFailedError if the
        group has moved on, here and, atomically, in the group's offsets
        chain, where the send is registered so that a member taking the
        partitions over decides this transaction before it reads the offsets
        (docs/protocol.md, section 9.4).  The refusal leaves the transaction
        abortable only: commit_transaction() raises it again, abort it.
        Without a generation (or with -1 and no member id, the metadata of a
        consumer that has not joined) it is a simple consumer's commit.
        """
        self._check_in_transaction("send_offsets_to_transaction()")
        self._settle_behind()  # the coordinator's state changes one step at a time
        if generation == -1 and not member_id:
            generation = member_id = None  # Kafka's UNKNOWN_GENERATION_ID: no fencing
        if generation is not None or member_id is not None:
            check_offsets(offsets)
            if generation is None:
                raise InvalidConfigError("send_offsets_to_transaction: member_id needs a "
                                         "generation (the consumer's group metadata)")
            member = self._member()
            try:
                check_generation(self.log, group_id, member_id, generation)
                register_transactional_offsets(
                    self.log.storage, group_id, member.transactional_id,
                    (member.producer_id, member.epoch), generation, member_id or "",
                    list(offsets))
            except CommitFailedError as exc:
                self._fatal = exc  # abortable: commit_transaction() raises it, abort clears it
                raise
        with self._abortable_on_expiry():
            self.log.coordinator.add_offsets(self._member(), group_id, offsets)
        self._txn_has_offsets = True

    def _end(self, commit: bool) -> None:
        member = self._member()
        self._transition(_S.READY)
        try:
            if not self._txn_partitions and not self._txn_has_offsets:
                return  # nothing joined the transaction: nothing to decide
            self._producer_id, self._epoch = self.log.coordinator.end_transaction(member, commit)
            self._sequences.clear()
        except ProducerFencedError as exc:
            self._fatal = exc
            raise

    def _plain_decision_id(self) -> str:
        return plain_decision_id(self._producer_id, self._epoch)

    def _is_shared(self) -> bool:
        return self._decision_id != self._plain_decision_id()

    def commit_transaction(self) -> None:
        self._check_in_transaction("commit_transaction()")
        if self._is_shared():
            raise IllegalStateError(
                f"producer {self.transactional_id!r} is a member of shared transaction "
                f"{self._decision_id!r}: call prepare_transaction() and let the coordinator run "
                "log.coordinator.end_shared_transaction(); a member cannot commit alone")
        try:
            self.flush()
        except BaseException as exc:
            if isinstance(exc, ProducerFencedError):
                self._transition(_S.READY)
                raise
            raise TransactionAbortedError(
                f"transaction of {self.transactional_id!r} cannot commit: a batch failed "
                f"({exc}); call abort_transaction()") from exc
        self._end(commit=True)

    def abort_transaction(self) -> None:
        self._require_transactional()
        if self._state is _S.CLOSED:
            raise IllegalStateError("the producer is closed")
        if self._fatal is not None and isinstance(self._fatal, ProducerFencedError):
            raise self._fatal
        if self._state is not _S.IN_TRANSACTION:
            raise IllegalStateError("abort_transaction() outside a transaction")
        # Its claims land before the markers, or would be refused by the bumped epoch.
        self._settle_behind(raise_error=False)
        aborted = TransactionAbortedError(f"transaction of {self.transactional_id!r} aborted")
        for pending in self._pending.values():
            for f in pending.futures:
                f._fail(aborted)
        self._pending.clear()
        for b in self._staged:
            if b.failed is not None:
                b.failed(aborted)
        self._staged, self._staged_bytes = [], 0
        expired = isinstance(self._fatal, InvalidPidMappingError)
        self._fatal = None
        try:
            if not expired:
                self._end(commit=False)
                return
        except InvalidPidMappingError:
            pass
        self._restart_expired()

    def _restart_expired(self) -> None:
        """After the id expired under this producer (nothing of the transaction was
        written: an id with an open transaction never expires), start it again under a
        new producer id, unless another instance took it meanwhile: then this one is
        fenced, as Kafka's producer is when InitProducerId's expected epoch is stale."""
        self._transition(_S.READY)
        try:
            self._producer_id, self._epoch = self.log.coordinator.init_producer_id(
                self._require_transactional(), self.transaction_timeout_ms,
                expired=(self._producer_id, self._epoch))
        except ProducerFencedError as exc:
            self._fatal = exc
            raise
        self._sequences.clear()

    def prepare_transaction(self) -> TransactionMember:
        """Flush and hand this producer's part of a shared transaction to its coordinator.

        For multi-producer transactions (a Spark job's tasks): the returned
        member goes to whoever runs ``log.coordinator.end_shared_transaction``.
        """
        self._check_in_transaction("prepare_transaction()")
        self.flush()
        # The coordinator bumps this id's epoch when it ends the shared
        # transaction, so this instance cannot go on without a new InitProducerId.
        self._transition(_S.PREPARED)
        return self._member()


def _publish(log: Log, staged: list[_Staged]) -> None:
    """Write one flush: its data object, then each partition's claims, the partitions at
    once.  Each batch's ``result`` or ``error`` records its outcome; the producer settles
    them (in its caller's thread, for a write behind)."""
    large = [b for b in staged if len(b.payload) > INLINE_PAYLOAD_BYTES]
    # Each partition's payloads back to back in staged order, so that its batches of
    # this flush form one byte range: one claim and one ranged read cover them.
    order: dict[tuple[str, int], int] = {}
    large.sort(key=lambda b: order.setdefault(b.tp, len(order)))
    if large:
        try:
            placed = write_data_object(log.storage, [b.payload for b in large])
        except BaseException as exc:
            # No claim points at it: the batches are certainly not in the log, but
            # their sequences were taken, so the usual rule decides what follows.
            for b in staged:
                b.error = exc
            return
        for b, (path, offset, started) in zip(large, placed, strict=True):
            b.reference = DataReference(path, offset, started)
    runs: dict[tuple[str, int], list[_Staged]] = {}
    for b in staged:
        runs.setdefault(b.tp, []).append(b)
    flush = FlushVerification()  # one KIP-890 check per transaction per flush (2.6.1)
    if len(runs) == 1:
        flush.run(_claim_run, next(iter(runs.values())))
    else:
        list(_claim_pool().map(lambda run: flush.run(_claim_run, run), runs.values()))


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
