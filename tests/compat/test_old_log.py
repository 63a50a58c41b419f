"""A log written before the issue 31 restructuring still reads, verifies and appends.

fixtures/log_v1.tar.gz was written by make_fixtures.py with the code of that time
(two topics, keyed records with headers, idempotent and transactional producers,
committed and aborted transactions, offsets sent to a transaction and committed plainly,
a compacted partition, delete-records, an altered config, added partitions, a stream
sink, a shared job, an app version, a group with members, a data object), and
fixtures/log_v1_expected.json holds what that code read back from it.  The tests never
regenerate either: they copy the log and compare what today's code reads.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from make_fixtures import (KEYED, LOG_EXPECTED, LOG_TARBALL, PLAIN, fixture_sink,
                           partition_records, read_back, unpack)
from txlog import READ_COMMITTED, Log
from txlog.cli.main import main as txlog_main

EXPECTED = json.loads(LOG_EXPECTED.read_text())


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return unpack(LOG_TARBALL, tmp_path / "log")


def _as_json(value: object) -> object:
    return json.loads(json.dumps(value))


def test_reads_back_as_the_old_code_read_it(root: Path) -> None:
    """Records of every partition in both isolation levels, offsets, topics, groups and the
    stream sink's next batch."""
    current = _as_json(read_back(Log(root)))
    for topic, described in EXPECTED["topics"].items():
        for partition, expected in described["records"].items():
            assert current["topics"][topic]["records"][partition] == expected, \
                f"{topic}-{partition} reads differently"
    assert current == EXPECTED


def test_verify_passes(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert txlog_main(["verify", "--root", str(root), "--json"]) == 0
    reports = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted((r["topic"], r["partition"]) for r in reports) == sorted(
        (topic, int(p)) for topic, d in EXPECTED["topics"].items() for p in d["records"])
    assert all(r["problems"] == [] for r in reports)


def test_appending_to_the_old_log(root: Path) -> None:
    """New producers, transactions (a new id and an old one), group offsets and a stream
    sink batch go on where the old code left off, and what was there stays."""
    log = Log(root)
    plain = log.producer(linger_ms=0)
    plain.send(KEYED, b"appended", key=b"k0", partition=0, headers=[("new", b"1")])
    plain.flush()
    plain.close()
    for tid in ("tx-a", "tx-new"):
        producer = log.producer(transactional_id=tid, linger_ms=0)
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(PLAIN, f"{tid}-appended".encode(), partition=1)
        producer.send_offsets_to_transaction({(PLAIN, 1): 5}, "etl")
        producer.commit_transaction()
        producer.close()
    sink = fixture_sink()
    sink.fence(log)
    batch = sink.next_batch(log)
    assert batch == EXPECTED["sink_next_batch"]
    job = sink.begin_batch()
    member = job.join(log, "0-1", linger_ms=0)
    member.send(KEYED, b"sink-appended", partition=2)
    assert sink.commit_batch(log, job, batch, [member.prepare_transaction()])

    reopened = Log(root)
    assert fixture_sink().next_batch(reopened) == batch + 1
    assert reopened.committed("etl")[(PLAIN, 1)] == 5
    appended = {}
    for topic, described in EXPECTED["topics"].items():
        for p, expected in described["records"].items():
            rows = partition_records(reopened, topic, int(p), READ_COMMITTED)
            old = expected["read_committed"]
            assert rows[:len(old)] == old, f"{topic}-{p}: the old records changed"
            assert all(r["offset"] >= expected["end"] for r in rows[len(old):])
            appended[f"{topic}-{p}"] = [base64.b64decode(r["value"]) for r in rows[len(old):]]
    assert appended == {
        f"{KEYED}-0": [b"appended"], f"{KEYED}-1": [], f"{KEYED}-2": [b"sink-appended"],
        f"{PLAIN}-0": [], f"{PLAIN}-1": [b"tx-a-appended", b"tx-new-appended"]}
    assert txlog_main(["verify", "--root", str(root)]) == 0
