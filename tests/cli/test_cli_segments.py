"""``txlog`` on compacted partitions: compact, retention, topics describe/alter, dump and
verify over segments, and groups delete; every command run as its own process.

Expected values come from the files on disk and the library, never from what the
CLI happens to print.
"""

from __future__ import annotations

import functools
import json
import os
import shutil

import crc32c
import numpy as np
import pytest

from helpers_core import txlog_process
from test_cli import table
from txlog import Log
from txlog.format.segment import _HEADER, HEADER_SIZE, OFFSET_ENTRY, TIME_ENTRY, decode_head


def files(root: str, topic: str, partition: int, suffix: str) -> dict[int, int]:
    """Base offset -> size of the partition's objects ending in ``suffix``."""
    directory = os.path.join(root, "topics", topic, str(partition))
    if suffix == ".segment":
        directory = os.path.join(directory, "segments")
    if not os.path.isdir(directory):
        return {}
    return {int(n[:-len(suffix)]): os.path.getsize(os.path.join(directory, n))
            for n in os.listdir(directory) if n.endswith(suffix)}


def json_lines(done) -> list[dict]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture
def compacted(tmp_path) -> tuple[str, list[bytes]]:
    """Partition 0 of "events": 8 batches, an aborted transaction (data + marker) among
    them, compacted into segments of about 4 KB up to its last 2 offsets.
    Returns the root and the committed values in offset order."""
    root = str(tmp_path / "log")
    log = Log(root)
    log.create_topic("events", 2, {"segment.bytes": 4000})
    producer = log.producer()
    values = []
    for i in range(8):
        if i == 3:
            txn = log.producer(transactional_id="aborter")
            txn.init_transactions()
            txn.begin_transaction()
            txn.send("events", b"aborted", partition=0).get()
            txn.abort_transaction()
            txn.close()  # the marker lands behind the decision: at offset 4, before v3
        values.append(f"v{i}".encode())
        producer.send("events", values[-1], partition=0, timestamp_ms=1000 * (8 - i)).get()
    done = txlog_process(root, "compact", "events", "--lag", "2", "--json")
    assert done.returncode == 0, done.stderr
    return root, values


