"""Exceptions raised by txlog.

Names follow Kafka's error codes where one exists, so that a Kafka user can map
an error to the behaviour they already know.
"""

from __future__ import annotations


class TxlogError(Exception):
    """Base class of every error txlog raises on purpose."""


class InvalidNameError(TxlogError, ValueError):
    """A topic, transactional id or group id breaks Kafka's naming rule."""


class InvalidConfigError(TxlogError, ValueError):
    """An option or configuration value is out of range or of the wrong type."""


class TopicExistsError(TxlogError):
    pass


class CommitFailedError(TxlogError):
    """An offset commit from a generation the group has left behind (Kafka's
    CommitFailedException / ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID).

    The member was removed (session timeout, max.poll.interval.ms) or a
    rebalance moved the group on: its partitions may belong to another
    member now, so committing could move their offsets back or, for a
    transactional commit, write a zombie's output twice.  Poll again to
    rejoin; a transaction that got this must be aborted.
    """


class InconsistentGroupProtocolError(TxlogError):
    """A member supports no partition assignor that every other member supports
    (Kafka's INCONSISTENT_GROUP_PROTOCOL)."""


class GroupNotEmptyError(TxlogError):
    """The group has live members, so its offsets cannot be reset (Kafka's
    kafka-consumer-groups refuses unless the group is inactive)."""


class UnknownGroupError(TxlogError):
    """The group has never committed offsets, or was deleted (Kafka's GroupIdNotFound)."""


class UnknownTopicError(TxlogError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownPartitionError(TxlogError, ValueError):
    pass


class OffsetOutOfRangeError(TxlogError, ValueError):
    pass


class LogFormatError(TxlogError):
    """The log root holds a format this version cannot read."""


class CorruptBatchError(TxlogError):
    """A batch failed its checksum or structural checks.

    Carries the file and the offset so an operator can find the damage; the
    batch is never skipped silently.
    """

    def __init__(self, message: str, path: str, offset: int | None) -> None:
        super().__init__(f"{message} (file {path}, offset {offset})")
        self.reason = message
        self.path = path
        self.offset = offset


class StorageError(TxlogError):
    pass


class UnsupportedStorageError(StorageError):
    """The backend cannot create objects exclusively, so it cannot hold a log."""


# --- producer-state validation (Kafka's produce errors) -------------------


class OutOfOrderSequenceError(TxlogError):
    """A batch's first sequence is not the producer's last sequence + 1."""


class InvalidProducerEpochError(TxlogError):
    """A batch carries an epoch older than the one the partition knows."""


class ProducerFencedError(InvalidProducerEpochError):
    """A newer instance with the same transactional id took over this producer."""


class InvalidTxnStateError(TxlogError):
    """An operation or a state transition that the transaction state forbids."""


class InvalidPidMappingError(InvalidTxnStateError):
    """The transactional id expired (idle past transactional.id.expiration.ms) while this
    producer still held it: Kafka's INVALID_PRODUCER_ID_MAPPING.

    Abortable, as in Kafka's producer since KIP-360: ``abort_transaction()`` starts
    the id again under a new producer id, unless another instance took it first
    (then the producer is fenced).  A subclass of InvalidTxnStateError, which
    callers caught before it existed.
    """


class InvalidTransactionTimeoutError(InvalidConfigError):
    pass


class TransactionAbortedError(TxlogError):
    """The transaction was aborted (for instance by a timeout) before it committed."""


class DecisionConflictError(InvalidTxnStateError, TransactionAbortedError):
    """A shared transaction's standing decision does not commit every member handed in.

    Raised by a COMMIT request that met an earlier decision (an ABORT, or a
    COMMIT with other members): those members' records are aborted, and the
    caller must not believe otherwise.  ``not_committed`` names their
    transactional ids.
    """

    def __init__(self, message: str, decision_id: str, not_committed: list[str]) -> None:
        super().__init__(message)
        self.decision_id = decision_id
        self.not_committed = not_committed


class InconsistentTopicIdError(TxlogError):
    """Something derived from one incarnation of a topic met another (Kafka's KIP-516).

    The topic was deleted and re-created since this process (or a planned
    read) learnt about it; nothing cached from the old incarnation is applied
    to the new one.
    """


class ValueSchemaChangedError(TxlogError):
    """A topic's value schema changed in a way its table cannot follow: only added fields
    change a table's schema (docs/tables.md, "Typed values")."""


class ConcurrentTransactionsError(TxlogError):
    """Another process changed the transaction at the same moment; retry."""


class IllegalStateError(TxlogError):
    """A client object was used in a state where the call makes no sense."""


class SinkOwnerError(TxlogError):
    """A stream sink's prefix belongs to another query (a Kafka producer would be fenced).

    Two queries writing under one ``transactional.id.prefix`` would read each
    other's committed batch ids as their own and skip batches; the sink
    refuses instead, before anything is written.  ``owner`` is the query that
    owns the prefix, ``query`` the one refused.
    """

    def __init__(self, message: str, prefix: str, owner: str, query: str) -> None:
        super().__init__(message)
        self.prefix = prefix
        self.owner = owner
        self.query = query


class CommittedButIncompleteError(TxlogError):
    """A transaction's COMMIT decision stands but rolling it forward kept failing.

    The records are committed: readers see them as soon as any process
    completes the transaction (a reader, a producer, ``txlog transactions
    abort-expired``, the next job).  Writing them again would duplicate them.
    """

    def __init__(self, message: str, decision_id: str) -> None:
        super().__init__(message)
        self.decision_id = decision_id
