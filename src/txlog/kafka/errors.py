"""kafka-python's error names (``kafka.errors``), raised by ``txlog.kafka``.

A ported program catches ``KafkaTimeoutError``, ``CommitFailedError``,
``ProducerFencedError`` and the like by kafka-python's names.  Each class here
that has a txlog counterpart also derives from it, so code written against
the native API (``except txlog.ProducerFencedError``) keeps working when it
is handed an error from this layer.  ``translated`` turns the native errors
raised underneath into these at the layer's boundary, keeping the original as
``__cause__`` and the message unchanged (it names the topic, partition,
offset or option at fault).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

from .. import errors as native


class KafkaError(Exception):
    """Base of every error this layer raises (kafka-python's root class)."""

    retriable = False
    invalid_metadata = False


class RetriableError(KafkaError):
    retriable = True


class InvalidMetadataError(RetriableError):
    invalid_metadata = True


class BrokerResponseError(KafkaError):
    """Kafka's errors that carry an error code; here the storage answered instead."""

    errno: int | None = None


class IllegalArgumentError(KafkaError):
    pass


class IllegalStateError(KafkaError, native.IllegalStateError):
    pass


class KafkaConfigurationError(KafkaError, native.InvalidConfigError):
    """A configuration key or value this layer cannot accept; the message names it."""


class KafkaConnectionError(InvalidMetadataError):
    pass


class KafkaTimeoutError(RetriableError):
    pass


class NoOffsetForPartitionError(KafkaError):
    pass


class CommitFailedError(KafkaError):
    """A commit was refused: the group's generation moved on (another member owns it)."""

    def __init__(self, *args: Any) -> None:
        if not args:
            args = ("Commit cannot be completed since the group has already rebalanced and "
                    "assigned the partitions to another member.",)
        super().__init__(*args)


class TransactionAbortedError(KafkaError, native.TransactionAbortedError):
    pass


class NoError(BrokerResponseError):
    """errno 0: the admin client's per-partition results name it where nothing failed."""

    errno = 0


class OffsetOutOfRangeError(BrokerResponseError, native.OffsetOutOfRangeError):
    errno = 1


class CorruptRecordError(BrokerResponseError):
    errno = 2


class UnknownTopicOrPartitionError(InvalidMetadataError, BrokerResponseError,
                                   native.UnknownTopicError, native.UnknownPartitionError):
    errno = 3

    def __str__(self) -> str:  # not KeyError's quoting
        return str(self.args[0]) if self.args else ""


class MessageSizeTooLargeError(BrokerResponseError):
    errno = 10


class InvalidTopicError(BrokerResponseError, native.InvalidNameError):
    errno = 17


class IllegalGenerationError(BrokerResponseError):
    errno = 22


class InvalidGroupIdError(BrokerResponseError):
    errno = 24


class UnknownMemberIdError(BrokerResponseError):
    errno = 25


class RebalanceInProgressError(BrokerResponseError):
    errno = 27


class UnsupportedVersionError(BrokerResponseError):
    errno = 35


class TopicAlreadyExistsError(BrokerResponseError, native.TopicExistsError):
    errno = 36


class InvalidPartitionsError(BrokerResponseError):
    errno = 37


class InvalidReplicationFactorError(BrokerResponseError):
    errno = 38


class InvalidConfigurationError(BrokerResponseError):
    errno = 40


class InvalidRequestError(BrokerResponseError):
    errno = 42


class OutOfOrderSequenceNumberError(BrokerResponseError, native.OutOfOrderSequenceError):
    errno = 45


class InvalidProducerEpochError(BrokerResponseError, native.InvalidProducerEpochError):
    errno = 47


class InvalidTxnStateError(BrokerResponseError, native.InvalidTxnStateError):
    errno = 48


class InvalidProducerIdMappingError(BrokerResponseError, native.InvalidPidMappingError):
    """The transactional id expired while the producer held it: abort the transaction."""

    errno = 49


class InvalidTransactionTimeoutError(BrokerResponseError, native.InvalidTransactionTimeoutError):
    errno = 50


class ConcurrentTransactionsError(RetriableError, BrokerResponseError,
                                  native.ConcurrentTransactionsError):
    errno = 51


class KafkaStorageError(InvalidMetadataError, BrokerResponseError, native.StorageError):
    """The log's storage failed (Kafka's broker disk error); the request may be retried."""

    errno = 56


class NonEmptyGroupError(BrokerResponseError, native.GroupNotEmptyError):
    errno = 68


class GroupIdNotFoundError(BrokerResponseError, native.UnknownGroupError):
    errno = 69


class ProducerFencedError(BrokerResponseError, native.ProducerFencedError):
    """A newer instance with the same transactional_id took over this producer."""

    errno = 90


class InconsistentTopicIdError(InvalidMetadataError, BrokerResponseError,
                               native.InconsistentTopicIdError):
    errno = 103


class TransactionalIdNotFoundError(BrokerResponseError):
    errno = 105


# Native class name -> the class raised instead.  Matched along the native
# error's MRO, most specific first, by name: a native class defined later
# (group membership's CommitFailedError, IllegalGenerationError, ...) maps
# onto its Kafka name here without this module importing it.
_BY_NATIVE_NAME: dict[str, type[KafkaError]] = {
    "ProducerFencedError": ProducerFencedError,
    "InvalidProducerEpochError": InvalidProducerEpochError,
    "OutOfOrderSequenceError": OutOfOrderSequenceNumberError,
    "DecisionConflictError": TransactionAbortedError,
    "InvalidPidMappingError": InvalidProducerIdMappingError,
    "InvalidTxnStateError": InvalidTxnStateError,
    "TransactionAbortedError": TransactionAbortedError,
    "CommittedButIncompleteError": KafkaError,
    "ConcurrentTransactionsError": ConcurrentTransactionsError,
    "InvalidTransactionTimeoutError": InvalidTransactionTimeoutError,
    "InvalidConfigError": KafkaConfigurationError,
    "InvalidNameError": InvalidTopicError,
    "TopicExistsError": TopicAlreadyExistsError,
    "UnknownTopicError": UnknownTopicOrPartitionError,
    "UnknownPartitionError": UnknownTopicOrPartitionError,
    "UnknownGroupError": GroupIdNotFoundError,
    "GroupNotEmptyError": NonEmptyGroupError,
    "OffsetOutOfRangeError": OffsetOutOfRangeError,
    "CorruptBatchError": CorruptRecordError,
    "LogFormatError": UnsupportedVersionError,
    "UnsupportedStorageError": KafkaConfigurationError,
    "StorageError": KafkaStorageError,
    "InconsistentTopicIdError": InconsistentTopicIdError,
    "IllegalStateError": IllegalStateError,
    "CommitFailedError": CommitFailedError,
    "IllegalGenerationError": IllegalGenerationError,
    "UnknownMemberIdError": UnknownMemberIdError,
    "RebalanceInProgressError": RebalanceInProgressError,
    "TxlogError": KafkaError,
}


def kafka_error_for(exc: BaseException) -> KafkaError | None:
    """The Kafka-named error for a native one (same message and attributes), or None."""
    if isinstance(exc, KafkaError) or not isinstance(exc, native.TxlogError):
        return None
    for cls in type(exc).__mro__:
        target = _BY_NATIVE_NAME.get(cls.__name__)
        if target is not None:
            break
    else:
        return None
    new = target.__new__(target, *exc.args)
    new.args = exc.args
    new.__dict__.update(getattr(exc, "__dict__", {}))
    return new


@contextmanager
def translated() -> Iterator[None]:
    """Raise native txlog errors as their kafka-python names (the original is the cause)."""
    try:
        yield
    except native.TxlogError as exc:
        new = kafka_error_for(exc)
        if new is None:
            raise
        raise new from exc


P = ParamSpec("P")
R = TypeVar("R")


def translating(fn: Callable[P, R]) -> Callable[P, R]:
    """``translated`` around a whole method: the public methods of the layer use it."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with translated():
            return fn(*args, **kwargs)

    return wrapper
