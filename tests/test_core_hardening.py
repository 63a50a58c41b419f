"""Issue 10: three ways the core lost data or showed aborted records.

1. A publish whose outcome is unknown, whatever the exception, must never let
   the producer reuse the batch's sequence for other records (they would be
   taken for a duplicate of the landed batch and dropped).
2. Ending a shared transaction must never report as committed a member that
   the standing decision does not commit.
3. A topic deleted and re-created is a new incarnation (KIP-516): nothing
   cached from the old one (state, snapshots, sequences) is applied to it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import logging

import msgpack
import pytest

from txlog import (DecisionConflictError, InconsistentTopicIdError, Log, ProducerFencedError,
                   TxlogError)
from txlog.format.snapshot_frame import unframe
from txlog.storage.local import LocalStorage
from txlog.storage.paths import BATCH_SUFFIX

from helpers_core import DelegatingStorage, child, read_chain, wait_for

# --- 1. outcome-unknown publishes -------------------------------------------------------


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


# --- 2. shared transactions and their standing decision ------------------------------------


def _shared(log: Log, decision_id: str, prefix: str, n: int,
            send: bool = True) -> tuple[list, list[bytes]]:
    members, values = [], []
    for i in range(n):
        producer = log.producer(transactional_id=f"{prefix}-{i}", linger_ms=0)
        producer.init_transactions()
        producer.begin_transaction(decision_id=decision_id)
        value = f"{prefix}/{i}".encode()
        if send:
            producer.send("t", value, partition=i % 3)
        else:
            producer.send_offsets_to_transaction({("t", i % 3): 0}, f"{prefix}-group")
        values.append(value)
        members.append(producer.prepare_transaction())
    return members, values


def _visible(log: Log) -> set[bytes]:
    return {v for p in range(3) for v in log.read("t", p).column("value").to_pylist()}


def test_shared_commit_never_reports_members_the_decision_does_not_commit(log: Log) -> None:
    log.create_topic("t", 3)
    members, values = _shared(log, "job-x", "task", 3)
    first = log.coordinator.end_shared_transaction("job-x", members[:2], commit=True)
    assert first.commit
    # A driver retrying with the fuller message list must not hear "committed".
    with pytest.raises(DecisionConflictError) as info:
        log.coordinator.end_shared_transaction("job-x", members, commit=True)
    assert info.value.not_committed == [members[2].transactional_id]
    assert "job-x" in str(info.value) and members[2].transactional_id in str(info.value)
    assert members[0].transactional_id not in str(info.value)
    assert _visible(log) == set(values[:2])
    # Spark calls abort after a failed commit: the standing decision, unchanged.
    assert log.coordinator.end_shared_transaction("job-x", members, commit=False) == first

    # A later job re-using the decision id writes nothing: its transaction is decided
    # before it begins, and partitions take no data for a decided transaction from a
    # producer they do not know (protocol.md 2.6).
    later = log.producer(transactional_id="later-0", linger_ms=0)
    later.init_transactions()
    later.begin_transaction(decision_id="job-x")
    with pytest.raises(ProducerFencedError, match="job-x"):
        later.send("t", b"later/0", partition=0).get()
    # Ending it tells its members they are not committed.
    members_later, _ = _shared(log, "job-x", "silent", 1, send=False)
    with pytest.raises(DecisionConflictError) as info:
        log.coordinator.end_shared_transaction("job-x", members_later, commit=True)
    assert all(m.transactional_id in str(info.value) for m in members_later)
    assert _visible(log) == set(values[:2])
    # Their transactions were completed (aborted), so they hold no LSO back.
    for p in range(3):
        assert log.last_stable_offset("t", p) == log.end_offset("t", p)


def test_commit_meeting_a_standing_abort_raises(log: Log) -> None:
    log.create_topic("t", 3)
    members, _ = _shared(log, "job-y", "task", 2)
    aborted = log.coordinator.end_shared_transaction("job-y", members, commit=False)
    assert not aborted.commit
    with pytest.raises(DecisionConflictError, match="job-y"):
        log.coordinator.end_shared_transaction("job-y", members, commit=True)
    assert log.coordinator.end_shared_transaction("job-y", members, commit=False) == aborted
    assert _visible(log) == set()


# --- 3. topic incarnations -----------------------------------------------------------------


def test_reader_opened_before_a_recreate_never_shows_the_new_topics_open_records(
        tmp_path: Path) -> None:
    root = tmp_path / "log"
    writer = Log(root)
    writer.create_topic("t", 1)
    old = writer.producer(linger_ms=0)
    for i in range(3):
        old.send("t", b"old%d" % i, partition=0).get()
    reader = Log(root)
    assert reader.read("t", 0).column("value").to_pylist() == [b"old0", b"old1", b"old2"]

    admin = Log(root)
    admin.delete_topic("t")
    admin.create_topic("t", 1)
    plain = admin.producer(linger_ms=0)
    plain.send("t", b"new0", partition=0).get()
    txn = admin.producer(transactional_id="open", linger_ms=0)
    txn.init_transactions()
    txn.begin_transaction()
    txn.send("t", b"open", partition=0).get()
    plain.send("t", b"new2", partition=0).get()

    try:
        seen = reader.read("t", 0).column("value").to_pylist()
    except TxlogError as exc:  # a clear error is acceptable; mixing incarnations is not
        assert "re-created" in str(exc), exc
        seen = reader.read("t", 0).column("value").to_pylist()
    assert seen == [b"new0"]  # the open transaction holds the LSO at offset 1
    txn.abort_transaction()
    assert reader.read("t", 0).column("value").to_pylist() == [b"new0", b"new2"]


def _start(tmp_path: Path, root: Path, role: str) -> tuple[subprocess.Popen, Path, Path]:
    ready, result = tmp_path / f"{role}.ready", tmp_path / f"{role}.json"
    proc = subprocess.Popen(child("stale-holder", root, role, ready, tmp_path / "go", result))
    return proc, ready, result


def test_processes_holding_a_topic_across_delete_and_recreate(tmp_path: Path) -> None:
    """A snapshotting writer, a writer with a pending batch and a read_committed reader,
    each a separate process, hold topic ``t`` while the parent deletes and re-creates it."""
    root = tmp_path / "log"
    Log(root).create_topic("t", 1)
    procs: list[subprocess.Popen] = []
    results: dict[str, Path] = {}
    try:
        for role in ("snapshotter", "writer", "reader"):  # one after the other: fixed old log
            proc, ready, results[role] = _start(tmp_path, root, role)
            procs.append(proc)
            wait_for(lambda: ready.exists() or proc.poll() is not None, 120, f"{role} ready")
            assert proc.poll() is None, f"{role} exited early"
        old_seen = json.loads((tmp_path / "reader.ready").read_text())
        assert len(old_seen) == 65 and all(v.startswith("old-") for v in old_seen)

        admin = Log(root)
        admin.delete_topic("t")
        admin.create_topic("t", 1)
        admin.producer(linger_ms=0).send("t", b"new-0", partition=0).get()
        txn = admin.producer(transactional_id="open-txn", linger_ms=0)
        txn.init_transactions()
        txn.begin_transaction()
        txn.send("t", b"open-1", partition=0).get()
        admin.producer(linger_ms=0).send("t", b"new-2", partition=0).get()
        (tmp_path / "go").write_text("go")
        for proc in procs:
            assert proc.wait(timeout=120) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    outcomes = {role: json.loads(path.read_text())["outcomes"] for role, path in results.items()}

    chain = read_chain(root, "t", 0)  # asserts: starts at 0, no gap, checksums pass
    values = [v.decode() for batch in chain for v in batch.values]
    assert not [v for v in values if v.startswith("old-")], values
    assert "w-pending" not in values  # sent to the old incarnation: never lands in the new one
    assert values[:3] == ["new-0", "open-1", "new-2"]
    committed_new = {"new-0", "new-2", "s-after-0", "s-after-1", "w-after"}
    assert set(values[3:]) <= committed_new

    for role, outs in outcomes.items():
        # The first act of each stale process met the new incarnation: a clear refusal.
        assert outs[0].get("error") == "InconsistentTopicIdError", (role, outs[0])
        assert "re-created" in outs[0]["message"], outs[0]
    # No snapshot of the old incarnation (or past the new log's end) in the new topic.
    topic_id = Log(root).describe_topic("t").topic_id
    for snap in (root / "topics" / "t" / "0" / "snapshots").glob("*.snapshot"):
        body = unframe(snap.read_bytes())[0]
        assert body["topic_id"] == topic_id and body["end"] <= chain[-1].header.next_offset
    for out in outcomes["reader"]:
        if "ok" in out:
            assert out["ok"] == ["new-0"], out  # LSO held at the open transaction
    # Whatever failed once was refused clearly, and the process then went on.
    assert "ok" in outcomes["snapshotter"][1] and "ok" in outcomes["writer"][1]
    assert "ok" in outcomes["reader"][1]

    txn.abort_transaction()
    fresh = Log(root)
    assert fresh.end_offset("t", 0) == chain[-1].header.next_offset + 1  # + the ABORT marker
    visible = [v.decode() for v in fresh.read("t", 0).column("value").to_pylist()]
    assert visible == [v for v in values if v != "open-1"]


def _snapshot_files(root: Path) -> list[Path]:
    return sorted((root / "topics" / "t" / "0" / "snapshots").glob("*.snapshot"))


@pytest.mark.parametrize("damage", ["flipped byte", "zero length", "valid checksum over garbage",
                                    "another incarnation's snapshot"])
def test_bad_snapshot_is_skipped_with_a_warning_and_the_state_rebuilt(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    import crc32c

    from txlog.format.snapshot_frame import frame, unframe
    from txlog.partition.state_manager import SNAPSHOT_INTERVAL

    root = tmp_path / "log"
    log = Log(root)
    log.create_topic("t", 1)
    producer = log.producer(linger_ms=0)
    for i in range(SNAPSHOT_INTERVAL + 3):
        producer.send("t", b"v%d" % i, partition=0).get()
    expected = log.read("t", 0).column("value").to_pylist()
    [snap] = _snapshot_files(root)
    data = snap.read_bytes()
    if damage == "flipped byte":
        data = data[:20] + bytes([data[20] ^ 0x01]) + data[21:]
    elif damage == "zero length":
        data = b""
    elif damage == "valid checksum over garbage":
        body = msgpack.packb({"v": 2, "end": "x", "producers": 7})
        data = crc32c.crc32c(body).to_bytes(4, "big") + body
    else:
        fields, at = unframe(data)
        fields["topic_id"] = "0" * 32
        data = frame(fields, data[at:])
    snap.write_bytes(data)

    with caplog.at_level(logging.WARNING, logger="txlog.partition.state_manager"):
        fresh = Log(root)
        assert fresh.end_offset("t", 0) == SNAPSHOT_INTERVAL + 3
        assert fresh.read("t", 0).column("value").to_pylist() == expected
    assert any("skipping producer-state snapshot" in r.getMessage() for r in caplog.records)
    # The rebuilt state is the real one: the producer's next batch is in sequence.
    assert Log(root).producer(linger_ms=0).send("t", b"next", partition=0).get().offset == \
        SNAPSHOT_INTERVAL + 3


def test_topic_ids_distinguish_incarnations(tmp_path: Path) -> None:
    root = tmp_path / "log"
    log = Log(root)
    first = log.create_topic("t", 1)
    assert len(first.topic_id) == 32 and Log(root).describe_topic("t").topic_id == first.topic_id
    log.producer(linger_ms=0).send("t", b"old", partition=0).get()
    log.delete_topic("t")
    second = log.create_topic("t", 1)
    assert second.topic_id != first.topic_id
    log.producer(linger_ms=0).send("t", b"new", partition=0).get()
    # A range planned against the old incarnation is never read from the new one.
    with pytest.raises(InconsistentTopicIdError, match=first.topic_id):
        Log(root).read("t", 0, topic_id=first.topic_id)
    assert Log(root).read("t", 0, topic_id=second.topic_id).column(
        "value").to_pylist() == [b"new"]


def test_topics_created_without_an_id_get_a_stable_derived_one(tmp_path: Path) -> None:
    """topic.json written by older code has no topic_id: every process derives the same."""
    root = tmp_path / "log"
    Log(root).create_topic("t", 1)
    meta_path = root / "topics" / "t" / "topic.json"
    meta = msgpack.unpackb(meta_path.read_bytes())
    del meta["topic_id"]
    meta_path.write_bytes(msgpack.packb(meta))
    ids = {Log(root).describe_topic("t").topic_id for _ in range(2)}
    assert len(ids) == 1
    [derived] = ids
    assert len(derived) == 32
    meta["created_ms"] += 1  # a re-created topic: another creation time, another id
    meta_path.write_bytes(msgpack.packb(meta))
    assert Log(root).describe_topic("t").topic_id != derived
    log = Log(root)
    log.producer(linger_ms=0).send("t", b"x", partition=0).get()
    assert log.read("t", 0).column("value").to_pylist() == [b"x"]
