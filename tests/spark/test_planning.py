"""Tests of planned reads: positions and isolation (txlog.clients.positions,
txlog.partition.isolation) and txlog.spark.planning (plan(), Subscription, split(), read_range()).

These run without Spark: the Spark source only maps its options onto these
functions, so what "earliest", "latest", a timestamp or the LSO mean is
decided (and checked) here.  Expected offsets and values are always derived
from what the test itself wrote (the offsets the producer acknowledged).
"""

from __future__ import annotations

import logging
import random

import pyarrow as pa
import pytest

from txlog import (READ_COMMITTED, READ_UNCOMMITTED, InconsistentTopicIdError, InvalidConfigError,
                   Log, OffsetOutOfRangeError, UnknownPartitionError, UnknownTopicError)
from txlog.partition.partition_log import PartitionLog
from txlog.clients.positions import bounds, read_limit
from txlog.partition.isolation import check_isolation_level
from txlog.spark.planning import (EARLIEST, LATEST, OffsetRange, PositionSpec, Subscription, plan,
                                  read_range, split)

T = "t"


# --- helpers --------------------------------------------------------------------------------


def send_each(producer, values: list[str], partition: int = 0, topic: str = T,
              timestamps: list[int] | None = None) -> list[int]:
    """Send each value as its own batch; returns the acknowledged offsets."""
    offsets = []
    for i, v in enumerate(values):
        ts = None if timestamps is None else timestamps[i]
        fut = producer.send(topic, v.encode(), partition=partition, timestamp_ms=ts)
        producer.flush()
        offsets.append(fut.get().offset)
    return offsets


def send_batch(producer, values: list[str], partition: int = 0, topic: str = T,
               timestamps: list[int] | None = None) -> list[int]:
    """Send all values as one batch (the producer must linger); returns their offsets."""
    futures = [producer.send(topic, v.encode(), partition=partition,
                             timestamp_ms=None if timestamps is None else timestamps[i])
               for i, v in enumerate(values)]
    producer.flush()
    offsets = [f.get().offset for f in futures]
    assert offsets == list(range(offsets[0], offsets[0] + len(values))), "not one batch"
    return offsets


def plain(log: Log, linger: bool = False):
    return log.producer(linger_ms=3_600_000 if linger else 0)


def txn_producer(log: Log, txn_id: str = "tx", linger: bool = False):
    p = log.producer(transactional_id=txn_id, linger_ms=3_600_000 if linger else 0)
    p.init_transactions()
    return p


def values_of(table: pa.Table | list[pa.RecordBatch]) -> list[str]:
    if isinstance(table, list):
        table = pa.Table.from_batches(table) if table else None
        if table is None:
            return []
    return [v.decode() for v in table.column("value").to_pylist()]


def ranges_by_tp(ranges: list[OffsetRange]) -> dict[tuple[str, int], tuple[int, int]]:
    out = {}
    for r in ranges:
        assert (r.topic, r.partition) not in out, "plan() returned a partition twice"
        out[(r.topic, r.partition)] = (r.start, r.end)
    return out


def earliest() -> PositionSpec:
    return PositionSpec("earliest")


def latest() -> PositionSpec:
    return PositionSpec("latest")


@pytest.fixture
def two_parts(memlog: Log) -> Log:
    """Topic ``t`` with 2 partitions: 5 records in partition 0, 3 in partition 1."""
    memlog.create_topic(T, 2)
    p = plain(memlog)
    assert send_each(p, [f"a{i}" for i in range(5)], 0) == [0, 1, 2, 3, 4]
    assert send_each(p, [f"b{i}" for i in range(3)], 1) == [0, 1, 2]
    return memlog


@pytest.fixture
def open_txn(memlog: Log):
    """Partition t-0: 3 plain records, an open transaction of 2, then 2 plain records.

    Returns (log, transactional producer).  Offsets: plain 0-2, txn 3-4, plain 5-6.
    """
    memlog.create_topic(T, 1)
    p = plain(memlog)
    tx = txn_producer(memlog)
    assert send_each(p, ["p0", "p1", "p2"]) == [0, 1, 2]
    tx.begin_transaction()
    assert send_each(tx, ["x0", "x1"]) == [3, 4]
    assert send_each(p, ["p3", "p4"]) == [5, 6]
    return memlog, tx


# --- bounds / read_limit / isolation levels -------------------------------------------------


