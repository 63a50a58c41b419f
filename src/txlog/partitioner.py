"""Kafka's default partitioner: murmur2 of the key, sticky partitions for null keys."""

from __future__ import annotations

import random

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 (``Utils.murmur2``), as an unsigned value."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length % 4
    if tail == 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """``toPositive(murmur2(key)) % numPartitions``, as Kafka's producer does."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class StickyPartitioner:
    """Null keys stick to one partition until its batch is sent (KIP-480)."""

    def __init__(self) -> None:
        self._sticky: dict[str, int] = {}

    def partition(self, topic: str, num_partitions: int) -> int:
        current = self._sticky.get(topic)
        if current is None or current >= num_partitions:
            current = self._sticky[topic] = random.randrange(num_partitions)
        return current

    def batch_sent(self, topic: str, partition: int, num_partitions: int) -> None:
        if self._sticky.get(topic) == partition and num_partitions > 1:
            choices = [p for p in range(num_partitions) if p != partition]
            self._sticky[topic] = random.choice(choices)
