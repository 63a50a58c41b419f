"""A chain of versions: the optimistic-concurrency pattern for coordinator state.

Version ``v`` of some state lives at ``<directory>/<v, 20 digits>``.  An update
reads the latest version, computes the next from it, and publishes ``v + 1``
if absent; whoever loses reloads and computes again.  Garbage collection
deletes a version only once its successor is old (admin/gc.py): an exclusive
publish at ``v + 1`` with ``v`` still present, byte for byte as the writer read
it, proves the writer saw the latest.

A whole chain may be deleted (an expired transactional id, docs/protocol.md
4.10) and started again at version 0.  Two rules keep a process that knew
the old chain from acting on it: the predecessor check compares bytes, not
existence, so a publish computed from the old chain is withdrawn even where
the new chain has reached the same number; and a cached version older than
``VERIFY_AFTER_MS`` is checked to still exist before it is trusted again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack

from .. import clock
from .contract import Storage
from .paths import version_path

# A cached newest version is trusted for this long; after it, one read to check it.
VERIFY_AFTER_MS = 1000

T = TypeVar("T")


class VersionChain:
    def __init__(self, storage: Storage, directory: str) -> None:
        self.storage = storage
        self.directory = directory
        self._lock = threading.Lock()
        self._version = -1  # latest version known here, -1: none known yet
        self._value: dict[str, Any] | None = None
        self._raw: bytes | None = None  # the bytes of the cached version
        self._listed = False
        self._confirmed_ms = 0  # when the cached version was last seen to exist
        self._own_head = False  # the cached version is this process's own publish

    def _path(self, version: int) -> str:
        return version_path(self.directory, version)

    def latest(self) -> tuple[int, dict[str, Any] | None]:
        """(version, value) of the newest version; (-1, None) for an empty chain."""
        version, value, _ = self._latest()
        return version, value

    def _latest(self) -> tuple[int, dict[str, Any] | None, bytes | None]:
        while True:
            found = self._latest_once()
            if found is not None:
                return found

    def _latest_once(self) -> tuple[int, dict[str, Any] | None, bytes | None] | None:
        with self._lock:
            if self._listed and self._version >= 0 and \
                    clock.now_ms() - self._confirmed_ms > VERIFY_AFTER_MS:
                self._confirm()
            listed_now = not self._listed
            if listed_now:
                names = self.storage.list(self.directory)
                versions = [int(n) for n in names if n.isdigit()]
                if versions and max(versions) > self._version:
                    self._version = max(versions)
                    self._value = self._raw = None
                    self._own_head = False
                self._listed = True
                self._confirmed_ms = clock.now_ms()
            # A listing just made names the newest version as of now (the stores list
            # consistently): reading the next one as well would prove nothing more.
            while not listed_now:
                try:
                    raw = self.storage.read(self._path(self._version + 1))
                except FileNotFoundError:
                    break
                self._version += 1
                self._own_head = False
                self._raw = raw
                self._value = msgpack.unpackb(raw, strict_map_key=False)
                self._confirmed_ms = clock.now_ms()
            if self._version >= 0 and self._value is None:
                try:
                    self._raw = self.storage.read(self._path(self._version))
                except FileNotFoundError:  # deleted since the listing: list again
                    self._forget()
                    return None
                self._value = msgpack.unpackb(self._raw, strict_map_key=False)
            return self._version, self._value, self._raw

    def _forget(self) -> None:
        self._version, self._value, self._raw, self._listed = -1, None, None, False
        self._own_head = False

    def _confirm(self) -> None:
        """Drop the cache unless its version is still there with the bytes cached: else the
        chain was deleted whole (and perhaps started again, even past the cached number),
        and nothing learnt from it may be used (caller holds the lock)."""
        try:
            same = self.storage.read(self._path(self._version)) == self._raw \
                if self._raw is not None else self.storage.exists(self._path(self._version))
        except FileNotFoundError:
            same = False
        if same:
            self._confirmed_ms = clock.now_ms()
        else:
            self._forget()

    def publish(self, version: int, value: dict[str, Any], based_on: bytes | None = None
                ) -> bool:
        """Publish ``version``; False if someone else published it first.

        Also False, with the version withdrawn, when its predecessor is gone
        or is not ``based_on`` (the bytes of the version this one was computed
        from, by default the cached newest): garbage collection only deletes
        versions superseded long ago, and a chain deleted whole may have
        started again under the same numbers, so this process computed from
        a version that was no longer the newest and must read the chain
        again (admin/gc.py).
        """
        if based_on is None and version > 0:
            with self._lock:
                based_on = self._raw if self._version == version - 1 else None
        path = self._path(version)
        data = msgpack.packb(value)
        if not self.storage.publish_if_absent(path, data):
            with self._lock:
                self._own_head = False
            return False
        if version > 0:
            try:
                before = self.storage.read(self._path(version - 1))
            except FileNotFoundError:
                before = None
            if before is None or (based_on is not None and before != based_on):
                self.storage.delete(path)
                with self._lock:
                    self._forget()
                return False
        with self._lock:
            if version > self._version:
                self._version, self._value, self._raw = version, value, data
                self._confirmed_ms = clock.now_ms()
                self._own_head = True
        return True

    def _own_guess(self) -> tuple[int, dict[str, Any] | None, bytes | None] | None:
        """The cached version, if it is this process's own latest publish: a guess at the
        newest that only a winning publish of the next version can confirm."""
        with self._lock:
            if self._own_head and self._raw is not None:
                return self._version, self._value, self._raw
            return None

    def update(self, step: Callable[[int, dict[str, Any] | None], dict[str, Any] | None],
               guess_own_head: bool = False) -> tuple[int, dict[str, Any] | None]:
        """Apply ``step`` to the latest value until its result is published.

        ``step`` returns the next value, or None when there is nothing to
        change; it may raise to refuse.  Returns the version and value that
        ended the loop.

        With ``guess_own_head``, when the cached version is this process's own
        last publish, the first try applies ``step`` to it without reading the
        next version (docs/protocol.md 4.1): a winning publish of the next
        version proves it was the newest (the create is exclusive, and the
        predecessor check proves the cached bytes are still the chain's), so
        the read would prove nothing more.  Any other outcome of the guess (no
        change, a refusal, a lost publish) proves nothing, and ``step`` runs
        again on a fresh read; so ``step`` must not keep effects of a run that
        did not end the loop.
        """
        guess = self._own_guess() if guess_own_head else None
        while True:
            if guess is not None:
                version, value, based_on = guess
                guess = None
                try:
                    new = step(version, value)
                except Exception:
                    continue
                if new is not None and self.publish(version + 1, new, based_on):
                    return version + 1, new
                continue
            version, value, based_on = self._latest()
            new = step(version, value)
            if new is None:
                return version, value
            if self.publish(version + 1, new, based_on):
                return version + 1, new