def test_bounds_stop_at_lso_under_read_committed_and_at_log_end_otherwise(open_txn) -> None:
    log, tx = open_txn
    b = bounds(log.services, T, 0)
    assert (b.topic, b.partition, b.log_start, b.stable, b.end) == (T, 0, 0, 3, 7)
    assert b.topic_id == log.describe_topic(T).topic_id and b.topic_id
    assert b.limit(READ_COMMITTED) == 3
    assert b.limit(READ_UNCOMMITTED) == 7
    assert read_limit(log.services, T, 0, READ_COMMITTED) == 3
    assert read_limit(log.services, T, 0, READ_UNCOMMITTED) == 7

    tx.commit_transaction()
    # Decided, its marker still to come: the decision resolves the transaction.
    b = bounds(log.services, T, 0)
    assert (b.stable, b.end) in ((7, 7), (8, 8))
    tx.flush()  # and the roll-forward behind the commit: the COMMIT marker takes offset 7
    b = bounds(log.services, T, 0)
    assert (b.stable, b.end) == (8, 8)
    assert read_limit(log.services, T, 0, READ_COMMITTED) == \
        read_limit(log.services, T, 0, READ_UNCOMMITTED) == 8


@pytest.mark.parametrize("bad", ["read_commited", "READ_COMMITTED", "", "committed"])
def test_isolation_level_errors_name_the_bad_value(open_txn, bad: str) -> None:
    log, _ = open_txn
    for call in (lambda: check_isolation_level(bad),
                 lambda: bounds(log.services, T, 0).limit(bad),
                 lambda: read_limit(log.services, T, 0, bad),
                 lambda: plan(log.services, [(T, 0)], earliest(), latest(), isolation_level=bad)):
        with pytest.raises(InvalidConfigError) as err:
            call()
        assert repr(bad) in str(err.value)
        assert READ_COMMITTED in str(err.value) and READ_UNCOMMITTED in str(err.value)
    assert check_isolation_level(READ_UNCOMMITTED) == READ_UNCOMMITTED


# --- plan(): positions ------------------------------------------------------------------------


def test_plan_earliest_to_latest_covers_each_partition(two_parts: Log) -> None:
    log = two_parts
    ranges = plan(log.services, [(T, 0), (T, 1)], earliest(), latest())
    assert ranges_by_tp(ranges) == {(T, 0): (0, 5), (T, 1): (0, 3)}
    assert {r.topic_id for r in ranges} == {log.describe_topic(T).topic_id}
    # latest -> latest: nothing to read yet, positioned at the end
    assert ranges_by_tp(plan(log.services, [(T, 0), (T, 1)], latest(), latest())) == \
        {(T, 0): (5, 5), (T, 1): (3, 3)}


def test_plan_per_partition_offsets_with_sentinels(two_parts: Log) -> None:
    log = two_parts
    tps = [(T, 0), (T, 1)]
    start = PositionSpec("offsets", offsets={(T, 0): 2, (T, 1): EARLIEST})
    end = PositionSpec("offsets", offsets={(T, 0): LATEST, (T, 1): 2})
    assert ranges_by_tp(plan(log.services, tps, start, end)) == {(T, 0): (2, 5), (T, 1): (0, 2)}
    start = PositionSpec("offsets", offsets={(T, 0): LATEST, (T, 1): 1})
    end = PositionSpec("offsets", offsets={(T, 0): LATEST, (T, 1): EARLIEST})
    # an end before the start gives an empty range at the start, never a negative one
    assert ranges_by_tp(plan(log.services, tps, start, end)) == {(T, 0): (5, 5), (T, 1): (1, 1)}
    # an end past the log end fails, or with failOnDataLoss false is capped there
    end = PositionSpec("offsets", offsets={(T, 0): 1000, (T, 1): 1000})
    with pytest.raises(OffsetOutOfRangeError, match="ending offset 1000 of t-0"):
        plan(log.services, tps, earliest(), end)
    assert ranges_by_tp(plan(log.services, tps, earliest(), end, fail_on_data_loss=False)) == \
        {(T, 0): (0, 5), (T, 1): (0, 3)}


