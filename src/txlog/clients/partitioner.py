"""Kafka's default partitioner: murmur2 of the key, sticky partitions for null keys."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa

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


def _binary_buffers(keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data) of a binary-like array as numpy views, honouring its slice offset."""
    if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type):
        keys = keys.cast(pa.large_binary() if pa.types.is_large_string(keys.type)
                         else pa.binary())
    if not (pa.types.is_binary(keys.type) or pa.types.is_large_binary(keys.type)):
        raise TypeError(f"keys must be binary or string, not {keys.type}")
    offset_type = np.int64 if pa.types.is_large_binary(keys.type) else np.int32
    _, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=offset_type)[keys.offset:keys.offset + len(keys) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None and \
        data_buf.size else np.zeros(0, dtype=np.uint8)
    return offsets.astype(np.int64), data


def _murmur2_many(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """``murmur2`` of every key at once: uint32 arithmetic wraps exactly like Java's int.

    Rows are ordered by their number of 4-byte blocks, longest first, so
    that the rows still hashing blocks at step j are a prefix: the loop runs
    over block positions (up to the longest key / 4), never over records.
    Keys all of one length (a numeric id as bytes, a UUID) need no order: they
    are the rows of a 2-D view of the data, read a column of words at a time.
    """
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    m = np.uint32(_M)
    h = np.uint32(_SEED) ^ lengths.astype(np.uint32)
    blocks = lengths // 4
    if len(lengths) and lengths.min() == lengths.max():
        width, first = int(lengths[0]), int(starts[0])
        rows = data[first:first + width * len(lengths)].reshape(len(lengths), width)
        words = np.ascontiguousarray(rows[:, :4 * (width // 4)]).view(np.dtype("<u4"))
        for j in range(width // 4):
            k = words[:, j].astype(np.uint32)
            k *= m
            k ^= k >> np.uint32(24)
            k *= m
            h = (h * m) ^ k
        return _murmur2_tails(h, starts, lengths, blocks, data)
    order = np.argsort(-blocks, kind="stable")
    sorted_blocks = blocks[order]
    sorted_starts = starts[order]
    hs = h[order]
    most = int(sorted_blocks[0]) if len(sorted_blocks) else 0
    # active[j] = how many rows have more than j blocks (a prefix of the order)
    active = np.searchsorted(-sorted_blocks, -np.arange(most), side="left")
    for j in range(most):
        n = int(active[j])
        at = sorted_starts[:n] + 4 * j
        k = (data[at].astype(np.uint32) | (data[at + 1].astype(np.uint32) << np.uint32(8))
             | (data[at + 2].astype(np.uint32) << np.uint32(16))
             | (data[at + 3].astype(np.uint32) << np.uint32(24)))
        k *= m
        k ^= k >> np.uint32(24)
        k *= m
        hs[:n] = (hs[:n] * m) ^ k
    h[order] = hs
    return _murmur2_tails(h, starts, lengths, blocks, data)


def _murmur2_tails(h: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                   blocks: np.ndarray, data: np.ndarray) -> np.ndarray:
    """The last 1 to 3 bytes of each key, then the final mix (``h`` after the blocks)."""
    m = np.uint32(_M)
    tail = lengths % 4
    if tail.any():
        rest = starts + 4 * blocks
        for size, shift in ((3, 16), (2, 8)):
            rows = np.flatnonzero(tail >= size)
            h[rows] ^= data[rest[rows] + size - 1].astype(np.uint32) << np.uint32(shift)
        rows = np.flatnonzero(tail >= 1)
        h[rows] ^= data[rest[rows]].astype(np.uint32)
        h[rows] *= m
    h ^= h >> np.uint32(13)
    h *= m
    h ^= h >> np.uint32(15)
    return h


def partitions_for_keys(keys: pa.Array | pa.ChunkedArray, num_partitions: int) -> np.ndarray:
    """Kafka's ``toPositive(murmur2(key)) % numPartitions`` for a whole column (int32).

    Null keys get -1: where they go (KIP-480 stickiness) is the caller's choice.
    Equal to ``partition_for_key`` row by row; vectorised so that a bulk
    send does not pay a Python call per record.
    """
    if not isinstance(num_partitions, int) or num_partitions < 1:
        raise ValueError(f"num_partitions must be a positive integer, not {num_partitions!r}")
    if isinstance(keys, pa.ChunkedArray):
        parts = [partitions_for_keys(chunk, num_partitions) for chunk in keys.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    with np.errstate(over="ignore"):
        offsets, data = _binary_buffers(keys)
        hashed = _murmur2_many(offsets, data)
    result = ((hashed & np.uint32(0x7FFFFFFF)) % np.uint32(num_partitions)).astype(np.int32)
    if keys.null_count:
        result[np.asarray(keys.is_null())] = -1
    return result
