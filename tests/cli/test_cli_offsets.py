"""Offset tooling of the ``txlog`` command, run as real processes: groups reset-offsets,
offsets --time and consume --group.

Expected offsets are derived from what the test wrote with the library, never
from what the command happens to print.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys

import pytest

from txlog import Log
from txlog.transactions.groups import apply_transactional_offsets

T0 = int(datetime.datetime(2024, 1, 31, 10, tzinfo=datetime.timezone.utc).timestamp() * 1000)
HOUR = 3_600_000


def txlog(root: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "txlog.cli", "--root", root, *argv],
                          capture_output=True, text=True, timeout=120)


def json_rows(proc: subprocess.CompletedProcess) -> list[dict]:
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def plan(proc: subprocess.CompletedProcess) -> dict[tuple[str, int], tuple]:
    return {(r["topic"], r["partition"]): (r["current_offset"], r["new_offset"])
            for r in json_rows(proc)}


@pytest.fixture
def root(tmp_path) -> str:
    """events: partition 0 holds 5 records at T0-2h, T0-1h, T0, T0+1h, T0+2h; partition 1
    holds 3 records at T0-3h..T0-1h; partition 2 is empty.  Group g committed 2 and 1."""
    path = str(tmp_path / "log")
    log = Log(path)
    log.create_topic("events", 3)
    with log.producer() as producer:
        for i in range(5):
            producer.send("events", f"a{i}".encode(), partition=0,
                          timestamp_ms=T0 + (i - 2) * HOUR)
        for i in range(3):
            producer.send("events", f"b{i}".encode(), partition=1,
                          timestamp_ms=T0 + (i - 3) * HOUR)
        producer.flush()
    log.commit_offsets("g", {("events", 0): 2, ("events", 1): 1})
    return path


def test_reset_offsets_dry_run_changes_nothing(root):
    proc = txlog(root, "groups", "reset-offsets", "g", "--all-topics", "--to-earliest", "--json")
    assert plan(proc) == {("events", 0): (2, 0), ("events", 1): (1, 0)}
    assert Log(root).committed("g") == {("events", 0): 2, ("events", 1): 1}
    table = txlog(root, "groups", "reset-offsets", "g", "--topic", "events", "--to-latest")
    assert table.returncode == 0, table.stderr
    assert [line.split() for line in table.stdout.splitlines()] == [
        ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"],
        ["g", "events", "0", "2", "5"], ["g", "events", "1", "1", "3"],
        ["g", "events", "2", "-", "0"]]
    assert Log(root).committed("g") == {("events", 0): 2, ("events", 1): 1}


@pytest.mark.parametrize("target, scope, expected", [
    (["--to-earliest"], ["--all-topics"], {0: 0, 1: 0}),
    (["--to-latest"], ["--topic", "events"], {0: 5, 1: 3, 2: 0}),
    # Clamped into [log start, log end] per partition, as Kafka clamps.
    (["--to-offset", "4"], ["--topic", "events"], {0: 4, 1: 3, 2: 0}),
    (["--shift-by", "-10"], ["--topic", "events:0"], {0: 0}),
    (["--shift-by", "2"], ["--topic", "events:0,1"], {0: 4, 1: 3}),
    # UTC without an offset; the first record at or after it; the log end if none.
    (["--to-datetime", "2024-01-31T10:00:00.000"], ["--all-topics"], {0: 2, 1: 3}),
    (["--to-datetime", "2024-01-31T10:00:00.001"], ["--topic", "events:0"], {0: 3}),
    (["--to-datetime", "2024-01-31T10:00:00+01:00"], ["--topic", "events:0"], {0: 1}),
    (["--to-datetime", "2024-01-31T07:00:00Z"], ["--topic", "events:1"], {1: 0}),
])
def test_reset_offsets_execute(root, target, scope, expected):
    before = {("events", 0): 2, ("events", 1): 1}
    proc = txlog(root, "groups", "reset-offsets", "g", *target, *scope, "--execute", "--json")
    new = {("events", p): o for p, o in expected.items()}
    assert plan(proc) == {tp: (before.get(tp), o) for tp, o in new.items()}
    assert Log(root).committed("g") == {**before, **new}


@pytest.mark.parametrize("argv, message", [
    (["nobody", "--all-topics", "--to-earliest"], "group 'nobody' has no committed offsets"),
    (["g", "--topic", "nope", "--to-earliest"], "topic 'nope' does not exist"),
    (["g", "--topic", "events:7", "--to-earliest"], "partition 7 does not exist"),
    (["g", "--topic", "events", "--to-earliest", "--to-offset", "3"],
     "exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime, --shift-by "
     "(got --to-earliest, --to-offset)"),
    (["g", "--topic", "events"], "exactly one of --to-earliest"),
    (["g", "--to-latest"], "needs --topic TOPIC[:P,...] (repeatable) or --all-topics"),
    (["g", "--all-topics", "--topic", "events", "--to-latest"], "not both"),
    (["g", "--all-topics", "--to-datetime", "2024-31-01T10:00"],
     "--to-datetime: '2024-31-01T10:00' is not an ISO 8601 date-time"),
    (["g", "--topic", "events:2", "--shift-by", "1", "--execute"],
     "cannot shift events-2: group 'g' has no committed offset for it"),
])
def test_reset_offsets_bad_input_is_one_line(root, argv, message):
    proc = txlog(root, "groups", "reset-offsets", *argv)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert Log(root).committed("g") == {("events", 0): 2, ("events", 1): 1}


def test_a_reset_is_not_undone_by_a_late_roll_forward(root):
    """A transaction's offsets applied before a reset must not come back when a slow process
    rolls the same transaction forward again after it: the reset keeps txn_marks."""
    log = Log(root)
    apply_transactional_offsets(log.storage, "g", {("events", 0): 4}, "etl", 7)
    assert log.committed("g")[("events", 0)] == 4
    proc = txlog(root, "groups", "reset-offsets", "g", "--topic", "events:0", "--to-offset",
                 "1", "--execute")
    assert proc.returncode == 0, proc.stderr
    apply_transactional_offsets(log.storage, "g", {("events", 0): 4}, "etl", 7)  # late
    assert log.committed("g")[("events", 0)] == 1
    apply_transactional_offsets(log.storage, "g", {("events", 0): 5}, "etl", 8)  # a newer one
    assert log.committed("g")[("events", 0)] == 5


def test_offsets_time(root):
    def offsets(*argv: str) -> dict[int, tuple]:
        rows = json_rows(txlog(root, "offsets", *argv, "--json"))
        return {r["partition"]: (r["offset"], r["timestamp"]) for r in rows}

    assert offsets("events", "--time", "earliest") == {0: (0, None), 1: (0, None),
                                                       2: (0, None)}
    assert offsets("events", "--time", str(T0)) == {0: (2, T0), 1: (None, None),
                                                    2: (None, None)}
    assert offsets("events:1", "--time", str(T0 - 2 * HOUR - 1)) == {1: (1, T0 - 2 * HOUR)}
    assert offsets("events:0", "--time", "2024-01-31T10:30:00.000") == {0: (3, T0 + HOUR)}
    assert offsets("events:0", "--time", "2024-01-31T10:30:00+01:00") == {0: (2, T0)}
    producer = Log(root).producer(transactional_id="open")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("events", b"pending", partition=1, timestamp_ms=T0 + 5 * HOUR)
    producer.flush()  # written, undecided: it holds the last stable offset at 3
    assert offsets("events:1", "--time", "latest") == {1: (3, None)}
    assert offsets("events:1", "--time", "latest", "--isolation-level",
                   "read_uncommitted") == {1: (4, None)}
    assert offsets("events:1", "--time", str(T0)) == {1: (None, None)}
    assert offsets("events:1", "--time", str(T0), "--isolation-level",
                   "read_uncommitted") == {1: (3, T0 + 5 * HOUR)}
    producer.abort_transaction()
    producer.close()
    bad = txlog(root, "offsets", "events", "--time", "yesterday")
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1
    assert "--time: 'yesterday' is not 'earliest', 'latest'" in bad.stderr
    bad = txlog(root, "offsets", "events:3", "--time", "earliest")
    assert bad.returncode == 1 and "partition 3 does not exist" in bad.stderr


def test_consume_group_continues_where_the_last_run_stopped(root):
    every = {f"a{i}" for i in range(5)} | {f"b{i}" for i in range(3)}
    first = txlog(root, "consume", "events", "--group", "readers", "--from-beginning",
                  "--max-records", "5")
    assert first.returncode == 0, first.stderr
    seen = first.stdout.split()
    assert len(seen) == 5 and set(seen) <= every
    committed = Log(root).committed("readers")
    assert sum(committed.values()) == 5 and set(committed) == {("events", p) for p in range(3)}
    second = txlog(root, "consume", "events", "--group", "readers")  # no --from-beginning
    assert second.returncode == 0, second.stderr
    assert sorted(seen + second.stdout.split()) == sorted(every)  # none lost, none twice
    assert Log(root).committed("readers") == {("events", 0): 5, ("events", 1): 3,
                                              ("events", 2): 0}
    third = txlog(root, "consume", "events", "--group", "readers", "--from-beginning")
    assert third.returncode == 0 and third.stdout == ""
    # Reset and read again: the tooling and the consumer agree on what a group's offset is.
    assert txlog(root, "groups", "reset-offsets", "readers", "--topic", "events:1",
                 "--shift-by", "-2", "--execute").returncode == 0
    assert txlog(root, "consume", "events", "--group", "readers").stdout.split() == ["b1", "b2"]
    bad = txlog(root, "consume", "events", "--group", "readers", "--partition", "0",
                "--offset", "1")
    assert bad.returncode == 1 and "--group" in bad.stderr and bad.stderr.count("\n") == 1


def test_reset_and_offsets_clamp_to_a_log_start_retention_moved(tmp_path):
    """Below the log start nothing can be read any more: a reset never goes there, and
    'earliest' is the log start, not 0."""
    root = str(tmp_path / "log")
    log = Log(root)
    log.create_topic("old", 1, {"segment.bytes": 1024})
    producer = log.producer()
    for i in range(8):
        producer.send("old", bytes([65 + i]) * 600, partition=0).get()  # a segment each
    producer.close()
    log.compact("old", upto_lag=1)
    log.alter_topic_config("old", {"retention.bytes": 1})
    log.apply_retention("old")
    start = log.partition("old", 0).log_start()
    assert 0 < start < 8
    log.commit_offsets("g", {("old", 0): 7})
    proc = txlog(root, "groups", "reset-offsets", "g", "--all-topics", "--to-offset", "0",
                 "--execute", "--json")
    assert plan(proc) == {("old", 0): (7, start)}
    assert Log(root).committed("g") == {("old", 0): start}
    proc = txlog(root, "groups", "reset-offsets", "g", "--all-topics", "--shift-by", "-1",
                 "--json")
    assert plan(proc) == {("old", 0): (start, start)}
    assert json_rows(txlog(root, "offsets", "old", "--time", "earliest", "--json")) == [
        {"partition": 0, "offset": start, "timestamp": None}]
