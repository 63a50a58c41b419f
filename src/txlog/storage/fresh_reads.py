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

import threading

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

