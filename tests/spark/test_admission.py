"""Tests of the stream reader's admission control (txlog.spark.admission), without a JVM."""

from __future__ import annotations

import random

import pytest

from txlog import Log
from txlog.spark.admission import backlog, limit_bytes, limit_rows

A, B, C = ("t", 0), ("t", 1), ("t", 2)


def test_rows_are_shared_in_proportion_to_backlog() -> None:
    start = {A: 0, B: 100, C: 5}
    end = {A: 900, B: 190, C: 15}  # backlogs 900, 90, 10
    limited = limit_rows(start, end, 100)
    assert limited == {A: 90, B: 109, C: 6}


def test_a_small_partition_is_not_starved_and_nothing_passes_the_end() -> None:
    start = {A: 0, B: 0}
    end = {A: 10_000, B: 1}
    assert limit_rows(start, end, 10) == {A: 9, B: 1}


def test_under_the_limit_everything_is_read() -> None:
    start = {A: 3, B: 7}
    end = {A: 5, B: 7}
    assert limit_rows(start, end, 100) == end


def test_row_limits_over_random_inputs() -> None:
    rng = random.Random(7)
    for _ in range(500):
        tps = [("t", p) for p in range(rng.randint(1, 6))]
        start = {tp: rng.randint(0, 50) for tp in tps}
        end = {tp: start[tp] + rng.choice([0, rng.randint(0, 2000)]) for tp in tps}
        limit = rng.randint(1, 3000)
        got = limit_rows(start, end, limit)
        assert set(got) == set(end)
        for tp in tps:
            assert start[tp] <= got[tp] <= end[tp]
            if end[tp] > start[tp]:
                assert got[tp] > start[tp], "a partition with backlog was starved"
        read = sum(got[tp] - start[tp] for tp in tps)
        waiting = sum(backlog(start, end).values())
        # Exact when all fits; otherwise the whole limit, plus at most one per starved
        # partition (a share under one is rounded up).
        if waiting <= limit:
            assert read == waiting
        else:
            assert limit <= read <= limit + len(tps)


def test_the_whole_budget_is_read_where_shares_round_down() -> None:
    """Spark's Kafka source rounds every share down: 1,000,000 offsets in 4 partitions
    under a budget of 100,000 then take 11 micro-batches, the last of a few records."""
    start = {A: 0, B: 0, C: 0}
    end = {A: 333_334, B: 333_333, C: 333_333}
    batches = 0
    while start != end:
        nxt = limit_rows(start, end, 100_000)
        assert sum(nxt[tp] - start[tp] for tp in start) == min(100_000, sum(
            end[tp] - start[tp] for tp in start))
        start, batches = nxt, batches + 1
    assert batches == 10


@pytest.fixture
def sized(memlog: Log) -> Log:
    """t-0: 10 batches of 10 records of 100-byte values; t-1: 1 batch of 10 records
    (uncompressed, so that every batch has the same size)."""
    memlog.create_topic("t", 2)
    producer = memlog.producer(linger_ms=3_600_000, compression="none")
    for batch in range(10):
        for i in range(10):
            producer.send("t", bytes(100), partition=0)
        producer.flush()
    for i in range(10):
        producer.send("t", bytes(100), partition=1)
    producer.flush()
    return memlog


def test_bytes_are_counted_by_batch(sized: Log) -> None:
    part = sized.partition("t", 0)
    batch_bytes = part.header(0).payload_length
    start, end = {A: 0}, {A: 100}
    assert limit_bytes(sized.services, start, end, 3 * batch_bytes) == {A: 30}
    assert limit_bytes(sized.services, start, end, 3 * batch_bytes + batch_bytes // 2) == {A: 30}
    assert limit_bytes(sized.services, start, end, 100 * batch_bytes) == {A: 100}
    # A range starting mid-batch counts only the part it reads, and stops at a batch end.
    assert limit_bytes(sized.services, {A: 5}, end, batch_bytes) == {A: 10}
    assert limit_bytes(sized.services, {A: 5}, end, 2 * batch_bytes) == {A: 20}
    # Less than one batch: a proportional part of it, at least one record.
    assert limit_bytes(sized.services, start, end, batch_bytes // 2) == {A: 5}
    assert limit_bytes(sized.services, start, end, 1) == {A: 1}


def test_bytes_are_shared_in_proportion_to_backlog(sized: Log) -> None:
    batch_bytes = sized.partition("t", 0).header(0).payload_length
    start, end = {A: 0, B: 0}, {A: 100, B: 10}
    got = limit_bytes(sized.services, start, end, 11 * batch_bytes // 2)
    assert got == {A: 50, B: 5}
