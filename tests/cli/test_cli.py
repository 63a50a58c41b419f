"""The ``txlog`` command, run in-process through ``main`` and once as a real process.

Expected outputs are derived from what the test wrote (through the CLI or the
library), never from what the CLI happens to print.
"""

from __future__ import annotations

import functools
import io
import json
import os
import subprocess
from pathlib import Path
import sys
import time

import pytest

import txlog.clock
from txlog import Log
from txlog.cli import main

from helpers_core import nothing_holds_the_lso, txlog_process


def run(capsys, *argv: str, stdin: bytes | None = None, monkeypatch=None) -> tuple[int, str, str]:
    if stdin is not None:
        assert monkeypatch is not None
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def table(out: str) -> list[list[str]]:
    """Rows of an aligned table, header first."""
    return [line.split() for line in out.strip().splitlines()]


@pytest.fixture
def root(tmp_path) -> str:
    path = str(tmp_path / "log")
    Log(path).create_topic("events", 3)
    return path


def test_topics_create_list_describe_delete(tmp_path, capsys):
    path = str(tmp_path / "fresh")
    code, out, _ = run(capsys, "--root", path, "topics", "create", "a.b", "--partitions", "4",
                       "--config", "message.timestamp.type=LogAppendTime",
                       "--config", "max.message.bytes=5000")
    assert code == 0 and "a.b" in out
    run(capsys, "--root", path, "topics", "create", "z", "--partitions", "1")

    desc = Log(path).describe_topic("a.b")  # the CLI wrote what it was told
    assert desc.partitions == 4
    assert desc.config == {"message.timestamp.type": "LogAppendTime",
                           "max.message.bytes": 5000}

    code, out, _ = run(capsys, "--root", path, "topics", "list")
    assert code == 0 and out.splitlines() == ["a.b", "z"]

    code, out, _ = run(capsys, "topics", "describe", "a.b", "--root", path)  # --root after
    assert code == 0
    assert "partitions: 4" in out
    assert "max.message.bytes=5000" in out and "message.timestamp.type=LogAppendTime" in out
    rows = table(out.split("config:", 1)[1].split("\n", 1)[1])
    assert rows[0] == ["PARTITION", "LOG-START-OFFSET", "LOG-END-OFFSET", "LAST-STABLE-OFFSET",
                       "SEGMENTS", "SEGMENT-BYTES", "BATCHES", "BATCH-BYTES"]
    assert rows[1:] == [[str(p), "0", "0", "0", "0", "0", "0", "0"] for p in range(4)]
    with Log(path).producer(linger_ms=60_000) as producer:
        for i in range(3):
            producer.send("a.b", b"x" * 100, partition=2)
        producer.flush()
        producer.send("a.b", b"y", partition=2)
    rows = table(run(capsys, "--root", path, "topics", "describe", "a.b")[1]
                 .split("config:", 1)[1].split("\n", 1)[1])
    stored = sum(os.path.getsize(os.path.join(path, "topics", "a.b", "2", name))
                 for name in os.listdir(os.path.join(path, "topics", "a.b", "2"))
                 if name.endswith(".batch"))
    assert rows[3] == ["2", "0", "4", "4", "0", "0", "2", str(stored)]

    code, out, _ = run(capsys, "--root", path, "topics", "alter", "z", "--partitions", "3")
    assert code == 0 and "z now has 3 partitions" in out
    assert Log(path).describe_topic("z").partitions == 3

    code, out, _ = run(capsys, "--root", path, "topics", "delete", "a.b")
    assert code == 0
    assert Log(path).topics() == ["z"]


def test_produce_then_consume_round_trip(root, capsysbinary, monkeypatch):
    lines = [b"first", b"", b"caf\xc3\xa9", b"\xff\xfe not utf-8", b"last"]
    code, out, err = run(capsysbinary, "--root", root, "produce", "events", "--partition", "2",
                         stdin=b"\n".join(lines) + b"\n", monkeypatch=monkeypatch)
    assert code == 0, err
    assert b"5 records" in out and b"partition 2: offsets 0-4" in out

    log = Log(root)
    written = log.read("events", 2)
    assert written.column("value").to_pylist() == lines
    assert written.column("key").to_pylist() == [None] * 5
    assert log.end_offset("events", 0) == log.end_offset("events", 1) == 0

    # values come back byte for byte, invalid UTF-8 included
    code, out, _ = run(capsysbinary, "--root", root, "consume", "events", "--from-beginning")
    assert code == 0
    assert out == b"".join(v + b"\n" for v in lines)

    # Without --from-beginning only new records are shown: nothing, at once.
    code, out, _ = run(capsysbinary, "--root", root, "consume", "events")
    assert code == 0 and out == b""


