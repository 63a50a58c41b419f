"""A cold partition's read on an object store (docs/protocol.md 6.1): one listing names the
batch headers to read, read at once; the listing shows the end; a read of claims alone
needs no proof after its data.

Request counts are taken at the test S3 server (what a store bills); the other
tests run on memory storage that says it is remote, which turns the same paths on.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter

import pytest

from txlog import Log
from txlog.clients.sender import INLINE_PAYLOAD_BYTES
from txlog.partition.state_manager import SNAPSHOT_INTERVAL
from txlog.storage.schemes import open_storage

from helpers_core import CountingStorage

BATCHES = 12


def write_batches(log: Log, topic: str, batches: int, partition: int = 0) -> list[bytes]:
    """``batches`` flushes of two records each, random (incompressible) and large enough
    that each flush writes a data object and a claim (not a batch inline)."""
    values = []
    with log.producer() as producer:
        for _ in range(batches):
            for _ in range(2):
                values.append(os.urandom(INLINE_PAYLOAD_BYTES))
                producer.send(topic, values[-1], partition=partition)
            producer.flush()
    return values


def test_a_fresh_read_reads_each_header_once_and_lists_each_directory_once(
        s3_server, s3_root) -> None:
    options = s3_server.storage_options
    log = Log(s3_root, storage_options=options)
    log.create_topic("t", 2)
    values = write_batches(log, "t", BATCHES)
    fresh = Log(s3_root, storage_options=options, create=False)
    fresh.describe_topic("t")
    s3_server.reset_counts()
    s3_server.recording = True
    try:
        table = fresh.read("t", 0)
    finally:
        s3_server.recording = False
    assert table.column("value").to_pylist() == values
    requests = list(s3_server.log)
    batch_gets = Counter(t for k, t in requests if k == "GET" and t.endswith(".batch"))
    lists = Counter(t.split("?", 1)[1] for k, t in requests if k == "LIST")
    data_gets = [t for k, t in requests if k == "GET" and t.endswith(".data")]
    # Every batch (its claim) read exactly once: no header read twice, no read of the slot
    # past the end (the listing showed it empty), no anchor read after the data.
    assert len(batch_gets) == BATCHES and set(batch_gets.values()) == {1}, requests
    # The partition's directory listed once (by the refresh, for the read too); its
    # segments twice (the load, then the empty prefix's proof); its snapshots once.
    partition_lists = {q: n for q, n in lists.items() if "t%2F0%2F" in q or "t/0/" in q}
    assert sorted(partition_lists.values()) == [1, 1, 2], lists
    # The data: one ranged read per data object (one flush each).
    assert len(data_gets) == BATCHES
    assert sum(s3_server.counts.values()) == len(requests) == 2 * BATCHES + 4 + 1


class RemoteCounting(CountingStorage):
    """Memory storage that counts reads and says it waits on the network."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.remote = True
        self.on_list = None

    def publish_stream_if_absent(self, *args, **kwargs):
        return self.inner.publish_stream_if_absent(*args, **kwargs)

    def list(self, directory: str) -> list[str]:
        names = super().list(directory)
        if self.on_list is not None and directory == "topics/t/0":
            hook, self.on_list = self.on_list, None
            hook()
        return names


def remote_counting() -> RemoteCounting:
    return RemoteCounting(open_storage(f"memory://{uuid.uuid4().hex}", None))


def test_past_a_snapshot_only_the_headers_after_it_are_read() -> None:
    store = remote_counting()
    log = Log(store)
    log.create_topic("t", 1)
    values = write_batches(log, "t", SNAPSHOT_INTERVAL + 6)
    store.calls.clear()
    assert Log(store).read("t", 0).column("value").to_pylist() == values
    headers = Counter(store.paths("read_prefix"))
    bases = sorted(int(p.rsplit("/", 1)[1].split(".")[0]) for p in headers)
    anchor, last = bases[0], bases[-1]
    # The snapshot's anchor batch (read with the snapshot, then the state's proof), then
    # the 6 batches past the snapshot, each once; the last once more, as the proof after
    # the data (the claims below the snapshot were read by name, whole, in this call).
    assert len(bases) == 7 and bases == list(range(anchor, anchor + 14, 2)), headers
    assert {b: n for b, n in zip(bases, [headers[p] for p in sorted(headers)])} == \
        {b: 2 if b in (anchor, last) else 1 for b in bases}
    assert [p for m, p in store.calls if m == "list" and p == "topics/t/0"] == ["topics/t/0"]


def test_a_compacted_prefix_and_the_batches_after_it_read_whole() -> None:
    store = remote_counting()
    log = Log(store)
    log.create_topic("t", 1)
    values = write_batches(log, "t", 30)
    log.compact("t", min_batches=2, upto_lag=20)
    assert log.partition("t", 0).compacted_end() > 0
    values += write_batches(log, "t", 3)
    assert Log(store).read("t", 0).column("value").to_pylist() == values