def test_compact_describe_alter_and_retention(tmp_path):
    root = str(tmp_path / "log")
    cli = functools.partial(txlog_process, root)
    log = Log(root)
    log.create_topic("events", 2)
    producer = log.producer()
    for i in range(7):
        producer.send("events", b"x" * 200, partition=0, timestamp_ms=1000 + i).get()

    done = cli("topics", "alter", "events", "--config", "segment.bytes=3000",
               "--config", "retention.ms=-1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "topic events config: retention.ms=-1, segment.bytes=3000"
    assert Log(root).describe_topic("events", refresh=True).config == \
        {"segment.bytes": 3000, "retention.ms": -1}

    batches_before = files(root, "events", 0, ".batch")
    rows = json_lines(cli("compact", "events", "--lag", "1", "--json"))
    segments = files(root, "events", 0, ".segment")
    left = files(root, "events", 0, ".batch")
    part = Log(root).partition("events", 0)
    assert part.compacted_end() == 6 and sorted(left) == [6]
    assert rows == [
        {"partition": 0, "segments_made": len(segments), "batches_merged": 6,
         "bytes": sum(segments.values()), "objects_before": len(batches_before),
         "objects_after": len(segments) + 1},
        {"partition": 1, "segments_made": 0, "batches_merged": 0, "bytes": 0,
         "objects_before": 0, "objects_after": 0}]
    assert len(segments) == 3  # segment.bytes=3000: two batches a segment

    desc = json_lines(cli("topics", "describe", "events", "--json"))[0]
    assert desc["config"] == {"retention.bytes": -1, "retention.ms": -1, "segment.bytes": 3000,
                              "producer.id.expiration.ms": 86_400_000}
    assert sorted(desc["default_config_keys"]) == ["producer.id.expiration.ms",
                                                   "retention.bytes"]
    assert desc["partition_offsets"][0] == {
        "partition": 0, "log_start_offset": 0, "log_end_offset": 7, "last_stable_offset": 7,
        "segments": len(segments), "segment_bytes": sum(segments.values()), "batches": 1,
        "batch_bytes": left[6]}
    text = cli("topics", "describe", "events").stdout
    assert "config: producer.id.expiration.ms=86400000 (default), retention.bytes=-1 (default), retention.ms=-1, segment.bytes=3000\n" in text

    # retention.bytes=1: every segment but the newest goes
    assert cli("topics", "alter", "events", "--config", "retention.bytes=1").returncode == 0
    newest = max(segments)
    done = cli("retention", "events", "--partition", "0")
    assert done.returncode == 0, done.stderr
    assert table(done.stdout) == [
        ["PARTITION", "SEGMENTS-DELETED", "BYTES-DELETED", "LOG-START-OFFSET"],
        ["0", str(len(segments) - 1), str(sum(segments.values()) - segments[newest]),
         str(newest)]]
    assert sorted(files(root, "events", 0, ".segment")) == [newest]
    assert Log(root).partition("events", 0).log_start() == newest
    verified = json_lines(cli("verify", "--json"))  # from a log start past 0
    assert [(r["segments"], r["batches"], r["problems"]) for r in verified] == \
        [(1, 7 - newest, []), (0, 0, [])]

    done = cli("topics", "alter", "events", "--delete-config", "retention.bytes",
               "--delete-config", "segment.bytes")
    assert done.stdout.strip() == "topic events config: retention.ms=-1"
    again = json_lines(cli("retention", "events", "--json"))
    assert again[0] == {"partition": 0, "segments_deleted": 0, "bytes_deleted": 0,
                        "log_start_offset": newest}


@pytest.mark.parametrize("argv, message", [
    (["topics", "alter", "events"], "give --partitions, --config or --delete-config"),
    (["topics", "alter", "events", "--config", "segment.bytes=10"],
     "segment.bytes must be an integer of at least 1024"),
    (["topics", "alter", "events", "--config", "max.message.bytes=10"],
     "config 'max.message.bytes' cannot be altered"),
    (["compact", "events", "--partition", "5"], "partition 5 does not exist"),
    (["retention", "nope"], "topic 'nope' does not exist"),
    (["groups", "delete", "nobody"], "group 'nobody' does not exist"),
])
def test_maintenance_errors_are_one_line(tmp_path, argv, message):
    root = str(tmp_path / "log")
    Log(root).create_topic("events", 1)
    done = txlog_process(root, *argv)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and message in done.stderr


def test_dump_walks_segments_then_batch_objects_and_lists_strays(compacted):
    root, values = compacted
    cli = functools.partial(txlog_process, root)
    (seg_base, _), *_ = sorted(files(root, "events", 0, ".segment").items())
    end = Log(root).partition("events", 0).compacted_end()
    # A stray: a batch object below the compacted end (as a late publish leaves one)
    directory = os.path.join(root, "topics", "events", "0")
    tail = min(files(root, "events", 0, ".batch"))
    shutil.copy(os.path.join(directory, f"{tail:020d}.batch"),
                os.path.join(directory, f"{end - 1:020d}.batch"))

    items = json_lines(cli("dump", "events", "0", "--json", "--records"))
    kinds = [i["kind"] for i in items]
    assert kinds[0] == "segment" and kinds[-1] == "stray" and kinds.count("stray") == 1
    batches = [i for i in items if i["kind"] == "batch"]
    log_end = Log(root).end_offset("events", 0)
    assert [b["baseOffset"] for b in batches] == list(range(log_end))  # 1 record each
    segments = [i for i in items if i["kind"] == "segment"]
    assert sum(s["batchCount"] for s in segments) == sum("position" in b for b in batches) \
        == end
    assert all(s["valid"] and s["indexCrcValid"] and s["snapshotCrcValid"] for s in segments)
    assert sum(s["abortedCount"] for s in segments) == 1
    markers = [b for b in batches if b["isControl"]]
    assert [(m["marker"], m["baseOffset"]) for m in markers] == [("ABORT", 4)]
    data = [b for b in batches if not b["isControl"] and not b["isTransactional"]]
    assert [r["value"].encode() for b in data for r in b["records"]] == values
    assert items[-1] == {"kind": "stray", "path": f"topics/events/0/{end - 1:020d}.batch",
                         "baseOffset": end - 1, "compactedEnd": end, "partOfLog": False}

    text = cli("dump", "events", "0", "--from", "1", "--max-batches", "2")
    lines = text.stdout.splitlines()
    assert text.returncode == 0 and len(lines) == 3
    assert lines[0].startswith("segment ") and f"baseOffset: {seg_base} " in lines[0]
    assert [ln.split("baseOffset: ")[1].split()[0] for ln in lines[1:]] == ["1", "2"]
    assert all(ln.startswith("  batch position: ") for ln in lines[1:])

    path = f"topics/events/0/segments/{seg_base:020d}.segment"
    one = json_lines(cli("dump", "--object", path, "--json"))
    assert one[0] == segments[0] and \
        [b["baseOffset"] for b in one[1:]] == list(range(segments[0]["endOffset"]))

    report = json_lines(cli("verify", "--json", "--topic", "events"))[0]
    assert report["problems"] == [] and report["strays"] == 1 and report["batches"] == log_end


def _rewrite_index(root: str, path: str, change) -> None:
    """Change a segment's index with ``change(offsets, times)`` and reseal its checksums,
    as a buggy compactor would have written it."""
    full = os.path.join(root, path)
    data = bytearray(open(full, "rb").read())
    head = decode_head(bytes(data), path, full, int(os.path.basename(path)[:20]))
    split = head.batch_count * OFFSET_ENTRY.itemsize
    offsets = np.frombuffer(data, OFFSET_ENTRY, head.batch_count, head.index_start).copy()
    times = np.frombuffer(data, TIME_ENTRY, head.data_batch_count,
                          head.index_start + split).copy()
    change(offsets, times)
    data[head.index_start:head.data_start] = offsets.tobytes() + times.tobytes()
    fields = list(_HEADER.unpack_from(data, 0))
    fields[12] = crc32c.crc32c(offsets.tobytes())
    fields[13] = crc32c.crc32c(times.tobytes())
    packed = _HEADER.pack(*fields)
    data[:HEADER_SIZE] = packed[:4] + crc32c.crc32c(packed[8:]).to_bytes(4, "big") + packed[8:]
    open(full, "wb").write(bytes(data))


def test_verify_names_the_segment_and_offset_of_each_damage(compacted):
    root, _ = compacted
    cli = functools.partial(txlog_process, root)
    (base, _), *_ = sorted(files(root, "events", 0, ".segment").items())
    path = f"topics/events/0/segments/{base:020d}.segment"
    full = os.path.join(root, path)
    pristine = open(full, "rb").read()
    items = json_lines(cli("dump", "--object", path, "--json"))
    seg, batches = items[0], items[1:]
    head = decode_head(pristine, path, full, base)

    def problems() -> list[str]:
        done = cli("verify", "--json", "--topic", "events")
        assert done.returncode == 1 and done.stderr.strip().endswith("found")
        return json.loads(done.stdout.splitlines()[0])["problems"]

    # one byte of the offset index: the low byte of entry 1's size
    damaged = bytearray(pristine)
    damaged[head.index_start + 2 * OFFSET_ENTRY.itemsize - 1] ^= 0x01
    open(full, "wb").write(bytes(damaged))
    found = problems()
    assert f"{path}: segment offset index checksum mismatch (or truncated)" in found
    b1 = batches[1]
    assert any(p.startswith(f"{path} offset 1 (position {b1['position']}): offset-index "
                            f"entry 1 says base 1") and p.endswith(f"is {b1['size']} bytes")
               for p in found), found

    # one byte of a batch's payload inside the segment
    damaged = bytearray(pristine)
    b2 = batches[2]
    damaged[b2["position"] + b2["size"] - 3] ^= 0xFF
    open(full, "wb").write(bytes(damaged))
    assert problems() == [f"{path} offset 2 (position {b2['position']}): payload checksum "
                          "mismatch"]
    dumped = cli("dump", "--object", path)
    assert dumped.returncode == 1 and dumped.stderr.strip() == \
        "txlog: error: 1 batch failed a check"

    # sealed with valid checksums but wrong: a time-index entry, then an index size
    open(full, "wb").write(pristine)

    def bump_time(offsets, times):
        times["max_timestamp"][0] += 1

    _rewrite_index(root, path, bump_time)
    found = problems()
    assert len(found) == 1 and found[0].startswith(f"{path} offset 0: time-index entry 0 says")
    open(full, "wb").write(pristine)

    def grow(offsets, times):
        offsets["size"][0] += 1
        offsets["position"][1:] += 1

    _rewrite_index(root, path, grow)
    found = problems()
    assert found[0] == (f"{path} offset 0 (position {batches[0]['position']}): offset-index "
                        f"entry 0 says base 0, position {batches[0]['position']}, size "
                        f"{batches[0]['size'] + 1}; the batch there is {batches[0]['size']} bytes")
    assert len(found) == len(batches)  # each entry after it names a wrong position
    open(full, "wb").write(pristine)
    assert cli("verify").returncode == 0
    assert seg["valid"]

    # Without segments the log starts at 0: a lost first batch object is a hole, not a start
    producer = Log(root).producer()
    for value in (b"a", b"b"):
        producer.send("events", value, partition=1).get()
    os.remove(os.path.join(root, "topics", "events", "1", f"{0:020d}.batch"))
    done = cli("verify", "--json")
    assert done.returncode == 1
    assert json.loads(done.stdout.splitlines()[1])["problems"] == [
        f"topics/events/1/{1:020d}.batch: starts at offset 1, but the batch before ends at 0 "
        "(offsets must be contiguous)"]


def test_groups_delete_leaves_a_tombstone_and_a_later_commit_starts_afresh(tmp_path):
    root = str(tmp_path / "log")
    cli = functools.partial(txlog_process, root)
    log = Log(root)
    log.create_topic("events", 2)
    log.commit_offsets("gone", {("events", 0): 5})
    log.commit_offsets("gone", {("events", 1): 2})
    log.commit_offsets("kept", {("events", 0): 1})
    chain = os.path.join(root, "coordinator", "groups", "gone")
    versions = sorted(os.listdir(chain))

    done = cli("groups", "delete", "gone")
    assert done.returncode == 0 and done.stdout == "deleted group gone\n"
    assert sorted(os.listdir(chain))[:len(versions)] == versions  # nothing removed
    assert len(os.listdir(chain)) == len(versions) + 1
    assert cli("groups", "list").stdout == "kept\n"
    assert Log(root).committed("gone") == {}
    gone = cli("groups", "describe", "gone")
    assert gone.returncode == 1 and "no committed offsets" in gone.stderr
    again = cli("groups", "delete", "gone")
    assert again.returncode == 1 and again.stderr.strip() == \
        "txlog: error: group 'gone' does not exist (it was deleted)"

    Log(root).commit_offsets("gone", {("events", 1): 7})
    rows = json_lines(cli("groups", "describe", "gone", "--json"))
    assert [(r["partition"], r["committed_offset"]) for r in rows] == [(1, 7)]
    assert cli("groups", "list").stdout == "gone\nkept\n"