def test_produce_keys_are_partitioned_like_kafka(root, capsys, monkeypatch):
    from txlog.clients.partitioner import partition_for_key

    code, _, err = run(capsys, "--root", root, "produce", "events", "--key", "user-7",
                       stdin=b"a\nb\nc\n", monkeypatch=monkeypatch)
    assert code == 0, err
    expected = partition_for_key(b"user-7", 3)
    log = Log(root)
    table_ = log.read("events", expected)
    assert table_.column("key").to_pylist() == [b"user-7"] * 3
    assert table_.column("value").to_pylist() == [b"a", b"b", b"c"]

    code, _, err = run(capsys, "--root", root, "produce", "events", "--key-separator", "=",
                       "--partition", "0", stdin=b"k1=v=1\nk2=v2", monkeypatch=monkeypatch)
    assert code == 0, err
    got = Log(root).read("events", 0)
    assert got.column("key").to_pylist() == [b"k1", b"k2"]
    assert got.column("value").to_pylist() == [b"v=1", b"v2"]  # split at the first only


def test_consume_json_and_max_records(root, capsys):
    log = Log(root)
    with log.producer() as producer:
        for i in range(5):
            producer.send("events", f"v{i}".encode(), key=f"k{i}".encode(), partition=1,
                          headers=[("h", f"x{i}".encode())], timestamp_ms=1000 + i)
    code, out, _ = run(capsys, "--root", root, "consume", "events", "--partition", "1",
                       "--from-beginning", "--format", "json", "--max-records", "3")
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert records == [
        {"partition": 1, "offset": i, "timestamp": 1000 + i, "timestamp_type": "CreateTime",
         "key": f"k{i}", "value": f"v{i}", "headers": [["h", f"x{i}"]]}
        for i in range(3)]


def test_open_transaction_offsets_isolation_and_listing(root, capsys):
    log = Log(root)
    with log.producer() as plain:
        plain.send("events", b"before", partition=0)
    txn = log.producer(transactional_id="writer-1")
    txn.init_transactions()
    txn.begin_transaction()
    txn.send("events", b"pending", partition=0)
    txn.send("events", b"elsewhere", partition=2)
    txn.flush()
    with log.producer() as plain:
        plain.send("events", b"after", partition=0)

    code, out, _ = run(capsys, "--root", root, "offsets", "events")
    assert code == 0
    rows = table(out)
    assert rows[0] == ["PARTITION", "LOG-END-OFFSET", "LAST-STABLE-OFFSET"]
    # partition 0: before(0) pending(1) after(2): LSO stops at the open transaction
    assert rows[1:] == [["0", "3", "1"], ["1", "0", "0"], ["2", "1", "0"]]

    code, out, _ = run(capsys, "--root", root, "consume", "events", "--partition", "0",
                       "--from-beginning")
    assert out.splitlines() == ["before"]
    code, out, _ = run(capsys, "--root", root, "consume", "events", "--partition", "0",
                       "--from-beginning", "--isolation-level", "read_uncommitted")
    assert out.splitlines() == ["before", "pending", "after"]

    code, out, _ = run(capsys, "--root", root, "transactions", "list")
    assert code == 0
    rows = table(out)
    assert rows[0] == ["TRANSACTIONAL-ID", "STATE", "PRODUCER-ID", "EPOCH", "PARTITIONS"]
    assert rows[1] == ["writer-1", "Ongoing", str(txn.producer_id), str(txn.epoch),
                       "events-0,events-2"]

    txn.commit_transaction()
    txn.flush()  # Complete, written behind the decision
    code, out, _ = run(capsys, "--root", root, "consume", "events", "--partition", "0",
                       "--from-beginning")
    assert out.splitlines() == ["before", "pending", "after"]
    rows = table(run(capsys, "--root", root, "transactions", "list")[1])
    assert rows[1] == ["writer-1", "CompleteCommit", str(txn.producer_id), str(txn.epoch), "-"]


