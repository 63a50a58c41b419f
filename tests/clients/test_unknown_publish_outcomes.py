"""A publish whose outcome is unknown, whatever the exception, must never let the
producer reuse the batch's sequence for other records: they would be taken for a
duplicate of the landed batch and dropped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from txlog import Log, TxlogError
from txlog.storage.local import LocalStorage
from txlog.storage.paths import BATCH_SUFFIX

from helpers_core import DelegatingStorage, read_chain


class OutcomeUnknownStorage(DelegatingStorage):
    """The first batch publish lands, then the call fails with ``kind``.

    ``oserror``: an OSError, and the next batch-header read fails too, so the
    partition's own retry cannot find out whether the batch landed and the
    OSError reaches the producer.  ``runtime``: an exception that is not an
    OSError (an object-store client's own error type).  ``keyboard``:
    KeyboardInterrupt arriving right after the object was created.
    """

    def __init__(self, inner, kind: str) -> None:
        super().__init__(inner)
        self.kind = kind
        self.armed = True
        self.fail_next_read = False

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        if self.armed and path.endswith(BATCH_SUFFIX):
            self.armed = False
            assert self.inner.publish_if_absent(path, data)
            if self.kind == "oserror":
                self.fail_next_read = True
                raise OSError("simulated: connection reset after the object was sent")
            if self.kind == "runtime":
                raise RuntimeError("simulated: object-store client gave up waiting for a reply")
            raise KeyboardInterrupt
        return super().publish_if_absent(path, data)

    def read_prefix(self, path: str, length: int) -> bytes:
        if self.fail_next_read and path.endswith(BATCH_SUFFIX):
            self.fail_next_read = False
            raise OSError("simulated: connection reset while reading")
        return super().read_prefix(path, length)


RAISED = {"oserror": OSError, "runtime": RuntimeError, "keyboard": KeyboardInterrupt}


def _values_on_disk(root: Path, topic: str = "t") -> list[bytes | None]:
    return [v for batch in read_chain(root, topic, 0) for v in batch.values]


@pytest.mark.parametrize("kind", sorted(RAISED))
def test_outcome_unknown_batch_never_turns_the_next_into_a_duplicate(tmp_path: Path,
                                                                     kind: str) -> None:
    root = tmp_path / "log"
    storage = OutcomeUnknownStorage(LocalStorage(str(root)), kind)
    log = Log(storage)
    log.create_topic("t", 1)
    producer = log.producer(linger_ms=3_600_000)
    first = [producer.send("t", b"a%d" % i, partition=0) for i in range(3)]
    with pytest.raises(RAISED[kind]):
        producer.flush()
    assert not storage.armed, "the simulated failure did not happen"
    assert all(f.failed() and isinstance(f.exception(), RAISED[kind]) for f in first)
    # Same record count as the batch that landed: before the fix this batch was
    # answered as a duplicate of it, acknowledged, and never written.
    second = [producer.send("t", b"b%d" % i, partition=0) for i in range(3)]
    assert [f.get().offset for f in second] == [3, 4, 5]
    assert _values_on_disk(root) == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]
    assert log.read("t", 0).column("value").to_pylist() == [b"a0", b"a1", b"a2",
                                                            b"b0", b"b1", b"b2"]


@pytest.mark.parametrize("kind", sorted(RAISED))
def test_transactional_batch_with_unknown_outcome_blocks_the_commit(tmp_path: Path,
                                                                    kind: str) -> None:
    root = tmp_path / "log"
    storage = OutcomeUnknownStorage(LocalStorage(str(root)), kind)
    log = Log(storage)
    log.create_topic("t", 1)
    producer = log.producer(transactional_id="tx", linger_ms=3_600_000)
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(3):
        producer.send("t", b"a%d" % i, partition=0)
    with pytest.raises(RAISED[kind]):
        producer.flush()
    # The transaction holds a batch of unknown outcome: it cannot go on or commit.
    with pytest.raises(TxlogError):
        producer.send("t", b"b0", partition=0)
    with pytest.raises(TxlogError):
        producer.commit_transaction()
    producer.abort_transaction()
    producer.begin_transaction()
    for i in range(3):
        producer.send("t", b"b%d" % i, partition=0)
    producer.commit_transaction()
    assert log.read("t", 0).column("value").to_pylist() == [b"b0", b"b1", b"b2"]
    assert [v for v in _values_on_disk(root) if v is not None] == [
        b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]
