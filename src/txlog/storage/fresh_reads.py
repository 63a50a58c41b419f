"""Reads of one small object shared by the threads that ask for it at the same moment.

The partitions a flush claims in parallel each check ``topic.json`` (the
empty prefix's proof, before and after the claim: docs/protocol.md 1.4);
at object-store latency that was one GET per partition per check for the
same bytes.  A read shared here is only handed to callers that asked
*before it began*, so every caller gets the object as it was at some
instant inside its own call: exactly what a read of its own would have
given it, hence usable wherever that read was, proofs included.  A caller
that arrives while a read is in flight waits for the next one (started
when the one in flight ends) and shares it with everyone else who arrived
meanwhile: at most two reads' latency, and one request per wave instead
of one per caller.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from typing import Any

from .contract import Storage


class _Read:
    """One read, and the callers waiting for it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.data: bytes | None = None
        self.error: BaseException | None = None
        self.callers = 1  # who asked for it before it began (its starter included)

    def result(self) -> bytes:
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.data is not None
        return self.data


_lock = threading.Lock()
_running: dict[tuple[int, str], _Read] = {}  # the read in flight, per store and path
_waiting: dict[tuple[int, str], _Read] = {}  # the read that starts when it ends


def fresh_read(storage: Storage, path: str) -> bytes:
    """``storage.read(path)``, from a read that began after this call did (see above).

    Errors (FileNotFoundError included) are shared like data: they are that
    read's answer.
    """
    key = (id(storage), path)
    before: _Read | None = None
    joined: _Read | None = None
    with _lock:
        running = _running.get(key)
        if running is None:
            mine = _running[key] = _Read()
        elif key in _waiting:
            joined = _waiting[key]  # another caller starts it
            joined.callers += 1
        else:
            mine = _waiting[key] = _Read()
            before = running
    if joined is not None:
        return joined.result()
    if before is not None:
        before.done.wait()  # its reader made ours the running one as it finished
    try:
        mine.data = storage.read(path)
    except BaseException as exc:  # shared with every waiter, then raised here too
        mine.error = exc
    finally:
        with _lock:
            following = _waiting.pop(key, None)
            if following is not None:
                _running[key] = following
            elif _running.get(key) is mine:
                del _running[key]
        mine.done.set()
    return mine.result()



class SharedReads:
    """Reads that the claims of one flush share for ``window_s`` from when each began: the
    check of ``topic.json`` before a claim's publish, which only bounds how long before
    the publish the topic was last seen to be this incarnation (docs/protocol.md 1.8).
    Never used for a check that must follow an event (the one after a publish): that
    takes ``fresh_read``.  A read that failed answers the callers waiting for it only."""

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._lock = threading.Lock()
        self._reads: dict[tuple[int, str], tuple[float, _Read]] = {}

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` with ``recent_read`` sharing this scope's reads (in any thread)."""
        token = _SCOPE.set(self)
        try:
            return fn(*args)
        finally:
            _SCOPE.reset(token)

    def read(self, storage: Storage, path: str) -> bytes:
        key = (id(storage), path)
        with self._lock:
            found = self._reads.get(key)
            if found is None or time.monotonic() - found[0] >= self._window_s:
                found = self._reads[key] = (time.monotonic(), _Read())
                mine: _Read | None = found[1]
            else:
                mine = None
        if mine is None:
            return found[1].result()
        try:
            mine.data = fresh_read(storage, path)
        except BaseException as exc:
            mine.error = exc
            with self._lock:
                if self._reads.get(key) is found:
                    del self._reads[key]
        mine.done.set()
        return mine.result()


_SCOPE: contextvars.ContextVar[SharedReads | None] = contextvars.ContextVar(
    "txlog_shared_reads", default=None)


def recent_read(storage: Storage, path: str) -> bytes:
    """``path`` as read within the caller's ``SharedReads`` scope less than its window ago,
    else read now (``fresh_read``)."""
    scope = _SCOPE.get()
    return scope.read(storage, path) if scope is not None else fresh_read(storage, path)