@pytest.mark.parametrize("bad", [-3, -100])
def test_plan_refuses_negative_offsets_other_than_sentinels(two_parts: Log, bad: int) -> None:
    log = two_parts
    tps = [(T, 0), (T, 1)]
    with pytest.raises(InvalidConfigError) as err:
        plan(log.services, tps, PositionSpec("offsets", offsets={(T, 0): 0, (T, 1): bad}), latest())
    assert f"offset {bad} for {T}-1" in str(err.value)
    assert "starting position" in str(err.value)
    with pytest.raises(InvalidConfigError) as err:
        plan(log.services, tps, earliest(), PositionSpec("offsets", offsets={(T, 0): bad, (T, 1): 1}))
    assert f"offset {bad} for {T}-0" in str(err.value)
    assert "ending position" in str(err.value)


@pytest.fixture
def timed(memlog: Log) -> Log:
    """Partition 0: timestamps 1000, 1000, 2000 (one batch), 3000, 3000, 4000 (one batch);
    partition 1: 500, 2500, 2500, each its own batch."""
    memlog.create_topic(T, 2)
    p = plain(memlog, linger=True)
    assert send_batch(p, ["a0", "a1", "a2"], 0, timestamps=[1000, 1000, 2000]) == [0, 1, 2]
    assert send_batch(p, ["a3", "a4", "a5"], 0, timestamps=[3000, 3000, 4000]) == [3, 4, 5]
    assert send_each(p, ["b0", "b1", "b2"], 1, timestamps=[500, 2500, 2500]) == [0, 1, 2]
    return memlog


@pytest.mark.parametrize("ts, expected", [
    (0, {(T, 0): 0, (T, 1): 0}),
    (500, {(T, 0): 0, (T, 1): 0}),       # inclusive: exactly 500 is included
    (501, {(T, 0): 0, (T, 1): 1}),
    (1000, {(T, 0): 0, (T, 1): 1}),
    (1001, {(T, 0): 2, (T, 1): 1}),      # inside the first batch of partition 0
    (2500, {(T, 0): 3, (T, 1): 1}),      # first of two equal timestamps
    (3000, {(T, 0): 3, (T, 1): 3}),      # nothing that late in t-1: latest (its end)
    (3001, {(T, 0): 5, (T, 1): 3}),
    (4000, {(T, 0): 5, (T, 1): 3}),
])
def test_plan_start_by_timestamp_is_first_offset_at_or_after(timed: Log, ts: int,
                                                             expected: dict) -> None:
    ranges = plan(timed.services, [(T, 0), (T, 1)], PositionSpec("timestamp", timestamp=ts), latest())
    ends = {(T, 0): 6, (T, 1): 3}
    assert ranges_by_tp(ranges) == {tp: (expected[tp], ends[tp]) for tp in expected}


def test_plan_per_partition_timestamps_and_ending_timestamp(timed: Log) -> None:
    tps = [(T, 0), (T, 1)]
    start = PositionSpec("timestamps", timestamps={(T, 0): 2000, (T, 1): 600})
    assert ranges_by_tp(plan(timed.services, tps, start, latest())) == {(T, 0): (2, 6), (T, 1): (1, 3)}
    # an ending timestamp is exclusive: records before it are read, not those at it
    end = PositionSpec("timestamps", timestamps={(T, 0): 3000, (T, 1): 2500})
    assert ranges_by_tp(plan(timed.services, tps, earliest(), end)) == {(T, 0): (0, 3), (T, 1): (0, 1)}
    end = PositionSpec("timestamp", timestamp=1001)
    assert ranges_by_tp(plan(timed.services, tps, earliest(), end)) == {(T, 0): (0, 2), (T, 1): (0, 1)}


def test_plan_timestamp_without_a_late_enough_record(timed: Log) -> None:
    tps = [(T, 0), (T, 1)]
    late = PositionSpec("timestamp", timestamp=4001, if_none="latest")
    assert ranges_by_tp(plan(timed.services, tps, late, latest())) == {(T, 0): (6, 6), (T, 1): (3, 3)}
    strict = PositionSpec("timestamps", timestamps={(T, 0): 100, (T, 1): 2501}, if_none="error")
    with pytest.raises(OffsetOutOfRangeError) as err:
        plan(timed.services, tps, strict, latest())
    msg = str(err.value)
    assert f"{T}-1" in msg and "2501" in msg and "startingOffsetsByTimestampStrategy" in msg
    # the same map, but every partition has a late enough record: no error
    ok = PositionSpec("timestamps", timestamps={(T, 0): 100, (T, 1): 2500}, if_none="error")
    assert ranges_by_tp(plan(timed.services, tps, ok, latest())) == {(T, 0): (0, 6), (T, 1): (1, 3)}


