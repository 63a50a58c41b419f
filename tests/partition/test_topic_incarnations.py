"""A topic deleted and re-created is a new incarnation (KIP-516): nothing cached from
the old one (state, snapshots, sequences) is applied to it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import logging

import msgpack
import pytest

from txlog import InconsistentTopicIdError, Log, TxlogError
from txlog.format.snapshot_frame import unframe

from helpers_core import child, read_chain, wait_for


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
    txn.close()  # the abort returned at its decision; closing waits for its marker
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
