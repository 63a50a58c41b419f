"""Tests of txlog.exactly_once.app_versions, Delta's txnAppId/txnVersion rule, without Spark.

Each test plays a foreachBatch writer: a job writes version v of an app with
two task attempts and commits it, or dies on the way, and a replay writes v
again.  Version v must end up in the log once, whatever the crash point or
interleaving.
"""

from __future__ import annotations

import logging
import threading

import pytest

from helpers_core import crash_after_the_decision, nothing_holds_the_lso
from txlog import READ_COMMITTED, Log, TxlogError
from txlog.errors import InvalidConfigError
from txlog.exactly_once.app_versions import AppVersions, default_prefix

T = "out"
APP = "orders-etl"
TIMEOUT_MS = 60_000


@pytest.fixture
def root(tmp_path) -> str:
    Log(tmp_path / "log").create_topic(T, 2)
    return str(tmp_path / "log")


def app() -> AppVersions:
    return AppVersions(APP, default_prefix(APP), TIMEOUT_MS)


def write_tasks(log: Log, job, version: int, writer: str = "w") -> list:
    members = []
    for task in range(2):
        producer = job.join(log, f"{task}-{writer}")
        producer.send(T, f"v{version}-t{task}".encode(), partition=task)
        members.append(producer.prepare_transaction())
    return members


def write(root: str, version: int) -> bool:
    """One whole job as the Spark batch writer runs it: True if it committed."""
    log, writes = Log(root), app()
    job = writes.start(log, version)
    if job is None:
        return False
    committed = writes.commit(log, job, version, write_tasks(log, job, version))
    job.wait_completed()  # the commit returned at its decision; the markers follow
    return committed


def values(root: str) -> list[str]:
    log = Log(root)
    return sorted(v.decode() for p in range(2)
                  for v in log.read(T, p, isolation_level=READ_COMMITTED)
                  .column("value").to_pylist())


def expected(*versions: int) -> list[str]:
    return sorted(f"v{v}-t{t}" for v in versions for t in range(2))


def assert_nothing_hangs(root: str) -> None:
    assert nothing_holds_the_lso(Log(root), T, 2), f"an LSO of {T} is held"


def test_versions_at_or_below_the_last_committed_are_skipped(root: str, caplog) -> None:
    assert write(root, 0) and write(root, 1)
    with caplog.at_level(logging.WARNING, "txlog.exactly_once.app_versions"):
        assert not write(root, 1)
        assert not write(root, 0)
    assert "skipping the write of app orders-etl version 1" in caplog.text
    assert write(root, 5)  # versions may skip numbers
    assert not write(root, 3)
    assert app().last_committed(Log(root)) == 5
    assert values(root) == expected(0, 1, 5)
    assert_nothing_hangs(root)


def test_the_version_commits_with_the_records(root: str) -> None:
    log, writes = Log(root), app()
    job = writes.start(log, 0)
    members = write_tasks(log, job, 0)
    job.abort(log, members)  # the job failed: neither its records nor its version count
    assert writes.last_committed(Log(root)) is None
    assert write(root, 0)
    assert values(root) == expected(0)


def test_killed_after_the_decision_the_replay_skips(root: str, monkeypatch) -> None:
    log, writes = Log(root), app()
    job = writes.start(log, 7)
    members = write_tasks(log, job, 7)
    with crash_after_the_decision(monkeypatch, job.decision_id):
        writes.commit(log, job, 7, members)
    # A new driver replays version 7: the decided commit is rolled forward, and skipped.
    assert not write(root, 7)
    assert values(root) == expected(7)
    assert write(root, 8)
    assert values(root) == expected(7, 8)
    assert_nothing_hangs(root)


def test_two_writers_of_one_version_interleaved(root: str) -> None:
    """Both pass the driver's check; the second commit finds the version committed."""
    log_a, log_b, writes = Log(root), Log(root), app()
    job_a = writes.start(log_a, 0)
    members_a = write_tasks(log_a, job_a, 0, "a")
    job_b = writes.start(log_b, 0)  # ends A's open job: prefixes are one writer's at a time
    members_b = write_tasks(log_b, job_b, 0, "b")
    with pytest.raises(TxlogError):
        writes.commit(log_a, job_a, 0, members_a)
    assert writes.commit(log_b, job_b, 0, members_b)
    assert values(root) == expected(0)
    # And the other order: B has written when A commits first; B's commit is refused.
    job_a = writes.start(log_a, 1)
    members_a = write_tasks(log_a, job_a, 1, "a")
    assert writes.commit(log_a, job_a, 1, members_a)
    job_b = writes.start(log_b, 1)
    assert job_b is None
    assert values(root) == expected(0, 1)
    assert_nothing_hangs(root)


def test_two_writers_of_one_version_after_both_started(root: str) -> None:
    """Both jobs started before either wrote (so neither ended the other's)."""
    log_a, log_b, writes = Log(root), Log(root), app()
    job_a = writes.start(log_a, 0)
    job_b = writes.start(log_b, 0)
    members_a = write_tasks(log_a, job_a, 0, "a")
    members_b = write_tasks(log_b, job_b, 0, "b")
    assert writes.commit(log_a, job_a, 0, members_a)
    assert not writes.commit(log_b, job_b, 0, members_b)
    assert values(root) == expected(0)
    assert_nothing_hangs(root)


def test_concurrent_writers_commit_a_version_at_most_once(root: str) -> None:
    outcomes: list[bool] = []
    barrier = threading.Barrier(4)

    def run() -> None:
        barrier.wait()
        try:
            outcomes.append(write(root, 0))
        except TxlogError:
            outcomes.append(False)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count(True) <= 1
    assert values(root) == (expected(0) if True in outcomes else [])
    assert not write(root, 0) or True not in outcomes


@pytest.mark.parametrize("version", [-1, True, 1.5, "3"])
def test_a_version_is_a_non_negative_integer(root: str, version) -> None:
    with pytest.raises(InvalidConfigError, match="non-negative integer"):
        app().start(Log(root), version)


@pytest.mark.parametrize("app_id", ["", "a/b", "x" * 197])
def test_an_app_id_must_name_a_prefix(app_id: str) -> None:
    with pytest.raises(InvalidConfigError, match="app id"):
        default_prefix(app_id)


def test_one_prefix_belongs_to_one_app(root: str) -> None:
    from txlog import SinkOwnerError

    assert write(root, 0)
    other = AppVersions("other-app", default_prefix(APP), TIMEOUT_MS)
    with pytest.raises(SinkOwnerError):
        other.start(Log(root), 0)
    assert values(root) == expected(0)
