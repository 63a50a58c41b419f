"""Batch writes: every task attempt joins the job's shared transaction; the driver decides once.

Spark runs ``create`` (through ``DataSource.writer``) on the driver, pickles
the writer to every task, and calls ``commit`` or ``abort`` on a fresh
unpickled copy with the tasks' messages.  The rules (fresh decision id per
job, one transactional id per live attempt, re-used from job to job, orphans
and leftovers ended, the lease, the pool of prefixes for jobs that name none)
are the core's ``SharedTransaction`` and ``id_pool``; this module maps Spark's
calls onto them and turns Spark's Arrow batches into the columns the producer
takes.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)
from pyspark.sql.types import StructType

from ..transactions.metadata import TransactionMember
from ..errors import InvalidConfigError
from ..api.log import Log
from ..root.root import Root
from ..clients.producer import DEFAULT_BATCH_SIZE, Producer
from ..clients.producer_settings import store_defaults
from ..exactly_once.app_versions import AppVersions
from ..exactly_once.id_pool import PoolLease, start_pooled_job
from ..exactly_once.shared_transaction import SharedTransaction, attempt_key
from ..exactly_once.stream_sink import StreamSink, query_prefix
from .checkpoint import query_id, source_offsets
from .options import WriteOptions
from .worker_logs import worker_log

if TYPE_CHECKING:
    from pyspark import TaskContext

EXACTLY_ONCE = "exactly_once"
# Bytes of input merged per send, in producer batch sizes: enough for a
# full batch per partition of a few-partition topic.
COALESCE_BATCHES = 4
_TEXT = (pa.binary(), pa.string(), pa.large_binary(), pa.large_string())


@dataclass(frozen=True)
class TxlogCommitMessage(WriterCommitMessage):
    """What one finished task attempt hands to the driver."""

    member: TransactionMember | None  # None for at_least_once writes
    records: int


def check_input_schema(schema: StructType, options: WriteOptions) -> None:
    """Spark's Kafka sink columns, checked before any task starts."""
    names = {f.name: f.dataType.simpleString() for f in schema.fields}
    if "value" not in names:
        raise InvalidConfigError(
            f"the DataFrame written to txlog needs a 'value' column (string or binary); it has "
            f"{', '.join(names) or 'no columns'}")
    allowed = {"value": ("string", "binary"), "key": ("string", "binary"),
               "topic": ("string",), "partition": ("int",),
               "headers": ("array<struct<key:string,value:binary>>",)}
    for column, types in allowed.items():
        if column in names and names[column] not in types:
            raise InvalidConfigError(
                f"column {column!r} has type {names[column]}; txlog takes "
                f"{' or '.join(types)} there")
    if "timestamp" in names and names["timestamp"] != "timestamp":
        hint = ("it has no time zone, so which instant it names is ambiguous: convert it "
                "with to_utc_timestamp(timestamp, tz) or CAST(... AS TIMESTAMP)"
                if names["timestamp"] == "timestamp_ntz" else
                "give a timestamp (e.g. timestamp_millis(ms) for epoch milliseconds), or "
                "rename or drop the column to let each record's time be the time of the write")
        raise InvalidConfigError(
            f"column 'timestamp' has type {names['timestamp']}; txlog takes a timestamp there, "
            f"the record's CreateTime; {hint}")
    if options.topic is None and "topic" not in names:
        raise InvalidConfigError(
            "no topic to write to: set option 'topic' or give the DataFrame a 'topic' column")


