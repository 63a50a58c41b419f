"""Garbage collection of coordinator state and compaction leftovers (no Spark).

The 10,000-transaction criterion through the command line is in test_cli_gc.py;
gc inside the multi-process loop is in test_maintenance_loop.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from txlog import Log
from txlog.storage.chain import VersionChain
from txlog.storage.paths import BLOCK_DIR, DECISION_DIR, LEASE_DIR, TXN_DIR
from txlog.partition.isolation import READ_UNCOMMITTED
from txlog.exactly_once.shared_transaction import SharedTransaction

T = "t"


def _objects(root: Path, under: str) -> int:
    return sum(len(files) for _, _, files in os.walk(root / under))


def _view(log: Log) -> list:
    out = []
    for p in range(2):
        part = log.partition(T, p)
        out.append((log.read(T, p, 0).column("value").to_pylist(),
                    log.read(T, p, 0, isolation_level=READ_UNCOMMITTED).num_rows,
                    part.last_stable_offset(), part.end_offset()))
    return out


@pytest.fixture
def log(tmp_path: Path) -> Log:
    log = Log(tmp_path, fsync=False)
    log.create_topic(T, 2)
    return log


def _transactions(log: Log, ids: int, each: int) -> None:
    for i in range(ids):
        producer = log.producer(transactional_id=f"x{i}")
        producer.init_transactions()
        for n in range(each):
            producer.begin_transaction()
            producer.send(T, f"x{i}.{n}".encode(), partition=n % 2)
            (producer.commit_transaction if n % 3 else producer.abort_transaction)()
        producer.close()  # the last end's roll-forward runs behind it; gc sees it done


def test_gc_keeps_what_live_ids_need_and_changes_no_read(log: Log, tmp_path: Path) -> None:
    _transactions(log, 3, 40)
    before = _view(log)
    assert _objects(tmp_path, "coordinator") > 3 * 40 * 2
    report = log.gc(chain_age_s=0)
    assert report.count("decisions") == 120 and report.count("transaction metadata versions")
    # one metadata version per transactional id and the newest producer-id block
    assert _objects(tmp_path, "coordinator") == 3 + 1
    assert _view(log) == before and _view(Log(tmp_path)) == before
    # the ids keep working, fenced and numbered as before
    again = Log(tmp_path).producer(transactional_id="x0")
    again.init_transactions()
    again.begin_transaction()
    again.send(T, b"after", partition=0)
    again.commit_transaction()
    assert _view(Log(tmp_path))[0][0][-1] == b"after"


def test_recent_versions_stay_until_their_successor_is_old(log: Log, tmp_path: Path) -> None:
    _transactions(log, 1, 5)
    assert log.gc().count("transaction metadata versions") == 0  # all written just now
    versions = sorted(os.listdir(tmp_path / TXN_DIR / "x0"))
    later = log.gc(now_ms=10**15)  # far in the future: only the newest version stays
    assert later.count("transaction metadata versions") == len(versions) - 1
    assert os.listdir(tmp_path / TXN_DIR / "x0") == versions[-1:]


def test_a_decision_a_transaction_still_follows_stays(log: Log, tmp_path: Path,
                                                      monkeypatch) -> None:
    producer = log.producer(transactional_id="slow")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(T, b"decided", partition=0)
    real = log.coordinator.ender.complete

    def stop_after_deciding(transactional_id, only_decision=None):
        raise RuntimeError("the ender died between its decision and the markers")

    monkeypatch.setattr(log.coordinator.ender, "complete", stop_after_deciding)
    producer.commit_transaction()  # returns at its decision; the roll-forward follows
    with pytest.raises(RuntimeError):
        producer.flush()  # which failed: the producer's next call says so
    monkeypatch.setattr(log.coordinator.ender, "complete", real)
    decisions = os.listdir(tmp_path / DECISION_DIR)
    assert len(decisions) == 1
    fresh = Log(tmp_path)
    assert fresh.gc(chain_age_s=0).count("decisions") == 0
    assert os.listdir(tmp_path / DECISION_DIR) == decisions
    # readers still resolve the transaction as committed through the decision
    assert fresh.read(T, 0, 0).column("value").to_pylist() == [b"decided"]
    fresh.coordinator.complete("slow")
    assert fresh.gc(chain_age_s=0).count("decisions") == 1
    assert Log(tmp_path).read(T, 0, 0).column("value").to_pylist() == [b"decided"]


def test_shared_decisions_wait_for_their_age_and_leases_go_once_decided(
        log: Log, tmp_path: Path) -> None:
    job = SharedTransaction.start(log, "job", 60_000)
    producer = job.join(log, "0")
    producer.send(T, b"shared", partition=1)
    member = producer.prepare_transaction()
    assert os.listdir(tmp_path / LEASE_DIR) == [job.decision_id]
    job.commit(log, [member])
    assert job.wait_completed(timeout=30)  # a decision is collected only once rolled forward
    report = log.gc(chain_age_s=0)
    assert report.count("decisions") == 0  # a late end call must still find it
    assert report.count("lease versions") >= 1 and not os.listdir(tmp_path / LEASE_DIR)
    assert log.gc(chain_age_s=0, decision_age_s=0, now_ms=10**15).count("decisions") == 1
    assert Log(tmp_path).read(T, 1, 0).column("value").to_pylist() == [b"shared"]


def test_only_the_newest_producer_id_block_stays(log: Log, tmp_path: Path) -> None:
    for _ in range(3):
        Log(tmp_path).producer()  # each Log claims a block of its own
    blocks = sorted(os.listdir(tmp_path / BLOCK_DIR))
    assert len(blocks) >= 3
    assert log.gc().count("producer-id blocks") == len(blocks) - 1
    fresh = Log(tmp_path).producer()
    fresh.send(T, b"y", partition=0)
    fresh.flush()
    newest = int(blocks[-1])
    assert fresh.producer_id >= (newest + 1) * 1000  # never an id of a removed block


def test_a_version_computed_from_a_collected_predecessor_is_withdrawn(tmp_path: Path) -> None:
    log = Log(tmp_path, fsync=False)
    stale = VersionChain(log.storage, "coordinator/groups/g")
    fresh = VersionChain(log.storage, "coordinator/groups/g")
    fresh.update(lambda v, value: {"n": 0, "time_ms": 0})
    assert stale.latest()[0] == 0  # the stale process reads version 0 ...
    for n in range(1, 4):  # ... others move on, and gc removes versions 0 to 2
        fresh.update(lambda v, value, n=n: {"n": n, "time_ms": 0})
    log.gc(chain_age_s=0)
    assert sorted(os.listdir(tmp_path / "coordinator/groups/g")) == [f"{3:020d}"]
    # Publishing version 1 from the stale read succeeds at the storage level, finds its
    # predecessor gone, withdraws it; the update then computes again from version 3.
    seen = []
    stale.update(lambda v, value: seen.append((v, value["n"])) or {"n": value["n"] + 10,
                                                                    "time_ms": 0})
    assert seen == [(0, 0), (3, 3)]
    assert sorted(os.listdir(tmp_path / "coordinator/groups/g")) == [f"{3:020d}", f"{4:020d}"]
    assert fresh.latest() == (4, {"n": 13, "time_ms": 0})