def test_a_batch_appended_after_the_listing_is_read_by_the_next_read() -> None:
    """The listing showed the end: a batch appended just after it is not in this read
    (the read is as of the listing's instant) and no offset is skipped; the next read of
    the same Log finds it."""
    store = remote_counting()
    log = Log(store)
    log.create_topic("t", 1)
    values = write_batches(log, "t", 5)
    late: list[bytes] = []
    store.on_list = lambda: late.extend(write_batches(Log(store.inner), "t", 1))
    reader = Log(store)
    first = reader.read("t", 0)
    assert late and first.column("value").to_pylist() == values
    assert reader.read("t", 0).column("value").to_pylist() == values + late
    offsets = reader.read("t", 0).column("offset").to_pylist()
    assert offsets == list(range(len(offsets)))


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_a_bounded_read_stops_at_a_batch_boundary(memlog: Log, isolation: str) -> None:
    memlog.create_topic("t", 1)
    write_batches(memlog, "t", 4)
    part = memlog.partition("t", 0)
    one = part.header(0).header_length + part.header(0).payload_length
    pieces, end = part.read(0, None, isolation, max_bytes=1)
    assert (len(pieces), end) == (1, 2)  # at least one batch, whole
    pieces, end = part.read(0, None, isolation, max_bytes=one + 1)
    assert (len(pieces), end) == (2, 4)
    pieces, end = part.read(1, None, isolation, max_bytes=10**9)
    assert end == 8 and sum(len(p.offsets) for p in pieces) == 7


# --- a partition the topic's listing showed empty (docs/protocol.md 1.8) -----------------

def _unwritten_then(other: Log, log: Log, compact: bool) -> list[bytes]:
    """``log`` lists topic ``t`` (partition 0 holds nothing), then ``other`` writes three
    batches there (and compacts them into a segment, their objects deleted): ``log``'s
    first claim guesses an empty log that is not."""
    other.create_topic("t", 1)
    log.describe_topic("t")
    values = write_batches(other, "t", 3)
    if compact:
        assert other.compact("t", min_batches=2)[0]
        assert not [n for n in other.storage.list("topics/t/0") if n.endswith(".batch")]
    return values


@pytest.mark.parametrize("compact", [False, True], ids=["written", "written-and-compacted"])
def test_a_partition_written_since_its_topic_was_listed_is_claimed_at_its_end(
        compact: bool) -> None:
    """The guess of an empty log costs a lost slot (written since) or a stray claim
    (written and compacted since: slot 0 is free again, the check after the publish finds
    the segment); the batch lands at the log end either way, once."""
    store = open_storage(f"memory://{uuid.uuid4().hex}", None)
    other, log = Log(store), Log(store)
    values = _unwritten_then(other, log, compact)
    ours = os.urandom(INLINE_PAYLOAD_BYTES)
    with log.producer() as producer:
        offset = producer.send("t", ours, partition=0).get(10).offset
    assert offset == 6  # three flushes of two records
    assert Log(store).read("t", 0).column("value").to_pylist() == values + [ours]


def test_a_claims_guess_is_proven_without_a_listing_before_it(s3_server, s3_root) -> None:
    """On S3 (a delimited listing names the partitions and the chains as prefixes): the
    topic listed once, nothing of the unwritten partition listed or read before its
    claim; a written partition loaded with one listing of its directory."""
    options = s3_server.storage_options
    log = Log(s3_root, storage_options=options)
    log.create_topic("t", 2)
    write_batches(log, "t", 1, partition=1)
    fresh = Log(s3_root, storage_options=options, create=False)
    s3_server.reset_counts()
    s3_server.recording = True
    try:
        with fresh.producer() as producer:
            for p in (0, 1):
                producer.send("t", b"x", partition=p)
    finally:
        s3_server.recording = False
    lists = [t.split("prefix=log%2Ftopics%2F", 1)[1].split("&", 1)[0].replace("%2F", "/")
             for k, t in s3_server.log if k == "LIST" and "topics" in t]
    # Each claim's proof after its publish lists its segments (no anchor before it: the
    # written partition's state was loaded from nothing, section 1.6).
    assert lists[:2] == ["t/", "t/1/"] and sorted(lists[2:]) == ["t/0/segments/",
                                                                 "t/1/segments/"], lists
    gets = [t for k, t in s3_server.log if k == "GET" and "/0/" in t]
    assert gets == [], gets  # no slot read in the unwritten partition
    assert [fresh.read("t", p).num_rows for p in (0, 1)] == [1, 3]
