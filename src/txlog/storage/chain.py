"""A chain of versions: the optimistic-concurrency pattern for coordinator state.

Version ``v`` of some state lives at ``<directory>/<v, 20 digits>``.  An update
reads the latest version, computes the next from it, and publishes ``v + 1``
if absent; whoever loses reloads and computes again.  Garbage collection
deletes a version only once its successor is old (admin/gc.py): an exclusive
publish at ``v + 1`` with ``v`` still present proves the writer saw the latest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack

from .backends import Storage
from .paths import version_path

T = TypeVar("T")


class VersionChain:
    def __init__(self, storage: Storage, directory: str) -> None:
        self.storage = storage
        self.directory = directory
        self._lock = threading.Lock()
        self._version = -1  # latest version known here, -1: none known yet
        self._value: dict[str, Any] | None = None
        self._listed = False

    def _path(self, version: int) -> str:
        return version_path(self.directory, version)

    def latest(self) -> tuple[int, dict[str, Any] | None]:
        """(version, value) of the newest version; (-1, None) for an empty chain."""
        with self._lock:
            if not self._listed:
                names = self.storage.list(self.directory)
                versions = [int(n) for n in names if n.isdigit()]
                if versions and max(versions) > self._version:
                    self._version = max(versions)
                    self._value = None
                self._listed = True
            while True:
                try:
                    raw = self.storage.read(self._path(self._version + 1))
                except FileNotFoundError:
                    break
                self._version += 1
                self._value = msgpack.unpackb(raw, strict_map_key=False)
            if self._version >= 0 and self._value is None:
                self._value = msgpack.unpackb(self.storage.read(self._path(self._version)),
                                              strict_map_key=False)
            return self._version, self._value

    def publish(self, version: int, value: dict[str, Any]) -> bool:
        """Publish ``version``; False if someone else published it first.

        Also False, with the version withdrawn, when its predecessor is gone:
        garbage collection only deletes versions superseded long ago, so this
        process computed from a version that was no longer the newest and
        must read the chain again (admin/gc.py).
        """
        path = self._path(version)
        if not self.storage.publish_if_absent(path, msgpack.packb(value)):
            return False
        if version > 0 and not self.storage.exists(self._path(version - 1)):
            self.storage.delete(path)
            with self._lock:
                self._version, self._value, self._listed = -1, None, False
            return False
        with self._lock:
            if version > self._version:
                self._version, self._value = version, value
        return True

    def update(self, step: Callable[[int, dict[str, Any] | None], "dict[str, Any] | None"]
               ) -> tuple[int, dict[str, Any] | None]:
        """Apply ``step`` to the latest value until its result is published.

        ``step`` returns the next value, or None when there is nothing to
        change; it may raise to refuse.  Returns the version and value that
        ended the loop.
        """
        while True:
            version, value = self.latest()
            new = step(version, value)
            if new is None:
                return version, value
            if self.publish(version + 1, new):
                return version + 1, new
