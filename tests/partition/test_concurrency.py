"""Several OS processes appending to the same partition at once.

This is the claim the whole design rests on: with publish-if-absent slot
claiming, concurrent writers produce a gap-free chain with unique offsets, and
every acknowledged record is in the log exactly once, at the offset it was
acknowledged with, in its producer's send order.  The children are real
processes (no shared memory, no shared caches), started together behind a
start signal so their appends genuinely overlap.

Each test runs on every backend: a local directory, ``memory://`` and S3
(moto's server, tests/harness/s3_server.py; children reach it through the AWS
environment variables).  The chain is checked independently of the library by
copying the partition's objects into a directory and reading them there.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest
from kafka.partitioner.default import murmur2 as kafka_murmur2

from helpers_core import Root, child, make_root, wait_for

WORKERS = 4
RECORDS_PER_BATCH = 3
# Per backend: a request to the test S3 server costs milliseconds where a local
# publish costs tens of microseconds, so S3 runs fewer appends of the same kind.
# (An append that wins its slot costs two requests, so S3 workers need enough of them
# to still be appending when the others start.)
BATCHES_PER_WORKER = {"file": 600, "s3": 30, "memory": 0}
KEYED_RECORDS = {"file": 250, "s3": 8, "memory": 0}
THREAD_SENDS = {"file": 100, "memory": 100, "s3": 12, "gcs": 12, "azure": 6}

def run_children(tmp_path: Path, commands: list[list[str]], timeout: float = 240,
                 env: dict[str, str] | None = None) -> list[dict]:
    """Start all children, release them at once, return their result files."""
    go = tmp_path / "go"
    procs = [subprocess.Popen(cmd, stderr=subprocess.PIPE, env=env) for cmd in commands]
    go.write_text("go")
    results = []
    try:
        for i, proc in enumerate(procs):
            _, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, f"child {i} failed:\n{err.decode()}"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for i in range(len(commands)):
        results.append(json.loads((tmp_path / f"result-{i}.json").read_text()))
    return results


def test_processes_appending_to_one_partition(proc_root: Root, tmp_path: Path) -> None:
    batches = BATCHES_PER_WORKER[proc_root.backend]
    proc_root.log().create_topic("t", 1)
    commands = [child("append", proc_root.url, "t", 0, batches, RECORDS_PER_BATCH, w,
                      tmp_path / f"result-{w}.json", tmp_path / "go") for w in range(WORKERS)]
    results = run_children(tmp_path, commands, env=proc_root.env)

    # The objects alone: base offsets chain from 0 without a gap, every checksum passes.
    chain = proc_root.chain("t", 0, tmp_path)
    assert len(chain) == WORKERS * batches
    total = WORKERS * batches * RECORDS_PER_BATCH
    assert chain[-1].header.next_offset == total

    at_offset: dict[int, bytes] = {}
    for batch in chain:
        for i, value in enumerate(batch.values):
            assert batch.header.base_offset + i not in at_offset
            at_offset[batch.header.base_offset + i] = value
    assert sorted(at_offset) == list(range(total))  # no gap, no duplicate offset

    producer_ids = {r["producer_id"] for r in results}
    assert len(producer_ids) == WORKERS
    acked_offsets: set[int] = set()
    for w, result in enumerate(results):
        acked = result["acked"]
        assert len(acked) == batches * RECORDS_PER_BATCH
        offsets = [offset for _, offset in acked]
        assert offsets == sorted(offsets), f"worker {w}: records out of send order"
        for value, offset in acked:
            assert at_offset[offset] == value.encode(), (w, value, offset)
        acked_offsets.update(offsets)
    # Every record in the log was acknowledged to exactly one worker: no strays, no copies.
    assert acked_offsets == set(at_offset)
    assert len(set(at_offset.values())) == total

    # Each worker's batches carry its own consecutive sequences.
    sequences: dict[int, list[int]] = {}
    for batch in chain:
        sequences.setdefault(batch.header.producer_id, []).append(batch.header.base_sequence)
    for pid, seqs in sequences.items():
        assert seqs == [i * RECORDS_PER_BATCH for i in range(batches)], pid

    # The appends really were concurrent: the workers' batches interleave.
    owners = [batch.header.producer_id for batch in chain]
    switches = sum(a != b for a, b in zip(owners, owners[1:]))
    assert switches >= 2 * WORKERS, "workers ran one after another; the test proved nothing"

    # And the library's own reader agrees with the objects.
    table = proc_root.log().read("t", 0)
    assert table.column("offset").to_pylist() == list(range(total))
    assert table.column("value").to_pylist() == [at_offset[o] for o in range(total)]


def test_processes_appending_to_several_partitions_by_key(proc_root: Root,
                                                          tmp_path: Path) -> None:
    partitions, workers, records = 4, 3, KEYED_RECORDS[proc_root.backend]
    proc_root.log().create_topic("k", partitions)
    commands = [child("keyed", proc_root.url, "k", records, w, tmp_path / f"result-{w}.json",
                      tmp_path / "go") for w in range(workers)]
    results = run_children(tmp_path, commands, env=proc_root.env)

    log = proc_root.log()
    contents: dict[int, dict[int, tuple[bytes, bytes]]] = {}
    for p in range(partitions):
        chain = proc_root.chain("k", p, tmp_path)  # gap-free chain in every partition
        table = log.read("k", p)
        assert table.column("offset").to_pylist() == list(range(
            chain[-1].header.next_offset if chain else 0))
        contents[p] = {o: (k, v) for o, k, v in zip(table.column("offset").to_pylist(),
                                                    table.column("key").to_pylist(),
                                                    table.column("value").to_pylist(), strict=True)}
    seen: set[tuple[int, int]] = set()
    for result in results:
        last_offset: dict[int, int] = {}
        for key_hex, value, partition, offset in result["acked"]:
            key = bytes.fromhex(key_hex)
            assert partition == (kafka_murmur2(key) & 0x7FFFFFFF) % partitions
            assert contents[partition][offset] == (key, value.encode())
            assert offset > last_offset.get(partition, -1), "send order broken"
            last_offset[partition] = offset
            assert (partition, offset) not in seen
            seen.add((partition, offset))
    assert len(seen) == workers * records == sum(len(c) for c in contents.values())
    assert all(contents[p] for p in range(partitions)), "the keys should cover all partitions"


def test_threads_with_separate_logs_on_one_root(every_root: Root, tmp_path: Path) -> None:
    """Threads behave like processes: each Log has its own caches of the partition."""
    any_root = every_root
    sends = THREAD_SENDS[any_root.backend]
    any_root.log().create_topic("t", 1)
    acked: dict[int, list[tuple[int, bytes]]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def work(w: int) -> None:
        try:
            producer = any_root.log().producer(linger_ms=0)
            barrier.wait()
            acked[w] = [(producer.send("t", b"%d-%d" % (w, i), partition=0).get().offset,
                         b"%d-%d" % (w, i)) for i in range(sends)]
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    values = [v for batch in any_root.chain("t", 0, tmp_path) for v in batch.values]
    assert len(values) == 4 * sends
    for w, pairs in acked.items():
        assert [o for o, _ in pairs] == sorted(o for o, _ in pairs)
        for offset, value in pairs:
            assert values[offset] == value


def test_producer_id_blocks_are_unique_across_processes(tmp_path: Path) -> None:
    """On a local root only: claiming a block is one publish, and 16 processes racing for
    each of 100 names on S3 is test_object_store.py's race test (memory:// cannot be
    shared between processes)."""
    proc_root = make_root("file", tmp_path)
    processes = 4
    proc_root.log()
    per_process = 1500  # crosses a block boundary in every process
    commands = [child("alloc-ids", proc_root.url, per_process, tmp_path / f"result-{w}.json",
                      tmp_path / "go") for w in range(processes)]
    results = run_children(tmp_path, commands, env=proc_root.env)
    ids = [i for r in results for i in r["ids"]]
    assert len(ids) == processes * per_process
    assert len(set(ids)) == len(ids), "two processes were handed the same producer id"
    # In this process too, a second Log gets ids nobody else has.
    more = {proc_root.log().producer_ids.next_id() for _ in range(3)}
    assert not more & set(ids)


def test_wait_for_times_out() -> None:
    """The polling helper the process tests rely on must fail, not hang."""
    with pytest.raises(AssertionError, match="never"):
        wait_for(lambda: False, 0.05, "never")
