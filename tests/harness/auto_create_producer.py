"""One producer process of tests/root/test_auto_create.py's race for a new topic.

    python auto_create_producer.py ROOT TOPIC NAME COUNT native|kafka

Opens ROOT, prints ``READY`` and waits for a line on stdin, so that every process
sends its first record (the one that finds TOPIC missing and creates it) at the
same moment; then sends COUNT records valued ``NAME-<i>`` through the native
``Producer`` or ``txlog.kafka.KafkaProducer``, flushes, and prints ``SENT <count>``.
"""

from __future__ import annotations

import sys

from txlog import Log
from txlog.kafka import KafkaProducer


def main() -> None:
    root, topic, name, count, kind = sys.argv[1:6]
    log = Log(root)
    producer = log.producer(linger_ms=1000) if kind == "native" else \
        KafkaProducer(bootstrap_servers=root, linger_ms=1000)
    print("READY", flush=True)
    sys.stdin.readline()
    for i in range(int(count)):
        producer.send(topic, f"{name}-{i}".encode())
    producer.flush()
    producer.close()
    print(f"SENT {count}", flush=True)


if __name__ == "__main__":
    main()
