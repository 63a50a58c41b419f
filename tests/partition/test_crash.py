"""Crashes and damage: what a killed writer or a flipped bit leaves behind.

A writer killed with SIGKILL at any moment, including inside a publish, must
leave a log whose every visible batch is complete: publishing links a fully
written, fsynced temp file into place, so a batch is either all there or not
there.  Damage that does reach a batch file (a flipped bit, a truncation) must
surface as CorruptBatchError naming the file and the offset, never as a silent
skip or as wrong records.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from txlog import CorruptBatchError, Log
from txlog.format.batch import decode_header, payload_of

from helpers_core import batch_files, child, read_chain, tmp_files, wait_for

VALUE_SIZE = 1 << 20  # 1 MiB values, 4 per batch: several MiB per publish
PER_BATCH = 4


def verify_log(root: Path) -> int:
    """Check every batch fully and every record's self-check; return the log end."""
    chain = read_chain(root, "t", 0)  # gap-free, checksums pass, names match headers
    for batch in chain:
        for key, value in zip(batch.keys, batch.values, strict=True):
            assert hashlib.sha256(value).digest() == key, f"bad record in {batch.path}"
    end = chain[-1].header.next_offset if chain else 0
    log = Log(root)  # a fresh process's view
    assert log.end_offset("t", 0) == end
    table = log.read("t", 0)
    assert table.column("offset").to_pylist() == list(range(end))
    for key, value in zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True):
        assert hashlib.sha256(value).digest() == key
    return end


def append_and_check(root: Path, end: int) -> None:
    """The next writer continues the chain right at the end."""
    log = Log(root)
    value = os.urandom(1000)
    md = log.producer().send("t", value, key=hashlib.sha256(value).digest(), partition=0).get()
    assert md.offset == end
    assert verify_log(root) == end + 1


def test_sigkill_at_random_moments_leaves_a_clean_log(tmp_path: Path) -> None:
    root = tmp_path / "log"
    Log(root).create_topic("t", 1)
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    end = 0
    for iteration in range(5):
        before = len(batch_files(root, "t", 0))
        proc = subprocess.Popen(child("crash-loop", root, "t", VALUE_SIZE, PER_BATCH),
                                stderr=subprocess.PIPE)
        try:
            wait_for(lambda: len(batch_files(root, "t", 0)) > before or proc.poll() is not None,
                     60, "the writer to publish its first batch")
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            # The kill lands at a random point of the writer's loop (seed in the message).
            time.sleep(rng.uniform(0, 0.3))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
        assert proc.returncode == -signal.SIGKILL
        new_end = verify_log(root)
        assert new_end > end, f"seed {seed}, iteration {iteration}: no progress"
        end = new_end
    append_and_check(root, end)


