"""Batch writes: every task attempt joins the job's shared transaction; the driver decides once.

Spark runs ``create`` (through ``DataSource.writer``) on the driver, pickles
the writer to every task, and calls ``commit`` or ``abort`` on a fresh
unpickled copy with the tasks' messages.  The rules (fresh decision id per
job, one transactional id per attempt, orphans and leftovers ended, the
lease) are the core's ``SharedTransaction``; this module maps Spark's calls
onto it and turns Spark's Arrow batches into the columns the producer takes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from ..coordinator import TransactionMember
from ..errors import InvalidConfigError, TopicExistsError, UnknownTopicError
from ..log import Log
from ..producer import Producer
from ..shared import SharedTransaction
from .options import WriteOptions

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
    if options.topic is None and "topic" not in names:
        raise InvalidConfigError(
            "no topic to write to: set option 'topic' or give the DataFrame a 'topic' column")


class TxlogBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions, job: SharedTransaction | None) -> None:
        self.options = options
        self.job = job

    @classmethod
    def create(cls, options: WriteOptions, schema: StructType,
               overwrite: bool) -> TxlogBatchWriter:
        if overwrite:
            raise InvalidConfigError(
                "txlog does not support save mode 'overwrite': a log is append-only; use "
                "mode('append')")
        check_input_schema(schema, options)
        log = _open(options)
        if options.topic is not None:
            _ensure_topic(log, options, options.topic)
        job = None
        if options.delivery_guarantee == EXACTLY_ONCE:
            prefix = options.transactional_id_prefix or f"spark-{uuid.uuid4().hex[:12]}"
            job = SharedTransaction.start(log, prefix, options.transaction_timeout_ms)
        return cls(options, job)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TxlogCommitMessage:
        from pyspark import TaskContext

        log = _open(self.options)
        config = {"compression": self.options.compression}
        if self.options.batch_size is not None:
            config["batch_size"] = self.options.batch_size
        if self.job is None:
            with log.producer(**config) as producer:
                records = self._send_all(log, producer, iterator)
            return TxlogCommitMessage(None, records)
        ctx = TaskContext.get()
        # One transactional id per attempt (taskAttemptId is unique in the
        # application): fencing or aborting one attempt never touches another.
        key = f"{ctx.partitionId()}-{ctx.taskAttemptId()}" if ctx else uuid.uuid4().hex
        with self.job.keep_alive(log):
            producer = self.job.join(log, key, **config)
            # A failure leaves this attempt's transaction open on purpose: aborting it
            # here would decide the whole job's shared transaction.  It is not a member,
            # so whoever ends the job aborts it (SharedTransaction.end_orphans).
            records = self._send_all(log, producer, iterator)
            member = producer.prepare_transaction()
        return TxlogCommitMessage(member, records)

    def _send_all(self, log: Log, producer: Producer, iterator: Iterator[pa.RecordBatch]) -> int:
        def send(batch: pa.RecordBatch) -> None:
            for topic, table in self._by_topic(log, batch):
                producer.send_table(topic, table)

        # The producer encodes and fsyncs one merged batch in a thread while this
        # one takes the next from Spark: the two mostly wait on different things
        # (the disk, the JVM's socket), and at most two batches are held.
        records = 0
        with ThreadPoolExecutor(1, thread_name_prefix="txlog-send") as sender:
            sending: Future[None] | None = None
            for batch in _coalesced(iterator, COALESCE_BATCHES * producer.batch_size):
                if sending is not None:
                    sending.result()  # a failed send stops the task here
                sending = sender.submit(send, batch)
                records += batch.num_rows
            if sending is not None:
                sending.result()
        return records

    def _by_topic(self, log: Log, batch: pa.RecordBatch) -> Iterator[tuple[str, pa.Table]]:
        table = _records(batch)
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
            _ensure_topic(log, self.options, name)
            yield name, table.filter(pc.equal(topics, name))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.job is not None:
            self.job.commit(_open(self.options), _members(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.job is not None:
            self.job.abort(_open(self.options), _members(messages))


def _coalesced(batches: Iterator[pa.RecordBatch], target_bytes: int
               ) -> Iterator[pa.RecordBatch]:
    """Spark's batches merged until they hold about ``target_bytes``.

    Spark hands the writer batches of maxRecordsPerBatch rows (10,000 by
    default, ~1 MB of 100-byte records); spread over a topic's partitions
    that makes small log batches, each a file and an fsync.  Merging a few
    first lets each partition's batch approach ``batch.size``.  Memory stays
    bounded by the target plus one batch.
    """
    held: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        held.append(batch)
        size += batch.nbytes
        if size >= target_bytes:
            yield pa.concat_batches(held)
            held, size = [], 0
    if held:
        yield pa.concat_batches(held)


def _records(batch: pa.RecordBatch) -> pa.Table:
    """The producer's columns from Spark's: text as bytes, nothing per record in Python."""
    columns, names = [], []
    for name in ("key", "value", "partition", "headers"):
        if name not in batch.schema.names:
            continue
        column = batch.column(name)
        if name in ("key", "value") and column.type in _TEXT and column.type != pa.binary():
            column = column.cast(pa.binary())
        columns.append(column)
        names.append(name)
    return pa.Table.from_arrays(columns, names=names)


def _members(messages: list[WriterCommitMessage | None]) -> list[TransactionMember]:
    return [m.member for m in messages
            if isinstance(m, TxlogCommitMessage) and m.member is not None]


def _open(options: WriteOptions) -> Log:
    return Log(options.path, create=options.create_topics)


def _ensure_topic(log: Log, options: WriteOptions, topic: str) -> None:
    if topic in log.topics():
        return
    if not options.create_topics:
        raise UnknownTopicError(
            f"topic {topic!r} does not exist in {log.root}; create it (txlog topics create) or "
            "set option createTopics=true (with numPartitions)")
    try:
        log.create_topic(topic, partitions=options.num_partitions)
    except TopicExistsError:
        pass  # another task created it first
