"""The producer: batching, Kafka's partitioner, idempotence and transactions.

Names follow kafka-python.  There is no background sender thread: records
accumulate per partition and a batch is published when it reaches
``batch_size``, when it is older than ``linger_ms`` at the next ``send``, on
``flush()``, or when a caller waits on one of its futures.  Nothing is ever
published behind the caller's back, which keeps transaction boundaries exact.

``Producer`` is the public face of three parts, as kafka-python's is: the
records waiting per partition (``accumulator.py``), the producer's identity,
sequences and transactional state (``transaction_manager.py``) and the
writes and their outcomes (``sender.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa

from .. import clock
from ..errors import InvalidConfigError, ProducerFencedError, TransactionAbortedError
from .accumulator import (FutureRecordMetadata, RecordAccumulator, as_bytes, batch_runs,
                          by_partition, in_partition_order, normalise_table, runs)
from .metrics import DEFAULT_NUM_SAMPLES, DEFAULT_SAMPLE_WINDOW_MS, MetricConfig
from .producer_settings import (DEFAULT_COMPRESSION, LOCAL_DEFAULTS, check_producer_settings,
                                store_defaults)
from .partitioner import StickyPartitioner, partition_for_key, partitions_for_keys
from .sender import Sender
from .transaction_manager import ClientState, TransactionManager

if TYPE_CHECKING:
    from ..api.log import Log
    from ..partition.appender import AppendResult
    from ..transactions.metadata import TransactionMember

# Bytes per batch where the store's default does not apply (txlog.kafka's producer,
# the Spark writer's max.request.size bound); larger than Kafka's 16 KiB, because each
# batch is part of a claim, and the claims of one flush are what a write costs.
DEFAULT_BATCH_SIZE = LOCAL_DEFAULTS.batch_size
DEFAULT_LINGER_MS = 5
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000


class SentBatch(NamedTuple):
    """One batch written by ``send_table``."""

    partition: int
    base_offset: int
    last_offset: int


def _note_sent(sent: list[SentBatch], partition: int, result: AppendResult) -> None:
    sent.append(SentBatch(partition, result.base_offset, result.last_offset))


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
                 batch_size: int | None = None, linger_ms: int = DEFAULT_LINGER_MS,
                 compression: str | None = DEFAULT_COMPRESSION,
                 key_serializer: Callable[[Any], bytes] | None = None,
                 value_serializer: Callable[[Any], bytes] | None = None,
                 compression_type: str | None = None,
                 data_object_bytes: int | None = None,
                 metrics_num_samples: int = DEFAULT_NUM_SAMPLES,
                 metrics_sample_window_ms: int = DEFAULT_SAMPLE_WINDOW_MS,
                 allow_auto_create_topics: bool = True) -> None:
        compression = check_producer_settings(
            compression=compression, compression_type=compression_type, batch_size=batch_size,
            data_object_bytes=data_object_bytes, linger_ms=linger_ms,
            transactional_id=transactional_id, enable_idempotence=enable_idempotence,
            metrics_num_samples=metrics_num_samples,
            metrics_sample_window_ms=metrics_sample_window_ms)
        self._compression = None if compression == "none" else compression
        services = log.services
        self._services = services
        # What the caller leaves out of the settings that depend on the store, the
        # store's defaults fill in (clients/producer_settings.py, docs/clients.md).
        settings = store_defaults(services.storage, batch_size, data_object_bytes)
        self._send_table_waits = settings.send_table_waits
        self.batch_size = settings.batch_size
        self.data_object_bytes = settings.data_object_bytes
        self.linger_ms = linger_ms
        self.enable_idempotence = enable_idempotence
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        # A topic missing at first use is created as the root says, unless this is False.
        self._auto_create = None if allow_auto_create_topics \
            else ("allow_auto_create_topics", False)
        self._key_serializer = key_serializer
        self._value_serializer = value_serializer
        self._partitioner = StickyPartitioner()
        self._accumulator = RecordAccumulator()
        self._transactions = TransactionManager(services, transactional_id,
                                                transaction_timeout_ms, enable_idempotence)
        self._sender = Sender(services, self._transactions, self._partitioner,
                              self._compression, self.data_object_bytes,
                              MetricConfig(metrics_num_samples, metrics_sample_window_ms))

    # --- introspection -------------------------------------------------------------

    @property
    def producer_id(self) -> int:
        return self._transactions.producer_id

    @property
    def epoch(self) -> int:
        return self._transactions.epoch

    def partitions_for(self, topic: str) -> set[int]:
        """The topic's partitions; a topic missing is created as ``send`` would create it."""
        return set(range(self._services.ensure_topic(topic, self._auto_create).partitions))

    def metrics(self, raw: bool = False) -> dict[Any, Any]:
        """kafka-python's ``{group: {name: value}}`` (clients/metrics.py), safe to call from
        any thread; ``raw``: ``{MetricName: Metric}``."""
        return self._sender.sensors.metrics.values(raw)

    # --- sending -----------------------------------------------------------------------

    def _join_partitions(self, tps: list[tuple[str, int]]) -> None:
        """AddPartitionsToTxn before any byte reaches a partition."""
        new = self._transactions.new_partitions(tps)
        if new:
            self._sender.settle_behind()  # the coordinator's state changes one step at a time
            self._transactions.add_partitions(new)

    def send(self, topic: str, value: Any = None, key: Any = None,
             partition: int | None = None, headers: list[tuple[str, bytes]] | None = None,
             timestamp_ms: int | None = None) -> FutureRecordMetadata:
        self._transactions.check_can_send("send()")
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
        future = FutureRecordMetadata(self, topic, partition)
        size = self._accumulator.append(tp, key, value, timestamp_ms, header_list, future)
        if size >= self.batch_size:
            self._drain(tp, write=False)  # staged: its data object is written when full
            self._sender.write_if_full()
        elif self.linger_ms == 0:
            self._drain(tp)
        else:
            self._drain_lingering()
        return future

    def send_table(self, topic: str, table: pa.Table | pa.RecordBatch,
                   partition: int | None = None, *, wait: bool | None = None
                   ) -> list[SentBatch]:
        """Send a whole Arrow table: the bulk path of the Spark writer.

        Columns: ``value`` (binary or string, required, may be null), and
        optionally ``key`` (binary or string), ``headers``
        (list<struct<key string, value binary>>), ``timestamp`` (int64 ms or
        any Arrow timestamp; null means now) and ``partition`` (int32/int64;
        null lets the partitioner choose).  ``partition`` as an argument sends
        every row there.  Keyed rows go where Kafka's partitioner puts them,
        null keys stick to one partition per batch's worth of bytes (KIP-480).
        Rows are grouped per partition keeping their order, cut into batches of
        ``batch_size`` bytes and published one by one through the same path as
        ``send`` (records pending from ``send`` for a partition go first).  Returns
        ``(partition, base offset, last offset)`` of each batch written.  If a batch
        fails, the exception propagates and later batches are not sent; batches before
        it stay written unless the producer is transactional and the transaction is aborted.

        Batches gather into data objects of ``data_object_bytes``; with
        ``wait=False`` the last, partly filled one stays staged for the next
        call, ``flush()`` or the commit (fewer, larger writes), a full one is
        written behind while the call returns (docs/protocol.md 1.1: its
        failure is raised by the next call that writes), and the returned
        list fills as the call's batches are written, by this call or a later
        one.  ``wait=None`` is the store's default: True on local disk and in
        memory, False on an object store (docs/clients.md).
        """
        if wait is None:
            wait = self._send_table_waits
        self._transactions.check_can_send("send_table()")
        records, chosen, sizes, key_value = normalise_table(table, clock.now_ms())
        highest = partition if partition is not None else \
            int(chosen.max()) if chosen is not None and len(chosen) else None
        num_partitions = self._partition_count(topic, highest)
        n = records.num_rows
        if n == 0:
            return []
        parts = self._row_partitions(topic, records, chosen, sizes, partition, num_partitions)
        order, groups = by_partition(parts, num_partitions)
        self._join_partitions([(topic, p) for p, _, _ in groups])
        # One take into partition order, then a slice per partition: the rows are
        # copied once, in one pass (a take per partition scanned the table each time).
        grouped = in_partition_order(records, order, table.column_names) if len(groups) > 1 else records
        times, key_value = grouped.column("timestamp").to_numpy(), key_value[order]
        sent: list[SentBatch] = []
        for p, first, end in groups:
            tp = (topic, p)
            self._drain(tp, write=False)  # records sent before, to this partition, go first
            part_records = grouped.slice(first, end - first)
            for lo, hi, low, high in batch_runs(sizes[order[first:end]], times[first:end],
                                                self.batch_size):
                self._sender.stage(tp, part_records.slice(lo, hi - lo), low, high,
                                   done=partial(_note_sent, sent, p),
                                   largest=int(key_value[first + lo:first + hi].max()))
                self._sender.write_if_full(behind=not wait)
        if wait:
            self._sender.write_staged()
        return sent

    def _row_partitions(self, topic: str, records: pa.Table, chosen: np.ndarray | None,
                        sizes: np.ndarray, partition: int | None,
                        num_partitions: int) -> np.ndarray:
        """Each row's partition: ``partition`` for all, else the row's own, else Kafka's
        partitioner for its key, else the sticky partition of its batch's worth."""
        n = records.num_rows
        if partition is not None:
            if not isinstance(partition, int) or isinstance(partition, bool) or \
                    not 0 <= partition < num_partitions:
                raise InvalidConfigError(
                    f"topic {topic!r} has partitions 0 to {num_partitions - 1}; "
                    f"cannot send to partition {partition!r}")
            return np.full(n, partition, dtype=np.int32)
        if chosen is not None:
            given = chosen >= 0
            bad = given & (chosen >= num_partitions)
            if bad.any():
                raise InvalidConfigError(
                    f"topic {topic!r} has partitions 0 to {num_partitions - 1}; row "
                    f"{int(np.argmax(bad))} asks for partition {int(chosen[bad][0])}")
            if given.all():  # no key to hash (Spark's writer with a partition column)
                return chosen.astype(np.int32)
            parts = np.where(given, chosen, partitions_for_keys(records.column("key"),
                                                                num_partitions)).astype(np.int32)
        else:
            parts = partitions_for_keys(records.column("key"), num_partitions)
        unkeyed = np.flatnonzero(parts < 0)
        if len(unkeyed):
            parts[unkeyed] = self._sticky_partitions(topic, num_partitions, sizes[unkeyed])
        return parts

    def _partition_count(self, topic: str, wanted: object = None) -> int:
        """The topic's partition count, looked up again when ``wanted`` is past the cached
        one (a partition added since, as a Kafka producer refreshes its metadata); a topic
        missing is created if the root allows it (Kafka's auto.create.topics.enable)."""
        count = self._services.ensure_topic(topic, self._auto_create).partitions
        if isinstance(wanted, int) and wanted >= count:
            count = self._services.describe_topic(topic, refresh=True).partitions
        return count

    def _sticky_partitions(self, topic: str, num_partitions: int,
                           sizes: np.ndarray) -> np.ndarray:
        """KIP-480 for a bulk send: unkeyed rows fill one partition per batch's worth of
        bytes, then move on, as ``send`` would with one record at a time."""
        chunk = (np.cumsum(sizes) - sizes) // self.batch_size
        out = np.empty(len(sizes), dtype=np.int32)
        bounds = np.flatnonzero(np.diff(chunk)) + 1
        for lo, hi in runs(bounds, len(sizes)):
            p = self._partitioner.partition(topic, num_partitions)
            out[lo:hi] = p
            self._partitioner.batch_sent(topic, p, num_partitions)
        return out

    def _drain_lingering(self) -> None:
        now = time.monotonic()
        lingering = self._accumulator.lingering(now, self.linger_ms)
        for tp in lingering:
            self._drain(tp, write=False)
        # A full batch is staged until its data object fills; linger_ms bounds that
        # wait too, as it bounds a Kafka batch's.
        sender = self._sender
        if lingering or (sender.staged and
                         (now - sender.staged_since) * 1000 >= self.linger_ms):
            sender.write_staged()

    def next_due(self) -> float | None:
        """When (``time.monotonic()``) the oldest pending batch's ``linger_ms`` runs out,
        or None with nothing pending: for a caller that publishes in the background."""
        created = self._accumulator.created()
        if self._sender.staged:
            created.append(self._sender.staged_since)
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
        pending = self._accumulator.pop(tp)
        if pending is not None:
            try:
                self._sender.stage(tp, pending.records(), min(pending.timestamps),
                                   max(pending.timestamps), pending.resolve, pending.fail)
            except BaseException as exc:
                pending.fail(exc)
                raise
        if write:
            self._sender.write_staged()

    def flush(self, timeout: float | None = None) -> None:
        """Publish every pending batch; raises the first error a batch met.  Outside a
        transaction, also waits for the last commit's roll-forward and raises its error."""
        self._publish_pending()
        if self._transactions.state is not ClientState.IN_TRANSACTION:
            self._transactions.settle_completion()

    def _publish_pending(self) -> None:
        first_error: BaseException | None = None
        for tp in self._accumulator.partitions():
            try:
                self._drain(tp, write=False)
            except BaseException as exc:  # keep draining the others, report the first
                first_error = first_error or exc
        try:
            self._sender.write_staged()
        except BaseException as exc:
            first_error = first_error or exc
        if first_error is not None:
            raise first_error

    def close(self, timeout: float | None = None) -> None:
        """Flush and close.  An open transaction is left for its coordinator (or timeout).

        The last transaction's roll-forward (markers, offsets, Complete*) is waited for
        up to ``timeout`` seconds and its error raised; one still running after that
        goes on in its thread, which the interpreter joins at exit, and should the
        process die first, the next reader or writer of its partitions rolls it forward
        (docs/clients.md, "Commit and close")."""
        transactions = self._transactions
        if transactions.state is ClientState.CLOSED:
            return
        try:
            if transactions.fatal is None and not (
                    self.transactional_id and transactions.state is ClientState.IN_TRANSACTION):
                self._publish_pending()
            else:  # nothing more is written, but what is on its way is let finish
                self._sender.settle_behind(raise_error=False)
                transactions.settle_joins(raise_error=False)
            transactions.settle_completion(timeout)
        finally:
            transactions.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transactions --------------------------------------------------------------------

    def init_transactions(self) -> None:
        """InitProducerId: fence older instances, abort or finish their transaction."""
        self._transactions.init_transactions()

    def begin_transaction(self, decision_id: str | None = None) -> None:
        """Start a transaction; ``decision_id`` joins a multi-producer transaction."""
        self._transactions.begin(decision_id)

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
        self._transactions.check_in_transaction("send_offsets_to_transaction()")
        self._sender.settle_behind()  # the coordinator's state changes one step at a time
        self._transactions.add_offsets(offsets, group_id, member_id, generation)

    def commit_transaction(self) -> None:
        self._transactions.settle_joins(raise_error=False)  # a failed join is raised below
        self._transactions.check_can_commit()
        try:
            self.flush()
        except BaseException as exc:
            if isinstance(exc, ProducerFencedError):
                self._transactions.transition(ClientState.READY)
                raise
            raise TransactionAbortedError(
                f"transaction of {self.transactional_id!r} cannot commit: a batch failed "
                f"({exc}); call abort_transaction()") from exc
        self._transactions.end(commit=True)

    def abort_transaction(self) -> None:
        self._transactions.settle_joins(raise_error=False)  # what failed decides the abort
        self._transactions.check_can_abort()
        # Its claims land before the markers, or would be refused by the bumped epoch.
        self._sender.settle_behind(raise_error=False)
        aborted = TransactionAbortedError(f"transaction of {self.transactional_id!r} aborted")
        self._accumulator.fail_all(aborted)
        self._sender.fail_staged(aborted)
        self._transactions.abort()

    def prepare_transaction(self) -> TransactionMember:
        """Flush and hand this producer's part of a shared transaction to its coordinator.

        For multi-producer transactions (a Spark job's tasks): the returned
        member goes to whoever runs ``log.coordinator.end_shared_transaction``.
        """
        self._transactions.check_in_transaction("prepare_transaction()")
        self.flush()
        return self._transactions.prepare()