def test_abort_expired_and_expire(root, capsys, monkeypatch):
    log = Log(root)
    txn = log.producer(transactional_id="stuck", transaction_timeout_ms=60_000)
    txn.init_transactions()
    txn.begin_transaction()
    txn.send("events", b"never", partition=1)
    txn.flush()
    first_epoch = txn.epoch

    code, out, _ = run(capsys, "--root", root, "transactions", "abort-expired")
    assert code == 0 and out.startswith("aborted 0 ")  # not expired yet

    real_now = txlog.clock.now_ms
    monkeypatch.setattr(txlog.clock, "now_ms", lambda: real_now() + 120_000)
    code, out, _ = run(capsys, "--root", root, "transactions", "abort-expired")
    assert code == 0 and out.strip() == "aborted 1 expired transaction: stuck"

    meta = Log(root).coordinator.metadata("stuck")
    assert meta.state.value == "CompleteAbort" and meta.epoch > first_epoch
    offsets = table(run(capsys, "--root", root, "offsets", "events")[1])
    assert offsets[2] == ["1", "2", "2"]  # data + ABORT marker; nothing holds the LSO back
    code, out, _ = run(capsys, "--root", root, "consume", "events", "--from-beginning",
                       "--isolation-level", "read_uncommitted")
    assert out.splitlines() == ["never"]
    assert run(capsys, "--root", root, "consume", "events", "--from-beginning")[1] == ""

    # Two more "minutes" idle since the abort: retired by --max-idle-ms 60000.
    code, out, _ = run(capsys, "--root", root, "transactions", "expire",
                       "--max-idle-ms", "60000")
    assert code == 0 and out.startswith("expired 0 ")
    monkeypatch.setattr(txlog.clock, "now_ms", lambda: real_now() + 240_000)
    code, out, _ = run(capsys, "--root", root, "transactions", "expire",
                       "--max-idle-ms", "60000")
    assert code == 0 and out.strip() == "expired 1 transactional id: stuck"
    rows = table(run(capsys, "--root", root, "transactions", "list")[1])
    assert rows[1][:2] == ["stuck", "Dead"]


def test_groups_describe(root, capsys):
    log = Log(root)
    with log.producer() as producer:
        for i in range(7):
            producer.send("events", b"x", partition=0)
    txn = log.producer(transactional_id="copier")
    txn.init_transactions()
    txn.begin_transaction()
    txn.send("events", b"copied", partition=1)
    txn.send_offsets_to_transaction({("events", 0): 5}, "readers")
    txn.commit_transaction()
    log.commit_offsets("readers", {("events", 2): 0})

    code, out, _ = run(capsys, "--root", root, "groups", "describe", "readers")
    assert code == 0
    rows = table(out)
    assert rows[0] == ["TOPIC", "PARTITION", "COMMITTED-OFFSET", "LOG-END-OFFSET",
                       "LAST-STABLE-OFFSET", "LAG"]
    assert rows[1:] == [["events", "0", "5", "7", "7", "2"], ["events", "2", "0", "0", "0", "0"]]

    log.commit_offsets("another", {("gone", 0): 3})  # a topic that does not exist (any more)
    code, out, _ = run(capsys, "--root", root, "groups", "list")
    assert code == 0 and out.splitlines() == ["another", "readers"]
    rows = table(run(capsys, "--root", root, "groups", "describe", "another")[1])
    assert rows[1] == ["gone", "0", "3", "-", "-", "-"]