class _Sending:
    """Turning Spark's Arrow batches into bulk sends: shared by the batch and stream writers."""

    options: WriteOptions

    def _producer_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"compression": self.options.compression}
        batch_size = self.options.batch_size
        if self.options.max_request_size is not None:
            # Kafka sends no request larger than max.request.size; here a batch is the unit
            # written at once, so the setting bounds the batch (the default 1 MiB is Kafka's).
            batch_size = min(batch_size or DEFAULT_BATCH_SIZE, self.options.max_request_size)
        if batch_size is not None:
            config["batch_size"] = batch_size
        if self.options.linger_ms is not None:
            config["linger_ms"] = self.options.linger_ms
        # The data objects' size and whether a send waits are the core's, chosen for the
        # store (clients/producer_settings.py), unless dataObjectBytes says otherwise.
        if self.options.data_object_bytes is not None:
            config["data_object_bytes"] = self.options.data_object_bytes
        return config

    def _write_idempotent(self, iterator: Iterator[pa.RecordBatch]) -> TxlogCommitMessage:
        """at_least_once: an idempotent producer, no transaction."""
        log = _open(self.options)
        config = self._producer_config()
        with ExitStack() as held:
            _, records = self._send_all(
                log.services, lambda: held.enter_context(Producer(log, **config)), iterator,
                config)
        return TxlogCommitMessage(None, records)

    def _write_in(self, job: SharedTransaction, key: str, iterator: Iterator[pa.RecordBatch],
                  log: Log | None = None) -> TxlogCommitMessage:
        """Join ``job`` as participant ``key``, send everything, prepare (through ``log``
        if the task opened one already)."""
        log = _open(self.options) if log is None else log
        config = self._producer_config()
        # A failure leaves this attempt's transaction open on purpose: aborting it here
        # would decide the whole job's shared transaction.  It is not a member, so
        # whoever ends the job aborts it (SharedTransaction.end_orphans).  Closing lets a
        # data object written behind finish within the task, not under the next task of
        # a reused Python worker; the lease is kept until then.
        with ExitStack() as held:
            def join() -> Producer:
                held.enter_context(job.keep_alive(log))
                producer = job.join(log, key, **config)
                held.callback(producer.close)
                return producer

            producer, records = self._send_all(log.services, join, iterator, config)
            member = producer.prepare_transaction()
        return TxlogCommitMessage(member, records)

    def _send_all(self, root: Root, start: Callable[[], Producer],
                  iterator: Iterator[pa.RecordBatch], config: dict[str, Any]
                  ) -> tuple[Producer, int]:
        """The producer ``start`` returns (made with ``config``), once it has sent every
        batch, and their records.

        ``start`` runs on the sending thread while this one takes Spark's first
        batches: a join is a few durable steps (the lease, the job's index, the
        InitProducerId), and Spark's first batch of a streaming micro-batch
        arrives only after the source's task has started and read (tens of
        milliseconds).  Nothing is sent before ``start`` has returned: the
        thread runs in order, and each send takes the producer from it.
        """
        def send(batch: pa.Table) -> None:
            producer = started.result()
            for topic, table in self._by_topic(root, batch):
                # Staged until a data object's worth has gathered (prepare/close write the
                # rest), on every store: a task's sends are pieces of one stream that only
                # its prepare hands over, and nothing reads their offsets, so none waits
                # (waiting, each piece would be a data object of its own).
                producer.send_table(topic, table, wait=False)

        # The producer encodes one merged batch in a thread while this one takes the
        # next from Spark, and writes each full data object behind on a thread of its
        # own (protocol.md 1.1): the three wait on different things (the JVM's
        # socket, the CPU, the disk or store); at most two batches are held here.
        batch_size = store_defaults(root.storage, config.get("batch_size")).batch_size
        records = 0
        with ThreadPoolExecutor(1, thread_name_prefix="txlog-send") as sender:
            started = sender.submit(start)
            sending: Future[None] | None = None
            for batch in _coalesced(iterator, COALESCE_BATCHES * batch_size):
                if sending is not None:
                    sending.result()  # a failed send (or start) stops the task here
                elif started.done():
                    started.result()
                sending = sender.submit(send, batch)
                records += batch.num_rows
            if sending is not None:
                sending.result()
        return started.result(), records

    def _by_topic(self, root: Root, batch: pa.Table) -> Iterator[tuple[str, pa.Table]]:
        table = _records(batch)
        if self.options.max_request_size is not None:
            _check_record_sizes(table, self.options.max_request_size)
        topic = self.options.topic
        if topic is not None or "topic" not in batch.schema.names:
            yield topic, table  # type: ignore[misc]
            return
        topics = batch.column("topic")
        if topics.null_count:
            raise InvalidConfigError(
                "column 'topic' holds null for some rows and option 'topic' is not set: every "
                "row needs a topic")
        for name in pc.unique(topics).to_pylist():
            _ensure_topic(root, self.options, name)
            yield name, table.filter(pc.equal(topics, name))