@pytest.mark.parametrize("point", ["mid-write", "before-link", "after-link"])
def test_sigkill_inside_publish(tmp_path: Path, point: str) -> None:
    """Kill the writer at exact points of a publish (it patches os.link/os.write in itself)."""
    root = tmp_path / "log"
    Log(root).create_topic("t", 1)
    proc = subprocess.run(child("crash-at", root, "t", point, 3 << 20, 2),
                          stderr=subprocess.PIPE, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()

    leftovers = tmp_files(root, "t", 0)
    assert len(leftovers) == 1, "the kill should have left the publish's temp file"
    chain = read_chain(root, "t", 0)
    visible = 3 if point == "after-link" else 2
    assert len(chain) == visible
    end = verify_log(root)
    assert end == visible

    tmp = leftovers[0]
    if point == "mid-write":
        with pytest.raises(CorruptBatchError):  # a half-written batch...
            data = tmp.read_bytes()
            payload_of(data, decode_header(data, str(tmp), end), str(tmp))
    elif point == "before-link":
        data = tmp.read_bytes()  # ...or a complete one, but never published
        payload_of(data, decode_header(data, str(tmp), end), str(tmp))
    else:
        assert os.path.samefile(tmp, chain[-1].path)  # linked, temp name not yet removed

    assert tmp.name not in Log(root).storage.list("topics/t/0")
    append_and_check(root, end)
    assert tmp.exists(), "leftover temp files are harmless and left alone"


# --- damaged batch files ----------------------------------------------------------------


def damaged_log(tmp_path: Path) -> tuple[Path, list[Path], list[list[bytes]]]:
    root = tmp_path / "log"
    log = Log(root)
    log.create_topic("t", 1)
    producer = log.producer(linger_ms=3_600_000)
    values = []
    for b in range(5):
        batch = [b"batch%d-record%d" % (b, r) * 50 for r in range(3)]
        for v in batch:
            producer.send("t", v, partition=0)
        producer.flush()
        values.append(batch)
    return root, batch_files(root, "t", 0), values


def assert_names(exc: CorruptBatchError, path: Path, offset: int) -> None:
    assert exc.path == str(path) and exc.offset == offset
    assert str(path) in str(exc) and f"offset {offset}" in str(exc)


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["payload-flip", "truncate-payload", "extend"])
def test_damaged_payload_is_reported_and_the_rest_still_reads(tmp_path: Path,
                                                              damage: str) -> None:
    root, files, values = damaged_log(tmp_path)
    target = files[2]
    header = decode_header(target.read_bytes(), str(target), 6)
    if damage == "payload-flip":
        flip(target, header.header_length + header.payload_length // 2)
    elif damage == "truncate-payload":
        os.truncate(target, header.header_length + header.payload_length // 2)
    else:
        with open(target, "ab") as f:
            f.write(b"\0")
    log = Log(root)
    for start, end in [(6, 9), (0, 15), (8, 10), (7, 8)]:
        with pytest.raises(CorruptBatchError) as info:
            log.read("t", 0, start, end)
        assert_names(info.value, target, 6)
    # Ranges that do not touch the damaged batch read exactly what was written.
    assert log.read("t", 0, 0, 6).column("value").to_pylist() == values[0] + values[1]
    assert log.read("t", 0, 9).column("value").to_pylist() == values[3] + values[4]
    consumer = log.consumer(auto_offset_reset="earliest")
    consumer.assign([("t", 0)])
    assert [r.value for r in consumer.poll(max_records=6)] == values[0] + values[1]
    with pytest.raises(CorruptBatchError):
        consumer.poll()
    assert consumer.position("t", 0) == 6, "the consumer must not move past the damage"


@pytest.mark.parametrize("damage", ["magic", "header-field", "header-crc", "truncate-header"])
def test_damaged_header_stops_the_partition_with_a_precise_error(tmp_path: Path,
                                                                 damage: str) -> None:
    """A damaged header hides where the next batch starts, so the log end is unknown.

    A fresh reader or writer must therefore refuse the partition (rather than
    treat the damaged batch as the end and misreport or overwrite the log),
    with an error naming the file and offset.  A reader that had already read
    the headers can still serve ranges before the damage.
    """
    root, files, values = damaged_log(tmp_path)
    early = Log(root)
    assert early.end_offset("t", 0) == 15  # this reader learned the headers before damage
    target = files[2]
    if damage == "magic":
        flip(target, 0)
    elif damage == "header-field":
        flip(target, 40)  # inside the producer id
    elif damage == "header-crc":
        flip(target, 5)
    else:
        os.truncate(target, 30)

    fresh = Log(root)
    for call in (lambda: fresh.end_offset("t", 0), lambda: fresh.read("t", 0, 0, 3),
                 lambda: fresh.read("t", 0, 6, 9)):
        with pytest.raises(CorruptBatchError) as info:
            call()
        assert_names(info.value, target, 6)
    with pytest.raises(CorruptBatchError) as info:
        Log(root).producer().send("t", b"more", partition=0).get()
    assert_names(info.value, target, 6)
    assert len(batch_files(root, "t", 0)) == 5, "nothing may be written past the damage"

    assert early.read("t", 0, 0, 6).column("value").to_pylist() == values[0] + values[1]
    with pytest.raises(CorruptBatchError) as info:
        early.read("t", 0, 5, 7)
    assert_names(info.value, target, 6)


def test_missing_batch_file_is_reported_to_a_reader_that_knows_the_chain(
        tmp_path: Path) -> None:
    """A reader whose state already covers a batch reports its file gone, not a short read.

    (A fresh process cannot tell a lost file from the log end without listing
    the whole partition; batch files are never deleted by design.)
    """
    root, files, _ = damaged_log(tmp_path)
    log = Log(root)
    assert log.end_offset("t", 0) == 15
    files[2].unlink()
    with pytest.raises(CorruptBatchError, match="missing") as info:
        log.read("t", 0, 0)
    assert_names(info.value, files[2], 6)