@pytest.mark.parametrize("argv, message", [
    (["topics", "describe", "nope"], "topic 'nope' does not exist"),
    (["topics", "create", "events", "--partitions", "1"], "already exists"),
    (["topics", "create", "bad/name", "--partitions", "1"], "illegal characters"),
    (["topics", "create", "t2", "--partitions", "1", "--config", "retention.mss=5"],
     "unknown config 'retention.mss'"),
    (["consume", "events", "--partition", "3"], "partition 3 does not exist"),
    (["topics", "alter", "events", "--partitions", "2"], "partitions can only be added"),
    (["topics", "alter", "nope", "--partitions", "2"], "topic 'nope' does not exist"),
    (["groups", "describe", "nobody"], "no committed offsets"),
])
def test_errors_are_one_line(root, capsys, argv, message):
    code, out, err = run(capsys, "--root", root, *argv)
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("txlog: error: ") and message in err
    assert "Traceback" not in err


def test_missing_root_is_not_created(tmp_path, capsys):
    missing = tmp_path / "typo"
    code, _, err = run(capsys, "--root", str(missing), "topics", "list")
    assert code == 1 and "no such directory" in err
    assert not missing.exists()


def test_usage_errors_exit_2(root, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--root", root, "topics", "create", "x", "--partitions", "0"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for command in ("topics", "produce", "consume", "offsets", "transactions", "groups"):
        assert command in out


def test_as_a_separate_process(tmp_path):
    """The installed entry point (or ``python -m txlog.cli``) in its own process."""
    path = str(tmp_path / "proc")
    script = os.path.join(os.path.dirname(sys.executable), "txlog")
    base = [script] if os.path.exists(script) else [sys.executable, "-m", "txlog.cli"]

    def cli(*argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
        return subprocess.run([*base, "--root", path, *argv], input=stdin,
                              capture_output=True, timeout=120)

    assert cli("topics", "create", "orders", "--partitions", "2").returncode == 0
    done = cli("produce", "orders", "--partition", "1", stdin=b"one\ntwo\nthree\n")
    assert done.returncode == 0, done.stderr
    assert Log(path).read("orders", 1).column("value").to_pylist() == [b"one", b"two", b"three"]

    done = cli("consume", "orders", "--from-beginning")
    assert done.returncode == 0 and done.stdout == b"one\ntwo\nthree\n"

    # python -m works as well, and errors are one line without a traceback
    done = subprocess.run([sys.executable, "-m", "txlog.cli", "--root", path, "offsets", "nope"],
                          capture_output=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.decode().splitlines() == [
        f"txlog: error: topic 'nope' does not exist in {os.path.abspath(path)}"]


def test_consume_timeout_waits_for_new_records(root, capsys):
    started = time.monotonic()
    code, out, _ = run(capsys, "--root", root, "consume", "events", "--timeout-ms", "300")
    assert code == 0 and out == ""
    assert time.monotonic() - started >= 0.3


def test_produce_stops_at_a_line_without_separator(root, capsys, monkeypatch):
    code, out, err = run(capsys, "--root", root, "produce", "events", "--partition", "0",
                         "--key-separator", ":", stdin=b"k:v\nno separator\nk2:v2\n",
                         monkeypatch=monkeypatch)
    assert code == 1 and out == ""
    assert err.strip() == ("txlog: error: line 2 has no key separator ':'; "
                           "the 1 line(s) before it were produced")
    # what the message says is what happened
    got = Log(root).read("events", 0)
    assert got.column("key").to_pylist() == [b"k"] and got.column("value").to_pylist() == [b"v"]


KILLED_PRODUCER = """
import sys, time
from txlog import Log
log = Log(sys.argv[1])
producer = log.producer(transactional_id="killed-writer", transaction_timeout_ms=1000)
producer.init_transactions()
producer.begin_transaction()
producer.send("events", b"orphan", partition=1)
producer.flush()
print("ready", flush=True)
time.sleep(600)
"""


def test_find_hanging_and_abort_a_killed_producers_transaction(root):
    """Both as separate processes: a producer SIGKILLed mid-transaction, then the CLI."""
    from helpers_core import wait_for

    cli = functools.partial(txlog_process, root)

    live = Log(root).producer(transactional_id="live-writer")  # open, within its timeout
    live.init_transactions()
    live.begin_transaction()
    live.send("events", b"live", partition=2).get()

    proc = subprocess.Popen([sys.executable, "-c", KILLED_PRODUCER, root],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.kill()
    proc.wait(30)
    log = Log(root)
    assert log.last_stable_offset("events", 1) < log.end_offset("events", 1)

    def hanging_ids() -> list[str]:
        done = cli("transactions", "find-hanging")
        assert done.returncode == 0, done.stderr
        rows = table(done.stdout)
        assert rows[0][:6] == ["TOPIC", "PARTITION", "START-OFFSET", "PRODUCER-ID", "EPOCH",
                               "TRANSACTIONAL-ID"]
        return [row[5] for row in rows[1:]]

    # Its timeout (1 s) passes with nobody left to end it; the live one is never listed.
    wait_for(lambda: hanging_ids() == ["killed-writer"], 30, "the killed transaction to hang")
    rows = table(cli("transactions", "find-hanging", "--topic", "events").stdout)
    assert rows[1][:3] == ["events", "1", "0"] and "timeout" in " ".join(rows[1][7:])
    rows = table(cli("transactions", "find-hanging", "--older-than-ms", "0").stdout)
    assert sorted(r[5] for r in rows[1:]) == ["killed-writer", "live-writer"]

    described = cli("transactions", "describe", "killed-writer")
    assert described.returncode == 0
    assert "state: Ongoing" in described.stdout and "timeout ms: 1000" in described.stdout
    assert "partitions: events-1" in described.stdout

    done = cli("transactions", "abort", "killed-writer")
    assert done.returncode == 0, done.stderr
    log = Log(root)
    assert nothing_holds_the_lso(log, "events", [1])
    assert f"events-1: last stable offset {log.end_offset('events', 1)}" in done.stdout
    assert hanging_ids() == []
    assert log.read("events", 1).num_rows == 0  # the orphan is aborted, not committed

    again = cli("transactions", "abort", "killed-writer")
    assert again.returncode == 1
    assert again.stderr.strip() == ("txlog: error: transactional id 'killed-writer' has no "
                                    "open transaction to abort (it is CompleteAbort)")
    missing = cli("transactions", "describe", "nobody")
    assert missing.returncode == 1 and "'nobody' does not exist" in missing.stderr
    live.commit_transaction()


def test_producers_describe(root, capsys):
    log = Log(root)
    plain = log.producer()
    plain.send("events", b"a", partition=0).get()
    plain.send("events", b"b", partition=0).get()
    txn = log.producer(transactional_id="tx-writer")
    txn.init_transactions()
    txn.begin_transaction()
    txn.send("events", b"c", partition=0).get()

    code, out, _ = run(capsys, "--root", root, "producers", "describe", "events",
                       "--partition", "0")
    assert code == 0
    rows = table(out)
    assert rows[0] == ["PARTITION", "PRODUCER-ID", "EPOCH", "LAST-SEQUENCE", "LAST-TIMESTAMP",
                       "TXN-START-OFFSET", "TRANSACTIONAL-ID"]
    by_id = {int(r[1]): r for r in rows[1:]}
    assert set(by_id) == {plain.producer_id, txn.producer_id}
    assert by_id[plain.producer_id][2:4] == [str(plain.epoch), "1"]  # two records: seq 0, 1
    assert by_id[plain.producer_id][5:] == ["-", "-"]
    assert by_id[txn.producer_id][3] == "0"
    assert by_id[txn.producer_id][5:] == ["2", "tx-writer"]  # its open transaction at 2

    code, out, _ = run(capsys, "--root", root, "producers", "describe", "events")
    assert code == 0 and [r[0] for r in table(out)[1:]] == ["0", "0"]  # 1 and 2: none
    code, _, err = run(capsys, "--root", root, "producers", "describe", "nope")
    assert code == 1 and "topic 'nope' does not exist" in err
    txn.abort_transaction()


def test_dump_shows_batches_as_stored_and_reports_damage(root):
    cli = functools.partial(txlog_process, root)

    log = Log(root)
    plain = log.producer(linger_ms=60_000)
    futures = [plain.send("events", f"v{i}".encode(), key=b"k", partition=0,
                          headers=[("h", b"x")]) for i in range(3)]
    plain.flush()
    txn = log.producer(transactional_id="dumped")
    txn.init_transactions()
    txn.begin_transaction()
    aborted_at = txn.send("events", b"gone", partition=0).get().offset
    txn.abort_transaction()

    done = cli("dump", "events", "0", "--json", "--records")
    assert done.returncode == 0, done.stderr
    batches = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(b["baseOffset"], b["lastOffset"], b["count"]) for b in batches] == \
        [(0, 2, 3), (aborted_at, aborted_at, 1), (aborted_at + 1, aborted_at + 1, 1)]
    assert [f.get().offset for f in futures] == [0, 1, 2]
    first, data, marker = batches
    assert (first["producerId"], first["baseSequence"], first["lastSequence"]) == \
        (plain.producer_id, 0, 2)
    assert not first["isTransactional"] and all(b["valid"] for b in batches)
    assert [r["value"] for r in first["records"]] == ["v0", "v1", "v2"]
    assert first["records"][0]["headers"] == [["h", "x"]]
    assert data["isTransactional"] and data["transactionalId"] == "dumped"
    assert marker["isControl"] and marker["marker"] == "ABORT" and "records" not in marker

    text = cli("dump", "events", "0", "--from", str(aborted_at), "--max-batches", "1")
    assert text.returncode == 0 and len(text.stdout.splitlines()) == 1
    assert f"baseOffset: {aborted_at} " in text.stdout and "transactionalId: dumped" in text.stdout

    path = "topics/events/0/00000000000000000000.batch"
    with open(os.path.join(root, path), "r+b") as f:  # damage the first batch's payload
        f.seek(-5, os.SEEK_END)
        f.write(b"XXXXX")
    damaged = cli("dump", "--object", path, "--json")
    assert damaged.returncode == 1
    assert json.loads(damaged.stdout)["problem"] == "payload checksum mismatch"
    assert damaged.stderr.strip() == "txlog: error: 1 batch failed a check"
    whole = cli("dump", "events", "0")
    assert whole.returncode == 1 and len(whole.stdout.splitlines()) == 3  # the rest still shown

    assert "partition 7 does not exist" in cli("dump", "events", "7").stderr
    assert cli("dump").returncode == 1


def test_verify_passes_a_healthy_log_and_names_each_broken_invariant(root):
    import dataclasses

    from txlog.format.batch import (COMMIT, CONTROL_BIT, TRANSACTIONAL_BIT, BatchHeader,
                                    ControlRecord, encode_batch, encode_control)

    cli = functools.partial(txlog_process, root)

    log = Log(root)
    plain = log.producer()
    for i in range(5):
        plain.send("events", f"p{i}".encode(), partition=0).get()
    txn = log.producer(transactional_id="verified")
    txn.init_transactions()
    for i in range(4):
        txn.begin_transaction()
        txn.send("events", b"t", partition=i % 3).get()
        (txn.commit_transaction if i % 2 else txn.abort_transaction)()
    done = cli("verify", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    reports = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["partition"], r["problems"]) for r in reports] == [(0, []), (1, []), (2, [])]
    assert sum(r["records"] for r in reports) == 5 + 4

    part = log.partition("events", 0)
    first = part.header(0)
    raw = log.storage.read(part.batch_path(0))
    payload = raw[first.header_length:]

    def put(header: BatchHeader, body: bytes) -> None:
        assert log.storage.publish_if_absent(part.batch_path(header.base_offset),
                                             encode_batch(header, body))

    end = part.end_offset()
    put(dataclasses.replace(first, base_offset=end), payload)  # the first batch again
    problems = json.loads(cli("verify", "--json", "--topic", "events").stdout
                          .splitlines()[0])["problems"]
    assert len(problems) == 1 and "duplicates producer" in problems[0] and \
        "batch at offset 0" in problems[0]

    marker = ControlRecord(COMMIT, 0, -1)
    body = encode_control(marker)
    put(BatchHeader(base_offset=end + 1, record_count=1, attributes=CONTROL_BIT | TRANSACTIONAL_BIT,
                    producer_id=first.producer_id, producer_epoch=first.producer_epoch + 1,
                    decision_id="never-decided", transactional_id="forged"), body)
    put(dataclasses.replace(first, base_offset=end + 9, base_sequence=50), payload)  # a gap
    done = cli("verify", "--topic", "events")
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[1].split()[:2] == ["events", "0"] and lines[1].split()[-1] == "3"
    assert any("decision 'never-decided' does not commit it (missing)" in x for x in lines)
    assert any("starts at offset" in x and "contiguous" in x for x in lines)
    assert done.stderr.strip() == "txlog: error: 3 problems found"


def test_consume_from_an_offset_a_timestamp_and_follow(root):
    import signal

    cli = functools.partial(txlog_process, root)

    log = Log(root)
    producer = log.producer()
    for i in range(5):
        producer.send("events", f"r{i}".encode(), partition=1, timestamp_ms=1000 * (i + 1)).get()

    assert cli("consume", "events", "--partition", "1", "--offset", "3").stdout == "r3\nr4\n"
    assert cli("consume", "events", "--from-timestamp", "2500").stdout == "r2\nr3\nr4\n"
    assert cli("consume", "events", "--from-timestamp", "9000").stdout == ""
    no_partition = cli("consume", "events", "--offset", "1")
    assert no_partition.returncode == 1 and "--offset needs --partition" in no_partition.stderr
    past = cli("consume", "events", "--partition", "1", "--offset", "6")
    assert past.returncode == 1 and "offset 6 is past the end of events-1 (5)" in past.stderr
    both = cli("consume", "events", "--from-beginning", "--offset", "1")
    assert both.returncode == 2  # usage: not allowed with each other

    # stderr goes to a file: a pipe nobody reads until the end could fill and block it
    errors = Path(root).parent / "follow.err"
    follow = subprocess.Popen([sys.executable, "-m", "txlog.cli", "--root", root, "consume",
                               "events", "--partition", "1", "--offset", "4", "--follow"],
                              stdout=subprocess.PIPE, stderr=open(errors, "w"), text=True,
                              # A suite run from a background job inherits SIGINT ignored,
                              # and so would the command: give it Ctrl-C's default back.
                              preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                               signal.default_int_handler))
    try:
        assert follow.stdout.readline() == "r4\n"
        producer.send("events", b"later", partition=1).get()
        assert follow.stdout.readline() == "later\n"  # it waited for the new record
        follow.send_signal(signal.SIGINT)
        assert follow.wait(60) == 130, errors.read_text()[-2000:]
        assert "Traceback" not in errors.read_text()
    finally:
        if follow.poll() is None:
            follow.kill()


def test_produce_json_lines_in_one_transaction(root):
    cli = functools.partial(txlog_process, root)

    lines = "\n".join(json.dumps(r) for r in [
        {"value": "a", "key": "k1", "headers": [["h", "x"]], "partition": 2, "timestamp": 7},
        {"value": "b", "partition": 2}]) + "\n"
    done = cli("produce", "events", "--format", "json", "--transactional-id", "loader",
               stdin=lines)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "produced 2 records to events (partition 2: offsets 0-1)"
    log = Log(root)
    table = log.read("events", 2, include_headers=True)
    assert table.column("value").to_pylist() == [b"a", b"b"]
    assert table.column("key").to_pylist() == [b"k1", None]
    assert table.column("headers").to_pylist()[0] == [{"key": "h", "value": b"x"}]
    assert table.column("offset").to_pylist() == [0, 1]
    assert log.end_offset("events", 2) == 3  # and the COMMIT marker
    assert log.coordinator.metadata("loader").state.value == "CompleteCommit"

    bad = cli("produce", "events", "--format", "json", "--transactional-id", "loader",
              stdin='{"value": "c", "partition": 2}\nnot json\n')
    assert bad.returncode == 1
    assert bad.stderr.startswith("txlog: error: line 2 is not JSON") and \
        "nothing was produced (the transaction is aborted)" in bad.stderr
    log = Log(root)
    assert log.read("events", 2).column("value").to_pylist() == [b"a", b"b"]  # c invisible
    assert nothing_holds_the_lso(log, "events", [2])

    unknown = cli("produce", "events", "--format", "json", stdin='{"value": "d", "x": 1}\n')
    assert unknown.returncode == 1 and "unknown field(s) x" in unknown.stderr


@pytest.mark.parametrize("argv, keys", [
    (["offsets", "events"], ["partition", "log_end_offset", "last_stable_offset"]),
    (["transactions", "list"], ["transactional_id", "state", "producer_id", "epoch",
                                "partitions"]),
    (["transactions", "find-hanging", "--older-than-ms", "0"],
     ["topic", "partition", "start_offset", "producer_id", "epoch", "transactional_id",
      "duration_ms", "reason"]),
    (["producers", "describe", "events"], ["partition", "producer_id", "epoch",
                                           "last_sequence", "last_timestamp",
                                           "txn_start_offset", "transactional_id"]),
    (["groups", "describe", "g"], ["topic", "partition", "committed_offset", "log_end_offset",
                                   "last_stable_offset", "lag"]),
])
def test_tables_as_json_lines(root, capsys, argv, keys):
    log = Log(root)
    txn = log.producer(transactional_id="j")
    txn.init_transactions()
    txn.begin_transaction()
    txn.send("events", b"x", partition=1).get()
    log.commit_offsets("g", {("events", 1): 0})
    code, out, _ = run(capsys, "--root", root, *argv, "--json")
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows and all(list(r) == keys for r in rows)
    table_rows = table(run(capsys, "--root", root, *argv)[1])[1:]
    assert [str(r[keys[0]]) for r in rows] == [t[0] for t in table_rows]  # the same rows
    assert all(v != "-" for r in rows for v in r.values())  # "-" becomes null
    txn.abort_transaction()


def test_topics_describe_as_json(root, capsys):
    code, out, _ = run(capsys, "--root", root, "topics", "describe", "events", "--json")
    assert code == 0
    desc = json.loads(out)
    assert desc["topic"] == "events" and desc["partitions"] == 3
    assert [p["partition"] for p in desc["partition_offsets"]] == [0, 1, 2]
    assert desc["topic_id"] == Log(root).describe_topic("events").topic_id


def test_gc_removes_only_old_temp_files_of_dead_publishes(root):
    cli = functools.partial(txlog_process, root)

    log = Log(root)
    log.producer().send("events", b"kept", partition=0).get()
    part_dir = os.path.join(root, "topics", "events", "0")
    old = os.path.join(part_dir, ".tmp-" + "a" * 32)  # a publish killed before its link
    fresh = os.path.join(part_dir, ".tmp-" + "b" * 32)  # one that may still be running
    for path in (old, fresh):
        with open(path, "wb") as f:
            f.write(b"partial")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    before = sorted(os.listdir(part_dir))

    done = cli("gc", "--verbose")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:] == [
        "temp files  1", "removed 1 object", f"topics/events/0/{os.path.basename(old)}"]
    assert sorted(os.listdir(part_dir)) == [n for n in before if n != os.path.basename(old)]
    assert json.loads(cli("gc", "--temp-age", "0", "--json").stdout) == \
        {"removed": "temp files", "objects": 1}  # one JSON object per row
    assert Log(root).read("events", 0).column("value").to_pylist() == [b"kept"]
    assert cli("verify").returncode == 0


