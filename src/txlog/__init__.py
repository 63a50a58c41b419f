"""txlog: a Kafka-style transactional log on plain storage."""

from .consumer import Consumer, ConsumerRecord, OffsetAndTimestamp
from .errors import (CommittedButIncompleteError, ConcurrentTransactionsError, CorruptBatchError,
                     DecisionConflictError, SinkOwnerError,
                     IllegalStateError, InconsistentTopicIdError, InvalidConfigError,
                     InvalidNameError, InvalidProducerEpochError, InvalidTransactionTimeoutError,
                     InvalidTxnStateError, LogFormatError,
                     OffsetOutOfRangeError, OutOfOrderSequenceError, ProducerFencedError,
                     StorageError, TopicExistsError, TransactionAbortedError, TxlogError,
                     UnknownPartitionError, UnknownTopicError, UnsupportedStorageError)
from .log import Log, TopicDescription
from .scan import READ_COMMITTED, READ_UNCOMMITTED
from .producer import FutureRecordMetadata, Producer, RecordMetadata, SentBatch

__version__ = "0.1.0"

__all__ = [
    "Log", "TopicDescription", "Producer", "Consumer", "ConsumerRecord", "RecordMetadata",
    "FutureRecordMetadata", "SentBatch", "OffsetAndTimestamp", "READ_COMMITTED", "READ_UNCOMMITTED",
    "TxlogError", "InvalidNameError", "InvalidConfigError", "TopicExistsError",
    "UnknownTopicError", "UnknownPartitionError", "OffsetOutOfRangeError", "LogFormatError",
    "CorruptBatchError", "StorageError", "UnsupportedStorageError", "OutOfOrderSequenceError",
    "InvalidProducerEpochError", "ProducerFencedError", "InvalidTxnStateError",
    "InvalidTransactionTimeoutError", "TransactionAbortedError", "ConcurrentTransactionsError",
    "IllegalStateError", "DecisionConflictError", "InconsistentTopicIdError",
    "SinkOwnerError", "CommittedButIncompleteError",
]
