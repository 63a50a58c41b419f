"""In-memory storage: ``memory://`` roots, for tests of the protocol."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from .contract import Storage, check_relative


class MemoryStorage(Storage):
    """A dict behind a lock: unit tests of the protocol without touching disk."""

    def __init__(self) -> None:
        self.url = f"memory://{uuid.uuid4().hex}"
        self._objects: dict[str, bytes] = {}
        self._times: dict[str, float] = {}
        self._lock = threading.Lock()

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        check_relative(path)
        with self._lock:
            if path in self._objects:
                return False
            self._objects[path] = bytes(data)
            self._times[path] = time.time()
            return True

    def list_times(self, directory: str) -> list[tuple[str, float]]:
        prefix = directory.rstrip("/") + "/"
        with self._lock:
            return [(k[len(prefix):], self._times.get(k, 0.0)) for k in self._objects
                    if k.startswith(prefix) and "/" not in k[len(prefix):]]

    def read(self, path: str) -> bytes:
        check_relative(path)  # refuse the same paths LocalStorage refuses
        with self._lock:
            try:
                return self._objects[path]
            except KeyError:
                raise FileNotFoundError(path) from None

    def read_prefix(self, path: str, length: int) -> bytes:
        return self.read(path)[:length]

    def exists(self, path: str) -> bool:
        check_relative(path)
        with self._lock:
            return path in self._objects

    def list(self, directory: str) -> list[str]:
        prefix = directory.rstrip("/") + "/" if directory else ""
        with self._lock:
            keys = [k[len(prefix):] for k in self._objects if k.startswith(prefix)]
        return sorted({k.split("/", 1)[0] for k in keys})

    def delete(self, path: str) -> None:
        check_relative(path)
        with self._lock:
            self._objects.pop(path, None)
            self._times.pop(path, None)


_memory_roots: dict[str, MemoryStorage] = {}
_memory_lock = threading.Lock()


def open_memory(url: str, storage_options: dict[str, Any] | None = None) -> MemoryStorage:
    """The process-local store named ``url``, shared by every Log opened with the same
    name (storage options choose nothing here)."""
    with _memory_lock:
        store = _memory_roots.get(url)
        if store is None:
            store = _memory_roots[url] = MemoryStorage()
            store.url = url  # so that Log(log.root) reopens this same store
        return store
