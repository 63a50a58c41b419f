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

import contextlib
import contextvars
import threading
import time
from collections.abc import Iterator

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
    """Reads that the claims of one flush share (docs/protocol.md 1.8).

    ``read``: for ``window_s`` from when it began, the check of ``topic.json``
    before a claim's publish, which only bounds how long before the publish
    the topic was last seen to be this incarnation.  A read that failed
    answers the callers waiting for it only.

    ``read_after``: the check after a publish, which must begin after the
    caller's publish returned.  The flush's publishes in flight (``publishing``)
    are waited for, at most ``window_s``, before the read begins, so that the
    claims publishing at once share one read that began after each of them
    returned, where ``fresh_read`` alone shares only with those that happened
    to ask before it began.
    """

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._lock = threading.Lock()
        self._reads: dict[tuple[int, str], tuple[float, _Read]] = {}
        self._settled = threading.Condition(self._lock)
        self._publishing = 0
        self._gathering: dict[tuple[int, str], _Read] = {}

    @contextlib.contextmanager
    def publishing(self) -> Iterator[None]:
        """Around one publish of the flush: a read after publishes waits for it."""
        with self._lock:
            self._publishing += 1
        try:
            yield
        finally:
            with self._lock:
                self._publishing -= 1
                self._settled.notify_all()

    def read_after(self, storage: Storage, path: str) -> bytes:
        """``path`` read after the caller's publish returned (see the class)."""
        key = (id(storage), path)
        with self._lock:
            gathering = self._gathering.get(key)
            if gathering is not None:
                gathering.callers += 1
            else:
                mine = self._gathering[key] = _Read()
                self._settled.wait_for(lambda: self._publishing == 0, self._window_s)
                del self._gathering[key]  # from here on, callers gather for the next
        if gathering is not None:
            return gathering.result()
        try:
            mine.data = storage.read(path)  # begins after every gathered caller asked
        except BaseException as exc:
            mine.error = exc
        mine.done.set()
        return mine.result()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """This scope's reads shared by ``recent_read`` and ``read_after_publish`` in the
        calling thread until the block ends."""
        token = _SCOPE.set(self)
        try:
            yield
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


def read_after_publish(storage: Storage, path: str) -> bytes:
    """``path`` read after the caller's publish returned: shared with the claims of its
    flush that published at the same time (``SharedReads.read_after``), else
    ``fresh_read``."""
    scope = _SCOPE.get()
    return scope.read_after(storage, path) if scope is not None else fresh_read(storage, path)


def publishing() -> contextlib.AbstractContextManager[None]:
    """Around a publish: the caller's flush (if any) waits for it before a read after."""
    scope = _SCOPE.get()
    return scope.publishing() if scope is not None else contextlib.nullcontext()
