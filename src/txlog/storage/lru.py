"""A dict that keeps only its most recently used entries.

For a process's caches of per-transaction objects (version chains, published
decisions): one entry per transactional id or decision it ever touched would
grow without bound in a process that lives through many jobs (a Spark worker
keeping its Log, spark/worker_logs.py; a streaming query's driver).  Each of
those caches only saves reads, so an entry dropped is read again when next
needed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LruDict(Generic[K, V]):
    """``get``/``setdefault``/``pop`` of a dict, holding at most ``capacity`` entries."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def setdefault(self, key: K, value: V) -> V:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found
            self._put(key, value)
            return value

    def __setitem__(self, key: K, value: V) -> None:
        with self._lock:
            self._put(key, value)

    def pop(self, key: K, default: V | None = None) -> V | None:
        with self._lock:
            return self._entries.pop(key, default)

    def _put(self, key: K, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