def test_timestamp_lookup_under_read_committed_ignores_records_past_the_lso(memlog: Log) -> None:
    memlog.create_topic(T, 1)
    p, tx = plain(memlog), txn_producer(memlog)
    send_each(p, ["p0"], timestamps=[1000])
    tx.begin_transaction()
    send_each(tx, ["x0"], timestamps=[5000])  # offset 1, open
    send_each(p, ["p1"], timestamps=[6000])   # offset 2, above the LSO
    spec = PositionSpec("timestamp", timestamp=2000, if_none="error")
    with pytest.raises(OffsetOutOfRangeError):
        plan(memlog.services, [(T, 0)], spec, latest())
    assert ranges_by_tp(plan(memlog.services, [(T, 0)], spec, latest(),
                             isolation_level=READ_UNCOMMITTED)) == {(T, 0): (1, 3)}


# --- plan(): the LSO and data loss --------------------------------------------------------


def test_plan_end_is_capped_at_the_lso_and_moves_once_the_transaction_commits(open_txn,
                                                                              caplog) -> None:
    log, tx = open_txn
    tps = [(T, 0)]
    assert ranges_by_tp(plan(log.services, tps, earliest(), latest())) == {(T, 0): (0, 3)}
    # An explicit end past the LSO is not shortened without a word: it fails, or
    # (failOnDataLoss false) is clamped with a warning naming the partition.
    explicit_end = PositionSpec("offsets", offsets={(T, 0): 7})
    with pytest.raises(OffsetOutOfRangeError) as err:
        plan(log.services, tps, earliest(), explicit_end)
    msg = str(err.value)
    assert "ending offset 7 of t-0" in msg and "0 to 3" in msg and "failOnDataLoss" in msg
    assert "held at 3 by an open transaction" in msg
    with caplog.at_level(logging.WARNING, logger="txlog.spark.planning"):
        assert ranges_by_tp(plan(log.services, tps, earliest(), explicit_end,
                                 fail_on_data_loss=False)) == {(T, 0): (0, 3)}
    assert any("ending offset 7 of t-0" in r.getMessage() and "reading up to 3" in
               r.getMessage() for r in caplog.records)
    assert ranges_by_tp(plan(log.services, tps, earliest(), explicit_end,
                             isolation_level=READ_UNCOMMITTED)) == {(T, 0): (0, 7)}
    assert ranges_by_tp(plan(log.services, tps, earliest(), latest(),
                             isolation_level=READ_UNCOMMITTED)) == {(T, 0): (0, 7)}
    (rng,) = plan(log.services, tps, earliest(), latest())
    assert values_of(list(read_range(log.services, rng))) == ["p0", "p1", "p2"]

    tx.commit_transaction()
    tx.flush()  # the roll-forward behind the commit: its marker ends the range
    assert ranges_by_tp(plan(log.services, tps, earliest(), latest())) == {(T, 0): (0, 8)}
    (rng,) = plan(log.services, tps, earliest(), latest())
    assert values_of(list(read_range(log.services, rng))) == ["p0", "p1", "p2", "x0", "x1", "p3", "p4"]


def test_plan_start_past_the_visible_end(open_txn) -> None:
    log, _ = open_txn
    tps = [(T, 0)]
    start = PositionSpec("offsets", offsets={(T, 0): 5})
    with pytest.raises(OffsetOutOfRangeError) as err:
        plan(log.services, tps, start, latest())  # 5 is past the LSO (3)
    msg = str(err.value)
    assert "starting offset 5" in msg and f"{T}-0" in msg and "0 to 3" in msg
    assert "failOnDataLoss" in msg
    assert ranges_by_tp(plan(log.services, tps, start, latest(), fail_on_data_loss=False)) == \
        {(T, 0): (3, 3)}
    # read_uncommitted may start there: 5 is below the log end
    assert ranges_by_tp(plan(log.services, tps, start, latest(), isolation_level=READ_UNCOMMITTED)) == \
        {(T, 0): (5, 7)}
    far = PositionSpec("offsets", offsets={(T, 0): 1000})
    with pytest.raises(OffsetOutOfRangeError, match="starting offset 1000"):
        plan(log.services, tps, far, latest(), isolation_level=READ_UNCOMMITTED)
    assert ranges_by_tp(plan(log.services, tps, far, latest(), isolation_level=READ_UNCOMMITTED,
                             fail_on_data_loss=False)) == {(T, 0): (7, 7)}