def test_long_commands_show_progress_on_a_terminal_only(root, tmp_path):
    import pty

    Log(root).producer().send("events", b"x", partition=0).get()
    command = [sys.executable, "-m", "txlog.cli", "--root", root]

    def stderr_on_a_terminal(*argv: str) -> tuple[int, str, str]:
        master, slave = pty.openpty()
        with open(tmp_path / "out", "w+") as out:
            done = subprocess.run([*command, *argv], stdout=out, stderr=slave, timeout=120)
            os.close(slave)
            seen = b""
            try:
                while chunk := os.read(master, 4096):
                    seen += chunk
            except OSError:  # the terminal closed (EIO once the child is gone)
                pass
            os.close(master)
            out.seek(0)
            return done.returncode, out.read(), seen.decode()

    code, out, err = stderr_on_a_terminal("verify")
    assert code == 0 and "verified 3/3 partitions" in err and out.startswith("TOPIC")
    code, out, err = stderr_on_a_terminal("dump", "events", "0")  # output to a file
    assert code == 0 and "dumped 1 batches" in err and out.startswith("batch size: ")
    code, out, err = stderr_on_a_terminal("compact", "events")
    assert code == 0 and "compacted 3/3 partitions" in err and out.startswith("PARTITION")
    piped = subprocess.run([*command, "verify"], capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == ""  # quiet in pipes
