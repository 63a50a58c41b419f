"""A kafka-python program that administers its own topic and group, as published programs do.

Written against kafka-python 3.0 (``from kafka import ...``): it creates its topic with
``KafkaAdminClient``, produces, consumes in a group and commits, lists and describes the
group's offsets, and deletes the consumed records.  tests/kafka/test_ported_programs.py
runs it with ``from kafka`` replaced by ``from txlog.kafka`` and a txlog root as the
bootstrap servers, nothing else changed.

    kafka_admin_roundtrip.py BOOTSTRAP_SERVERS RECORDS
"""

import sys
import time

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

bootstrap_servers, records = sys.argv[1], int(sys.argv[2])

admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, client_id="roundtrip")
admin.create_topics({"orders": {"num_partitions": 3, "replication_factor": 1}})
print("topics", sorted(admin.list_topics()))

producer = KafkaProducer(bootstrap_servers=bootstrap_servers, key_serializer=str.encode,
                         value_serializer=str.encode, linger_ms=5)
started = time.monotonic()
for i in range(records):
    producer.send("orders", key=f"customer-{i % 97}", value=f"order {i}")
producer.flush()
elapsed = time.monotonic() - started
producer.close()
print(f"produced {records} records in {elapsed:.3f} s: {records / elapsed:.0f} records/sec")

consumer = KafkaConsumer("orders", bootstrap_servers=bootstrap_servers, group_id="billing",
                         auto_offset_reset="earliest", enable_auto_commit=False,
                         consumer_timeout_ms=5000)
consumed = 0
started = time.monotonic()
for message in consumer:
    consumed += 1
    if consumed == records:
        break
elapsed = time.monotonic() - started
consumer.commit()
print(f"consumed {consumed} records in {elapsed:.3f} s: {consumed / elapsed:.0f} records/sec")

group = admin.describe_groups(["billing"])["billing"]
print("group", group["group_id"], group["group_state"], len(group["members"]), "members")
consumer.close()

offsets = admin.list_group_offsets("billing")["billing"]
for tp in sorted(offsets, key=lambda tp: tp.partition):
    print("offset", tp.topic, tp.partition, offsets[tp].offset)

deleted = admin.delete_records({tp: offsets[tp].offset for tp in offsets})
for tp in sorted(deleted, key=lambda tp: tp.partition):
    print("low watermark", tp.topic, tp.partition, deleted[tp]["low_watermark"])
admin.close()