# --- plan(): exact per-partition maps -----------------------------------------------------


def test_exact_plan_refuses_maps_naming_too_few_or_extra_partitions(two_parts: Log) -> None:
    log = two_parts
    log.create_topic("u", 1)
    tps = [(T, 0), (T, 1)]
    too_few = PositionSpec("offsets", offsets={(T, 0): 1})
    with pytest.raises(InvalidConfigError) as err:
        plan(log.services, tps, too_few, latest())
    msg = str(err.value)
    assert "'startingOffsets'" in msg and "missing from it: t-1" in msg and "not read: none" in msg

    extra = PositionSpec("timestamps", timestamps={(T, 0): 1, (T, 1): 1, ("u", 0): 1})
    with pytest.raises(InvalidConfigError) as err:
        plan(log.services, tps, earliest(), extra)
    msg = str(err.value)
    assert "'endingOffsetsByTimestamp'" in msg and "not read: u-0" in msg
    assert "missing from it: none" in msg

    with pytest.raises(InvalidConfigError, match="'endingOffsets'.*missing from it: t-0"):
        plan(log.services, tps, earliest(), PositionSpec("offsets", offsets={(T, 1): 1}))
    with pytest.raises(InvalidConfigError, match="'startingOffsetsByTimestamp'"):
        plan(log.services, tps, PositionSpec("timestamps", timestamps={(T, 1): 1}), latest())

    # A stream (exact=False): unnamed partitions take the default, extra names are ignored.
    start = PositionSpec("offsets", offsets={(T, 0): 1, ("u", 0): 0}, default="earliest")
    assert ranges_by_tp(plan(log.services, tps, start, latest(), exact=False)) == \
        {(T, 0): (1, 5), (T, 1): (0, 3)}
    start = PositionSpec("offsets", offsets={(T, 0): 1}, default="latest")
    assert ranges_by_tp(plan(log.services, tps, start, latest(), exact=False)) == \
        {(T, 0): (1, 5), (T, 1): (3, 3)}
    # a map naming exactly the partitions read is accepted
    exact = PositionSpec("offsets", offsets={(T, 0): 4, (T, 1): 2})
    assert ranges_by_tp(plan(log.services, tps, exact, latest())) == {(T, 0): (4, 5), (T, 1): (2, 3)}


# --- Subscription --------------------------------------------------------------------------


def test_subscribe_unknown_topic_names_it(memlog: Log) -> None:
    memlog.create_topic("known", 2)
    sub = Subscription.subscribe(["known", "nope", "gone"])
    with pytest.raises(UnknownTopicError) as err:
        sub.partitions(memlog.services)
    assert "'nope'" in str(err.value) and "'gone'" in str(err.value)
    assert "'known'" not in str(err.value)
    assert Subscription.subscribe(["known"]).partitions(memlog.services) == [("known", 0), ("known", 1)]
    with pytest.raises(InvalidConfigError):
        Subscription.subscribe([])


def test_subscribe_pattern_must_match_the_whole_name(memlog: Log) -> None:
    for name, n in (("orders", 2), ("orders-eu", 1), ("xorders", 1), ("order", 1)):
        memlog.create_topic(name, n)
    assert Subscription.subscribe_pattern("orders").partitions(memlog.services) == \
        [("orders", 0), ("orders", 1)]
    assert Subscription.subscribe_pattern("orders.*").partitions(memlog.services) == \
        [("orders", 0), ("orders", 1), ("orders-eu", 0)]
    assert Subscription.subscribe_pattern(".*orders").partitions(memlog.services) == \
        [("orders", 0), ("orders", 1), ("xorders", 0)]
    assert Subscription.subscribe_pattern("nothing.*").partitions(memlog.services) == []
    with pytest.raises(InvalidConfigError, match=r"subscribePattern '\(orders'"):
        Subscription.subscribe_pattern("(orders")


def test_assign_refuses_unknown_partitions_and_topics(memlog: Log) -> None:
    memlog.create_topic(T, 2)
    assert Subscription.assign([(T, 1)]).partitions(memlog.services) == [(T, 1)]
    with pytest.raises(UnknownPartitionError, match="partition 2 does not exist"):
        Subscription.assign([(T, 0), (T, 2)]).partitions(memlog.services)
    with pytest.raises(UnknownTopicError, match="'other'"):
        Subscription.assign([("other", 0)]).partitions(memlog.services)
    with pytest.raises(InvalidConfigError, match="non-negative"):
        Subscription.assign([(T, -1)])


