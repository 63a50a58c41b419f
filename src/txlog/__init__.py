"""txlog: a Kafka-style transactional log on plain storage."""

from .clients.consumer import Consumer, ConsumerRecord, OffsetAndTimestamp
from .errors import (ConcurrentTransactionsError, CorruptBatchError, DecisionConflictError,
                     IllegalStateError, InconsistentTopicIdError, InvalidConfigError,
                     InvalidNameError, InvalidProducerEpochError, InvalidTransactionTimeoutError,
                     InvalidTxnStateError, LogFormatError, OffsetOutOfRangeError,
                     OutOfOrderSequenceError, ProducerFencedError, StorageError, TopicExistsError,
                     TransactionAbortedError, TxlogError, UnknownPartitionError, UnknownTopicError,
                     UnsupportedStorageError)
from .log import Log, TopicDescription
from .spark.planning import READ_COMMITTED, READ_UNCOMMITTED
from .clients.producer import FutureRecordMetadata, Producer, RecordMetadata, SentBatch

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
]
