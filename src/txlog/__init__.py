"""txlog: a Kafka-style transactional log on plain storage.

The public API: users import from here, or from the subpackage that owns a
name (docs/architecture.md shows the layers).
"""

from .clients.consumer import Consumer, ConsumerRecord, OffsetAndTimestamp
from .clients.accumulator import FutureRecordMetadata, RecordMetadata
from .clients.producer import Producer, SentBatch
from .errors import (CommitFailedError, CommittedButIncompleteError, ConcurrentTransactionsError,
                     CorruptBatchError, DecisionConflictError, SinkOwnerError,
                     IllegalStateError, InconsistentTopicIdError, InvalidConfigError,
                     InvalidNameError, InvalidPidMappingError, InvalidProducerEpochError,
                     InvalidTransactionTimeoutError,
                     InvalidTxnStateError, LogFormatError, OffsetOutOfRangeError,
                     OutOfOrderSequenceError, ProducerFencedError, StorageError, TopicExistsError,
                     TransactionAbortedError, TxlogError, UnknownPartitionError, UnknownTopicError,
                     UnsupportedStorageError)
from .errors import GroupNotEmptyError, InconsistentGroupProtocolError
from .exactly_once.shared_transaction import SharedTransaction
from .exactly_once.stream_sink import StreamSink
from .api.log import Log
from .root.topics import TopicDescription
from .partition.isolation import READ_COMMITTED, READ_UNCOMMITTED

__version__ = "0.1.0"

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