def test_subscriptions_drop_duplicates(memlog: Log) -> None:
    memlog.create_topic("a", 2)
    memlog.create_topic("b", 1)
    sub = Subscription.subscribe(["b", "a", "b", "a"])
    assert sub.topics == ("b", "a")
    assert sub.partitions(memlog.services) == [("a", 0), ("a", 1), ("b", 0)]
    sub = Subscription.assign([("b", 0), ("a", 1), ("b", 0), ("a", 1), ("a", 0)])
    assert sub.assignment == (("b", 0), ("a", 1), ("a", 0))
    assert sub.partitions(memlog.services) == [("a", 0), ("a", 1), ("b", 0)]


# --- split() --------------------------------------------------------------------------------


def rng_of(p: int, start: int, size: int, topic: str = T, topic_id: str = "id") -> OffsetRange:
    return OffsetRange(topic, p, topic_id, start, start + size)


def check_split(ranges: list[OffsetRange], pieces: list[OffsetRange],
                min_partitions: int | None, max_records: int | None) -> None:
    """Every property split() promises, checked against its input."""
    # 1. pieces come grouped by input range, in input order; each group is
    #    contiguous, in offset order, and covers exactly its range
    i = 0
    for r in ranges:
        assert i < len(pieces), f"no pieces for {r}"
        group = [pieces[i]]
        i += 1
        while r.size > 0 and group[-1].end < r.end and i < len(pieces):
            group.append(pieces[i])
            i += 1
        assert all((p.topic, p.partition, p.topic_id) == (r.topic, r.partition, r.topic_id)
                   for p in group), (r, group)
        assert group[0].start == r.start and group[-1].end == r.end, (r, group)
        for a, b in zip(group, group[1:]):
            assert a.end == b.start, f"gap or overlap between {a} and {b}"
        if r.size > 0:
            assert all(p.size > 0 for p in group), f"empty piece of non-empty {r}: {group}"
        else:
            assert len(group) == 1
    assert i == len(pieces), f"pieces beyond the input ranges: {pieces[i:]}"
    # 2. size bounds
    total = sum(r.size for r in ranges)
    if max_records:
        assert all(p.size <= max_records for p in pieces)
    first_pass = sum(max(-(-r.size // max_records), 1) if max_records else 1 for r in ranges)
    if min_partitions and total > 0 and first_pass < min_partitions:
        # cut again in proportion to size: enough non-empty pieces (one record
        # each at most when there are fewer records than pieces asked), and
        # none larger than an even share of the records
        assert len([p for p in pieces if p.size > 0]) >= min(min_partitions, total)
        share = -(-total // min_partitions)
        assert all(p.size <= share for p in pieces), (share, pieces)
    else:
        assert len(pieces) == first_pass


def test_split_max_records_bounds_each_piece() -> None:
    ranges = [rng_of(0, 0, 10), rng_of(1, 5, 0), rng_of(2, 100, 7)]
    pieces = split(ranges, max_records=3)
    assert [(p.partition, p.start, p.end) for p in pieces] == [
        (0, 0, 3), (0, 3, 6), (0, 6, 8), (0, 8, 10), (1, 5, 5),
        (2, 100, 103), (2, 103, 105), (2, 105, 107)]
    check_split(ranges, pieces, None, 3)
    assert split(ranges) == ranges  # nothing asked: unchanged


def test_split_min_partitions_cuts_in_proportion_to_size() -> None:
    ranges = [rng_of(0, 0, 90), rng_of(1, 0, 10), rng_of(2, 0, 0)]
    pieces = split(ranges, min_partitions=10)
    per_partition = {p: [x for x in pieces if x.partition == p] for p in (0, 1, 2)}
    assert len(per_partition[0]) == 9 and len(per_partition[1]) == 1
    assert all(x.size == 10 for x in per_partition[0] + per_partition[1])
    check_split(ranges, pieces, 10, None)
    # already enough pieces: left alone
    assert split(ranges, min_partitions=2) == ranges
    # fewer records than partitions asked: one record per piece at most
    small = [rng_of(0, 3, 2), rng_of(1, 0, 1)]
    pieces = split(small, min_partitions=8)
    assert [(p.partition, p.start, p.end) for p in pieces] == [(0, 3, 4), (0, 4, 5), (1, 0, 1)]


def test_split_properties_over_random_inputs() -> None:
    rand = random.Random(20240611)
    for case in range(300):
        ranges = []
        for p in range(rand.randrange(1, 6)):
            size = rand.choice([0, 1, 2, rand.randrange(0, 50), rand.randrange(0, 2000)])
            ranges.append(rng_of(p, rand.randrange(0, 10_000), size,
                                 topic=rand.choice(["a", "b"]), topic_id=f"id{p}"))
        min_partitions = rand.choice([None, 1, rand.randrange(1, 40)])
        max_records = rand.choice([None, rand.randrange(1, 30), rand.randrange(1, 3000)])
        pieces = split(ranges, min_partitions=min_partitions, max_records=max_records)
        try:
            check_split(ranges, pieces, min_partitions, max_records)
        except AssertionError as exc:
            raise AssertionError(f"case {case}: split({ranges}, {min_partitions}, "
                                 f"{max_records}) -> {pieces}: {exc}") from exc


# --- read_range() ---------------------------------------------------------------------------


@pytest.fixture
def mixed(log: Log):
    """Partition t-0 on disk: plain records interleaved with an aborted transaction,
    a committed one, and a multi-record plain batch larger than a chunk.

    Returns (log, committed values in offset order, every data value in offset order,
    {value: offset}).
    """
    log.create_topic(T, 1)
    p, big, tx = plain(log), plain(log, linger=True), txn_producer(log)
    sent: list[tuple[int, str, bool]] = []  # (offset, value, visible when committed)

    def each(producer, vals, visible):
        sent.extend((o, v, visible) for o, v in zip(send_each(producer, vals), vals))

    each(p, ["p0", "p1"], True)
    tx.begin_transaction()
    for i in range(5):  # aborted, interleaved with plain records
        each(tx, [f"a{i}"], False)
        each(p, [f"q{i}"], True)
    tx.abort_transaction()
    big_values = [f"big{i}" for i in range(8)]
    sent.extend((o, v, True) for o, v in zip(send_batch(big, big_values), big_values))
    tx.begin_transaction()
    for i in range(4):  # committed
        each(tx, [f"c{i}"], True)
        each(p, [f"r{i}"], True)
    tx.commit_transaction()
    tx.begin_transaction()
    each(tx, ["z0", "z1"], False)  # aborted again, at the end
    tx.abort_transaction()
    each(p, ["tail"], True)
    sent.sort()
    committed = [v for _, v, visible in sent if visible]
    everything = [v for _, v, _ in sent]
    return log, committed, everything, {v: o for o, v, _ in sent}


@pytest.mark.parametrize("isolation", [READ_COMMITTED, READ_UNCOMMITTED])
def test_read_range_reads_exactly_the_planned_records_in_small_chunks(mixed, isolation,
                                                                      monkeypatch) -> None:
    log, committed, everything, offset_of = mixed
    expected = committed if isolation == READ_COMMITTED else everything
    (whole,) = plan(log.services, [(T, 0)], earliest(), latest(), isolation_level=isolation)
    assert whole.end == log.end_offset(T, 0)  # no transaction is open: the whole log

    chunks: list[tuple[int, int]] = []  # (start, end) of every partition read
    real_read = PartitionLog.read

    def spy(self, start, end=None, *args, **kwargs):
        chunks.append((start, end))
        return real_read(self, start, end, *args, **kwargs)

    monkeypatch.setattr(PartitionLog, "read", spy)
    batches = list(read_range(log.services, whole, isolation, chunk_rows=3))
    assert values_of(batches) == expected
    table = pa.Table.from_batches(batches)
    assert table.column("offset").to_pylist() == [offset_of[v] for v in expected]
    # chunks tile the range; each ends at the first batch boundary 3 or more
    # records on (the largest batch holds 8 records, so at most 3 + 7 offsets)
    assert chunks[0][0] == whole.start and chunks[-1][1] == whole.end
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:])), chunks
    assert all(3 <= hi - lo <= 3 + 7 for lo, hi in chunks[:-1]), chunks
    assert len(chunks) >= whole.size // 10
    monkeypatch.undo()
    assert table.equals(log.read(T, 0, whole.start, whole.end, isolation))
    if isolation == READ_COMMITTED:
        assert not {v for v in values_of(batches) if v[0] in "az"}

    # the same records when the range is cut into pieces, each read in chunks,
    # pieces starting inside the multi-record batch included
    for max_records in (1, 2, 5, 11):
        got: list[str] = []
        for piece in split([whole], max_records=max_records):
            piece_batches = list(read_range(log.services, piece, isolation, chunk_rows=3))
            piece_table = log.read(T, 0, piece.start, piece.end, isolation)
            assert values_of(piece_batches) == values_of(piece_table)
            offsets = [o for b in piece_batches for o in b.column("offset").to_pylist()]
            assert all(piece.start <= o < piece.end for o in offsets)
            got.extend(values_of(piece_batches))
        assert got == expected, max_records


def test_read_range_with_headers_and_large_chunks_match_log_read(mixed) -> None:
    log, committed, _, _ = mixed
    (whole,) = plan(log.services, [(T, 0)], earliest(), latest())
    for chunk_rows in (1, 4, 1 << 16):
        table = pa.Table.from_batches(list(read_range(log.services, whole, include_headers=True,
                                                      chunk_rows=chunk_rows)))
        assert table.equals(log.read(T, 0, whole.start, whole.end, include_headers=True))
        assert "headers" in table.column_names and values_of(table) == committed


def test_read_range_of_an_empty_range_yields_nothing(two_parts: Log) -> None:
    (r0, _) = plan(two_parts.services, [(T, 0), (T, 1)], latest(), latest())
    assert r0.size == 0 and list(read_range(two_parts.services, r0, chunk_rows=3)) == []


def test_read_range_refuses_another_incarnation_of_the_topic(log: Log) -> None:
    log.create_topic(T, 1)
    send_each(plain(log), ["old0", "old1", "old2"])
    (rng,) = plan(log.services, [(T, 0)], earliest(), latest())
    assert values_of(list(read_range(log.services, rng))) == ["old0", "old1", "old2"]

    other = Log(log.root)  # another process deletes and re-creates the topic
    other.delete_topic(T)
    with pytest.raises(UnknownTopicError, match=f"'{T}'"):
        list(read_range(Log(log.root).services, rng))
    other.create_topic(T, 1)
    send_each(plain(other), ["new0", "new1", "new2", "new3"])
    assert other.describe_topic(T).topic_id != rng.topic_id

    for reader in (log, Log(log.root)):  # one that saw the old topic, and a fresh one
        with pytest.raises(InconsistentTopicIdError) as err:
            list(read_range(reader.services, rng))
        assert rng.topic_id in str(err.value)
    # planned again, the new incarnation is read
    (again,) = plan(Log(log.root), [(T, 0)], earliest(), latest())
    assert values_of(list(read_range(log.services, again))) == ["new0", "new1", "new2", "new3"]


# --- readers end expired transactions -------------------------------------------------------


def test_a_reader_ends_an_expired_transaction_and_only_that(open_txn, monkeypatch) -> None:
    import txlog.clock as clock_module

    from txlog.clients.positions import end_expired_transactions

    log, tx = open_txn
    end_expired_transactions(log.services, [(T, 0)])
    assert read_limit(log.services, T, 0, READ_COMMITTED) == 3  # not expired: left alone
    later = clock_module.now_ms() + 10 * 60_000 + 1
    monkeypatch.setattr(clock_module, "now_ms", lambda: later)
    end_expired_transactions(log.services, [(T, 0)])
    assert read_limit(log.services, T, 0, READ_COMMITTED) == log.end_offset(T, 0)
    table = log.read(T, 0)
    assert values_of(table) == ["p0", "p1", "p2", "p3", "p4"]  # the aborted records stay hidden


def test_a_reader_that_may_not_write_only_logs_what_holds_it(open_txn, monkeypatch,
                                                             caplog) -> None:
    import txlog.clock as clock_module

    from txlog.clients.positions import end_expired_transactions

    log, _ = open_txn
    later = clock_module.now_ms() + 10 * 60_000 + 1
    monkeypatch.setattr(clock_module, "now_ms", lambda: later)

    def read_only(*args, **kwargs):
        raise PermissionError("injected: read-only credentials")

    monkeypatch.setattr(log.storage, "publish_if_absent", read_only)
    with caplog.at_level(logging.WARNING, logger="txlog.clients.positions"):
        end_expired_transactions(log.services, [(T, 0)])
    assert read_limit(log.services, T, 0, READ_COMMITTED) == 3
    assert any("t-0" in r.getMessage() and "may not write" in r.getMessage()
               for r in caplog.records)
