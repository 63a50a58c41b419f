"""kafka-python's client API on a txlog root: port a program by changing its imports.

``from txlog.kafka import KafkaProducer, KafkaConsumer, KafkaAdminClient,
TopicPartition`` in place of ``from kafka import ...`` (and the admin client's
``NewTopic``, ``ConfigResource``... in place of ``from kafka.admin import ...``),
and ``bootstrap_servers`` set to the log root (a path or URL).  Error classes are
in ``txlog.kafka.errors`` under kafka-python's names.  docs/clients.md says what
each configuration key and admin method means here and what differs from Kafka;
the native ``txlog.Log`` clients and the CLI's core operations do the work
underneath.
"""

from .admin import KafkaAdminClient
from .admin_types import (ConfigResource, ConfigResourceType, NewPartitions, NewTopic, OffsetSpec,
                          OffsetTimestamp)
from .consumer import KafkaConsumer
from .producer import FutureRecordMetadata, KafkaProducer
from .structs import (ConsumerGroupMetadata, ConsumerRebalanceListener, ConsumerRecord,
                      OffsetAndMetadata, OffsetAndTimestamp, RecordMetadata, TopicPartition)

__all__ = [
    "KafkaProducer", "KafkaConsumer", "FutureRecordMetadata", "TopicPartition",
    "OffsetAndMetadata", "OffsetAndTimestamp", "ConsumerRecord", "RecordMetadata",
    "ConsumerGroupMetadata", "ConsumerRebalanceListener",
    "KafkaAdminClient", "NewTopic", "NewPartitions", "ConfigResource", "ConfigResourceType",
    "OffsetSpec", "OffsetTimestamp",
]
