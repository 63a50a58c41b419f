"""txlog: a Kafka-style transactional log on plain storage.

The public API: users import from here, or from the subpackage that owns a
name (docs/architecture.md shows the layers).  Each name is imported when it
is first used (PEP 562): importing any txlog module runs this file first, and
a Python process that Spark starts for a query needs only some of the modules
below (their imports cost it about 0.3 s, benchmarks/README.md).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .api.log import Log
    from .clients.accumulator import FutureRecordMetadata, RecordMetadata
    from .clients.consumer import Consumer, ConsumerRecord, OffsetAndTimestamp
    from .clients.producer import Producer, SentBatch
    from .errors import (CommitFailedError, CommittedButIncompleteError,
                         ConcurrentTransactionsError, CorruptBatchError, DecisionConflictError,
                         GroupNotEmptyError, IllegalStateError, InconsistentGroupProtocolError,
                         InconsistentTopicIdError, InvalidConfigError, InvalidNameError,
                         InvalidPidMappingError, InvalidProducerEpochError,
                         InvalidTransactionTimeoutError, InvalidTxnStateError, LogFormatError,
                         OffsetOutOfRangeError, OutOfOrderSequenceError, ProducerFencedError,
                         SinkOwnerError, StorageError, TopicExistsError, TransactionAbortedError,
                         TxlogError, UnknownPartitionError, UnknownTopicError,
                         UnsupportedStorageError)
    from .exactly_once.shared_transaction import SharedTransaction
    from .exactly_once.stream_sink import StreamSink
    from .partition.isolation import READ_COMMITTED, READ_UNCOMMITTED
    from .root.topics import TopicDescription

__version__ = "0.1.0"

# Where each name of __all__ is defined.
_HOMES = {
    "Log": ".api.log", "TopicDescription": ".root.topics", "Producer": ".clients.producer",
    "Consumer": ".clients.consumer", "ConsumerRecord": ".clients.consumer",
    "RecordMetadata": ".clients.accumulator", "FutureRecordMetadata": ".clients.accumulator",
    "SentBatch": ".clients.producer", "OffsetAndTimestamp": ".clients.consumer",
    "SharedTransaction": ".exactly_once.shared_transaction",
    "StreamSink": ".exactly_once.stream_sink",
    "READ_COMMITTED": ".partition.isolation", "READ_UNCOMMITTED": ".partition.isolation",
    **dict.fromkeys((
        "TxlogError", "InvalidNameError", "InvalidConfigError", "TopicExistsError",
        "UnknownTopicError", "UnknownPartitionError", "OffsetOutOfRangeError", "LogFormatError",
        "CorruptBatchError", "StorageError", "UnsupportedStorageError",
        "OutOfOrderSequenceError", "InvalidProducerEpochError", "ProducerFencedError",
        "InvalidTxnStateError", "InvalidPidMappingError", "InvalidTransactionTimeoutError",
        "TransactionAbortedError", "ConcurrentTransactionsError", "IllegalStateError",
        "DecisionConflictError", "InconsistentTopicIdError", "SinkOwnerError",
        "CommittedButIncompleteError", "CommitFailedError", "GroupNotEmptyError",
        "InconsistentGroupProtocolError"), ".errors"),
}

__all__ = [
    "Log", "TopicDescription", "Producer", "Consumer", "ConsumerRecord", "RecordMetadata",
    "FutureRecordMetadata", "SentBatch", "OffsetAndTimestamp", "SharedTransaction", "StreamSink",
    "READ_COMMITTED", "READ_UNCOMMITTED",
    "TxlogError", "InvalidNameError", "InvalidConfigError", "TopicExistsError",
    "UnknownTopicError", "UnknownPartitionError", "OffsetOutOfRangeError", "LogFormatError",
    "CorruptBatchError", "StorageError", "UnsupportedStorageError", "OutOfOrderSequenceError",
    "InvalidProducerEpochError", "ProducerFencedError", "InvalidTxnStateError", "InvalidPidMappingError",
    "InvalidTransactionTimeoutError", "TransactionAbortedError", "ConcurrentTransactionsError",
    "IllegalStateError", "DecisionConflictError", "InconsistentTopicIdError",
    "SinkOwnerError", "CommittedButIncompleteError",
    "CommitFailedError", "GroupNotEmptyError", "InconsistentGroupProtocolError",
]


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'txlog' has no attribute {name!r}")
    value = getattr(import_module(home, __name__), name)
    globals()[name] = value  # found here from now on, without this call
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