class TxlogBatchWriter(_Sending, DataSourceArrowWriter):
    """One shared transaction per job: every task attempt joins it, the driver decides.

    With ``txnAppId``/``txnVersion`` the job is one numbered write of an app
    (``exactly_once.app_versions``): a version already committed makes the
    whole job a no-op (``job`` is None and ``skip`` set), checked on the
    driver before any task runs and again in the commit.
    """

    def __init__(self, options: WriteOptions, job: SharedTransaction | None,
                 app: AppVersions | None = None, skip: bool = False,
                 lease: PoolLease | None = None) -> None:
        self.options = options
        self.job = job
        self.app = app
        self.skip = skip
        self.lease = lease  # the pooled prefix the job holds, given no prefix of its own

    @classmethod
    def create(cls, options: WriteOptions, schema: StructType,
               overwrite: bool) -> TxlogBatchWriter:
        if overwrite:
            raise InvalidConfigError(
                "txlog does not support save mode 'overwrite': a log is append-only; use "
                "mode('append')")
        opened = _check_write(options, schema)
        if options.txn_app_id is not None:
            # Both set by WriteOptions.parse, with the prefix derived from the app id.
            assert options.txn_version is not None and options.transactional_id_prefix
            app = AppVersions(options.txn_app_id, options.transactional_id_prefix,
                              options.transaction_timeout_ms)
            log = opened or _open(options)
            job = app.start(log, options.txn_version)
            return cls(options, _described(job, log, options), app, skip=job is None)
        if options.delivery_guarantee != EXACTLY_ONCE:
            return cls(options, None)
        log = opened or _open(options)
        if options.transactional_id_prefix is not None:  # the prefix's owner, one job at a time
            job = SharedTransaction.start(log, options.transactional_id_prefix,
                                          options.transaction_timeout_ms)
            return cls(options, _described(job, log, options))
        job, lease = start_pooled_job(log, pool_base(options.topic),
                                      options.transactional_id_pool_size,
                                      options.transaction_timeout_ms)
        return cls(options, _described(job, log, options), lease=lease)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TxlogCommitMessage:
        from pyspark import TaskContext

        if self.skip:
            for _ in iterator:  # Spark's batches still have to be taken off its socket
                pass
            return TxlogCommitMessage(None, 0)
        if self.job is None:
            return self._write_idempotent(iterator)
        ctx = TaskContext.get()
        # One transactional id per live attempt of the job, the same ones in every job
        # of the prefix: fencing or aborting one attempt never touches another, and
        # the ids stay as many as the job's attempts (protocol.md 5.4).  PySpark does
        # not give the stage attempt: should a stage re-attempt's task meet a zombie of
        # the attempt before on its id, it fences it, which aborts the job (it fails;
        # nothing is committed), as a stream writer's batch does.
        key = attempt_key(ctx.partitionId(), ctx.attemptNumber()) if ctx else uuid.uuid4().hex
        return self._write_in(self.job, key, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.job is None:
            return
        log = _open(self.options)
        with self._releasing(log):
            if self.app is not None:
                assert self.options.txn_version is not None
                self.app.commit(log, self.job, self.options.txn_version, _members(messages))
            else:
                self.job.commit(log, _members(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.job is not None:
            log = _open(self.options)
            with self._releasing(log):
                self.job.abort(log, _members(messages))

    @contextmanager
    def _releasing(self, log: Log) -> Iterator[None]:
        """Free the pooled prefix once the job has ended.  A commit that raised frees it
        too: Spark then aborts, which finds the decision standing, and a driver that dies
        first leaves the slot to be taken once the job's timeout has passed."""
        try:
            yield
        finally:
            if self.lease is not None and self.job is not None and \
                    log.services.coordinator.decision(self.job.decision_id) is not None:
                self.lease.release(log.services)


class TxlogStreamWriter(_Sending, DataSourceStreamArrowWriter):
    """One shared transaction per micro-batch, recorded with its batch id (exactly_once.stream_sink).

    Spark builds this object anew on the driver for every micro-batch (the
    copy its tasks get) and again for the batch's commit or abort, so the
    constructor only claims the prefix for the query (its id read from the
    checkpoint) and picks a fresh decision id; the commit fences earlier runs
    of the sink, learns the decision its tasks joined from their messages,
    and the abort ends every open attempt of the prefix (StreamSink.abort_batch).
    """

    def __init__(self, options: WriteOptions, sink: StreamSink | None,
                 job: SharedTransaction | None, claimed: bool = False) -> None:
        self.options = options
        self.sink = sink
        self.job = job
        # Whether this object claimed the prefix as it was built, in this process: Spark
        # builds the commit's writer and calls its commit in one call of one Python
        # process, so that claim is the commit's ownership check (protocol.md 5.1).  A
        # copy unpickled elsewhere has claimed nothing.
        self.claimed = claimed

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "claimed": False}

    @classmethod
    def create(cls, options: WriteOptions, schema: StructType,
               overwrite: bool) -> TxlogStreamWriter:
        if overwrite:
            raise InvalidConfigError(
                "the txlog sink takes outputMode 'append' (or 'update' where it only appends); "
                "'complete' would rewrite the whole result each trigger and a log is "
                "append-only")
        opened = _check_write(options, schema)
        if options.delivery_guarantee != EXACTLY_ONCE:
            return cls(options, None, None)
        # Required by WriteOptions.parse for an exactly_once stream write.
        assert options.checkpoint_location is not None
        log = opened or _open(options)
        query = query_id(options.checkpoint_location)
        sink = StreamSink(options.transactional_id_prefix or query_prefix(query),
                          options.transaction_timeout_ms, query, options.take_over_from)
        # Refused here, before any task writes, if another query owns the prefix.  The
        # fence of earlier runs is the commit's (commit_batch initialises the sink
        # member before it checks the batch): Spark builds this writer twice per
        # micro-batch, and a fence here cost each build an InitProducerId.
        sink.claim(log)
        # No descriptions travel with a micro-batch: Spark builds this writer twice per
        # micro-batch (for the tasks, then for the commit), so reading them here would
        # cost the driver's critical path two reads for the tasks' one (protocol.md 5).
        return cls(options, sink, sink.begin_batch(), claimed=True)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TxlogCommitMessage:
        from pyspark import TaskContext

        if self.sink is None or self.job is None:
            return self._write_idempotent(iterator)
        ctx = TaskContext.get()
        batch_id = _batch_id(ctx)
        assert ctx is not None  # _batch_id refuses a task without one
        log = _open(self.options)
        if self.sink.is_committed(log, batch_id):
            # A replay of a batch whose commit stands: its records are in the log.
            for _ in iterator:  # Spark's batches still have to be taken off its socket
                pass
            return TxlogCommitMessage(None, 0)
        # Ids are re-used from batch to batch (a new batch's init_transactions
        # finishes the last one's), so their number stays bounded in a long query.
        # Should two live attempts ever share one (a stage re-attempt restarting
        # attempt numbers), the second fences the first, which aborts the batch:
        # the query fails and its replay writes the batch once.
        key = f"{ctx.partitionId()}-{ctx.attemptNumber()}"
        return self._write_in(self.job, key, iterator, log)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.sink is None or self.job is None:
            return
        log = _open(self.options)
        members = _members(messages)
        # This writer was built for the commit: its own decision is used only when no
        # task wrote (every task found the batch committed, or there were none).
        job = SharedTransaction(self.sink.prefix, members[0].decision_id,
                                self.sink.timeout_ms) if members else self.job
        groups = None
        if self.options.group_id is not None:
            assert self.options.checkpoint_location is not None  # WriteOptions.parse
            groups = {self.options.group_id:
                      source_offsets(self.options.checkpoint_location, batchId)}
        self.sink.commit_batch(log, job, batchId, members, groups, claimed=self.claimed)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.sink is None:
            return
        members = _members(messages)
        job = SharedTransaction(self.sink.prefix, members[0].decision_id,
                                self.sink.timeout_ms) if members else None
        self.sink.abort_batch(_open(self.options), job, members)


def _batch_id(ctx: TaskContext | None) -> int:
    raw = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
    if raw is None:
        raise InvalidConfigError("a txlog stream write ran outside a streaming micro-batch "
                                 "(no streaming.sql.batchId in its task)")
    return int(raw)


def _check_write(options: WriteOptions, schema: StructType) -> Log | None:
    """What batch and stream writes are refused for alike, checked on the driver before
    any task runs (each refuses its own kind of overwrite first).  Returns the ``Log``
    it opened to check the topic, for the caller to go on with: each opening
    revalidates the root, a request on an object store."""
    check_input_schema(schema, options)
    if options.topic is None:
        return None
    log = _open(options)
    _ensure_topic(log.services, options, options.topic)
    return log


def _coalesced(batches: Iterator[pa.RecordBatch], target_bytes: int) -> Iterator[pa.Table]:
    """Spark's batches gathered up to ``target_bytes``, or one batch where it is larger.

    Spark hands the writer batches of maxRecordsPerBatch rows (10,000 by
    default, ~1 MB of 100-byte records); spread over a topic's partitions
    that makes small log batches.  Sending a few at once lets each
    partition's batch approach ``batch.size``.  The gathering stops short of
    the target rather than past it: a partition's share past ``batch.size``
    is cut into a full batch and a small one, and each batch encoded costs
    a fixed time besides its bytes.  They stay separate chunks of one table:
    the producer's grouping by partition copies the rows anyway, so
    concatenating them first was a copy of its own.  Memory stays bounded by
    the target, or by one batch where a batch is larger.
    """
    held: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        if held and size + batch.nbytes > target_bytes:
            yield pa.Table.from_batches(held)
            held, size = [], 0
        held.append(batch)
        size += batch.nbytes
    if held:
        yield pa.Table.from_batches(held)


def _records(batch: pa.Table) -> pa.Table:
    """The producer's columns from Spark's: text as bytes, nothing per record in Python.

    A ``timestamp`` column is each record's CreateTime: Spark's microseconds become
    epoch milliseconds (the sub-millisecond part dropped, as Kafka keeps ms); a null
    is the time of the write, Kafka's rule for a record sent without one.
    """
    columns, names = [], []
    for name in ("key", "value", "partition", "headers", "timestamp"):
        if name not in batch.schema.names:
            continue
        column = batch.column(name)
        if name in ("key", "value") and column.type in _TEXT and column.type != pa.binary():
            column = column.cast(pa.binary())
        if name == "timestamp":
            column = _create_times(column)
        columns.append(column)
        names.append(name)
    return pa.Table.from_arrays(columns, names=names)


def _check_record_sizes(table: pa.Table, limit: int) -> None:
    """Kafka's producer refuses a record larger than max.request.size
    (RecordTooLargeException); so does this writer, counting key, value and header bytes."""
    def lengths(column: pa.ChunkedArray) -> pa.ChunkedArray:
        return pc.fill_null(pc.binary_length(column), 0).cast(pa.int64())

    sizes = lengths(table.column("value"))
    if "key" in table.column_names:
        sizes = pc.add(sizes, lengths(table.column("key")))
    if "headers" in table.column_names:
        flat = pc.list_flatten(table.column("headers"))
        per_header = pc.add(lengths(pc.struct_field(flat, [0])), lengths(pc.struct_field(flat, [1])))
        parents = pc.list_parent_indices(table.column("headers"))
        summed = pa.table({"row": parents, "bytes": per_header}).group_by("row").aggregate(
            [("bytes", "sum")])
        extra = np.zeros(table.num_rows, dtype=np.int64)
        extra[summed.column("row").to_numpy()] = summed.column("bytes_sum").to_numpy()
        sizes = pc.add(sizes, pa.array(extra))
    largest = pc.max(sizes).as_py()
    if largest is not None and largest > limit:
        raise InvalidConfigError(
            f"a record of {largest} bytes (key, value and headers) is larger than "
            f"kafka.max.request.size ({limit}); Kafka's producer refuses it too "
            f"(RecordTooLargeException): raise the option or split the record")


def _create_times(column: pa.Array) -> pa.Array:
    """Epoch milliseconds; a time before 1970 fails the task, naming the batch's earliest
    (a Kafka timestamp is non-negative, and -1 means 'none' to its readers)."""
    ticks = column.cast(pa.int64())  # in the column's unit; the sign is what matters
    lowest = pc.min(ticks).as_py()
    if lowest is not None and lowest < 0:
        raise InvalidConfigError(
            f"column 'timestamp' holds {column[pc.index(ticks, lowest).as_py()]}, before "
            f"1970-01-01 00:00:00 UTC: a record's CreateTime is milliseconds since the epoch "
            f"and cannot be negative; filter such rows out or set them to null (the time of "
            f"the write)")
    millis = column.cast(pa.timestamp("ms", tz=column.type.tz), safe=False).cast(pa.int64())
    return millis


def _members(messages: list[WriterCommitMessage | None]) -> list[TransactionMember]:
    return [m.member for m in messages
            if isinstance(m, TxlogCommitMessage) and m.member is not None]


def _described(job: SharedTransaction | None, log: Log,
               options: WriteOptions) -> SharedTransaction | None:
    """``job`` carrying its topic's description to the tasks, read once here on the driver
    (with a ``topic`` column instead, each task describes the topics its rows name)."""
    return job if job is None or options.topic is None else job.describing(log, [options.topic])


def pool_base(topic: str | None) -> str:
    """The base of the prefix pool of jobs that name no prefix: one per topic (with a
    ``topic`` column, one for all such jobs), so a topic's concurrent jobs share it."""
    if topic is None:
        return "spark"
    # A topic name may be longer than a prefix may (MAX_PREFIX_LENGTH): such a one is hashed.
    return f"spark-{topic}" if len(topic) <= 120 else \
        f"spark-{hashlib.sha256(topic.encode()).hexdigest()[:32]}"


def _open(options: WriteOptions) -> Log:
    return worker_log(options.path, options.storage_options, create=bool(options.create_topics))


def _ensure_topic(root: Root, options: WriteOptions, topic: str) -> None:
    """A missing topic is created as the root's auto.create.topics.enable says, unless the
    query's createTopics, when given, says otherwise."""
    override = None if options.create_topics is None else ("createTopics",
                                                           options.create_topics)
    root.ensure_topic(topic, override, options.num_partitions)
