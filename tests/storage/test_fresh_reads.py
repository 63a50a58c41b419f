"""storage/fresh_reads.py: a shared read is only handed to callers that asked before it
began (docs/protocol.md 1.4), so sharing never gives anyone an older answer than a read
of its own would have."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from txlog.storage import fresh_reads
from txlog.storage.fresh_reads import fresh_read
from txlog.storage.memory import MemoryStorage


class _Gated(MemoryStorage):
    """A store whose first read waits for the test's ``go``; every read is counted."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.first_started = threading.Event()
        self.go = threading.Event()

    def read(self, path: str) -> bytes:
        try:
            data: bytes | Exception = super().read(path)  # as it is when the read begins
        except FileNotFoundError as exc:
            data = exc
        self.reads += 1
        if self.reads == 1:
            self.first_started.set()
            assert self.go.wait(10), "the test never let the first read finish"
        if isinstance(data, Exception):
            raise data
        return data


def _wait(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    pause = threading.Event()
    for _ in range(1000):
        if predicate():
            return
        pause.wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def _callers(store: MemoryStorage, path: str) -> int:
    """Callers of the read in flight and of the one waiting to start."""
    key = (id(store), path)
    return sum(r.callers for r in (fresh_reads._running.get(key), fresh_reads._waiting.get(key))
               if r is not None)


def test_callers_share_a_read_only_if_they_asked_before_it_began() -> None:
    store = _Gated()
    store.publish_if_absent("x", b"old")
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(fresh_read, store, "x")
        assert store.first_started.wait(10)
        # Asked while the first read is in flight, after the object changed: these
        # callers must see the change (a read that begins after they asked).
        store.delete("x")
        store.publish_if_absent("x", b"new")
        later = [pool.submit(fresh_read, store, "x") for _ in range(5)]
        _wait(lambda: _callers(store, "x") == 6, "the later callers to queue")
        store.go.set()
        assert first.result(10) == b"old"
        assert [f.result(10) for f in later] == [b"new"] * 5
    assert store.reads == 2  # six callers, two reads


def test_a_shared_error_reaches_every_caller_of_that_read() -> None:
    store = _Gated()
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(fresh_read, store, "missing")
        assert store.first_started.wait(10)
        later = [pool.submit(fresh_read, store, "missing") for _ in range(3)]
        _wait(lambda: _callers(store, "missing") == 4, "the later callers to queue")
        store.go.set()
        for future in [first, *later]:
            with pytest.raises(FileNotFoundError):
                future.result(10)
    assert store.reads == 2
    store.publish_if_absent("missing", b"here")  # nothing of an old answer is kept
    assert fresh_read(store, "missing") == b"here" and store.reads == 3


class _Counted(MemoryStorage):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def read(self, path: str) -> bytes:
        self.reads += 1
        return super().read(path)


def test_a_flushs_claims_share_a_read_before_their_publish_for_a_window_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SharedReads (docs/protocol.md 1.8): within the scope a read that began less than
    the window ago answers; an older one, a failed one, or a caller outside any scope
    reads again."""
    store = _Counted()
    now = [100.0]
    monkeypatch.setattr(fresh_reads, "time", SimpleNamespace(monotonic=lambda: now[0]))
    scope = fresh_reads.SharedReads(0.5)

    def twice() -> list[bytes]:
        return [fresh_reads.recent_read(store, "x") for _ in range(2)]

    with pytest.raises(FileNotFoundError), scope.active():
        fresh_reads.recent_read(store, "x")
    store.publish_if_absent("x", b"1")
    with scope.active():
        assert twice() == [b"1", b"1"] and store.reads == 2  # the failure not kept
        now[0] += 0.4
        store.delete("x")
        store.publish_if_absent("x", b"2")
        assert fresh_reads.recent_read(store, "x") == b"1" and store.reads == 2
        now[0] += 0.1  # the read began 0.5 s ago: no longer within the window
        assert fresh_reads.recent_read(store, "x") == b"2" and store.reads == 3
    assert twice() == [b"2", b"2"] and store.reads == 5  # no scope: each reads


def test_a_read_after_publishes_waits_for_the_flushs_publishes_and_never_joins_a_begun_read(
        ) -> None:
    """SharedReads.read_after (docs/protocol.md 1.8): a claim's check after its publish
    waits for the flush's publishes in flight, and the claims that asked meanwhile share
    its one read; a caller arriving once that read has begun reads again (it may have
    published after the read began)."""
    store = _Gated()
    store.publish_if_absent("x", b"old")
    scope = fresh_reads.SharedReads(10.0)
    in_flight, release = threading.Event(), threading.Event()

    def publish() -> None:
        with scope.active(), fresh_reads.publishing():
            in_flight.set()
            assert release.wait(10)

    def read_after() -> bytes:
        with scope.active():
            return fresh_reads.read_after_publish(store, "x")

    with ThreadPoolExecutor(8) as pool:
        publisher = pool.submit(publish)
        assert in_flight.wait(10)
        first = [pool.submit(read_after) for _ in range(3)]
        _wait(lambda: scope._gathering.get((id(store), "x")) is not None and
              scope._gathering[(id(store), "x")].callers == 3, "three gathered callers")
        assert store.reads == 0  # the publish in flight is waited for
        release.set()
        publisher.result(10)
        assert store.first_started.wait(10)
        store.delete("x")
        store.publish_if_absent("x", b"new")  # a publish after the shared read began
        late = pool.submit(read_after)
        key = (id(store), "x")
        _wait(lambda: late.done() or (key in scope._gathering and
                                      scope._gathering[key].callers == 4),
              "the late caller to read, or to join the read in flight")
        store.go.set()
        assert [f.result(10) for f in first] == [b"old"] * 3
        assert late.result(10) == b"new"
    assert store.reads == 2
