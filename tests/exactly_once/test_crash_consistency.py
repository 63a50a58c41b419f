"""Crash consistency: writers on a disk that loses power, readers on what it kept.

Transactional producers, a consume-transform-produce loop committing its group's
offsets, and shared transactions run as threads on the real ``LocalStorage``,
whose OS calls power_loss.py records.  At a point chosen from the seed the power
goes: every write no fsync covered is dropped (file data as LazyFS drops it,
directory entries whose directory was not fsynced too).  Fresh readers then
check (crash_workload.py) that nothing acknowledged is lost, that
nothing aborted or undecided is visible, that a transaction under way at the cut
is whole or absent, that nothing is duplicated or out of order, that ``verify``
finds no hole or torn batch, and that the group's offset moved with its records.

The mutants remove one fsync each from the publish, and must be caught: a test
whose checker could not fail would prove nothing.
"""

from __future__ import annotations

import os
import random
import sys

import pytest

import crash_workload as workload
from power_loss import PowerCut, PowerLossDisk
from txlog import Log
from txlog.admin.verify import verify
from txlog.exactly_once.shared_transaction import SharedTransaction
from txlog.storage.local import LocalStorage
from txlog.storage.paths import DECISION_DIR

SEEDS = range(40) if os.environ.get("TXLOG_LARGE") else range(4)
# Recorded OS calls of a whole run after the setup (about 2,850 here): cut points are
# drawn below it, so nearly every run is cut with its writers at work.
CALLS = 2_800


def _run(tmp_path, monkeypatch, seed: int, cut_after: int | None, mutant=None
         ) -> tuple[PowerLossDisk, workload.History, workload.Verdict]:
    base = tmp_path / "disk"
    base.mkdir()
    disk = PowerLossDisk(base, seed)
    disk.install(monkeypatch)
    root = str(base / "log")
    workload.setup(root)
    if mutant is not None:  # the writers' publishes, not the setup's, lack the fsync
        mutant(monkeypatch, disk)
    if cut_after is not None:
        disk.cut_after = disk.calls + cut_after
    history = workload.run_writers(disk, root, seed)
    monkeypatch.undo()  # the readers run on the real os
    kept = disk.restore(tmp_path / "kept")
    return disk, history, workload.judge(kept / "log", history)


@pytest.mark.parametrize("seed", SEEDS)
def test_nothing_acknowledged_is_lost_and_nothing_partial_is_seen(tmp_path, monkeypatch,
                                                                    seed: int) -> None:
    cut_after = random.Random(seed).randrange(1, CALLS)
    disk, history, verdict = _run(tmp_path, monkeypatch, seed, cut_after)
    statuses = workload.statuses(history)
    print(f"seed {seed}: cut after {cut_after} calls ({disk.calls} made), "
          f"{disk.files_kept()} files kept, transactions {statuses}", file=sys.stderr)
    assert verdict.violations == []
    assert verdict.final, "nothing was read: the run checked nothing"


def _without_publish_directory_fsync(monkeypatch, disk: PowerLossDisk) -> None:
    """The directory fsync after ``link`` is gone; those of new directories stay."""
    real = LocalStorage._fsync_dir

    def fsync_dir(self, directory: str) -> None:
        if sys._getframe(1).f_code.co_name != "_publish_chunks":
            real(self, directory)

    monkeypatch.setattr(LocalStorage, "_fsync_dir", fsync_dir)


def _without_data_fsync(monkeypatch, disk: PowerLossDisk) -> None:
    """The file's fsync before ``link`` does nothing: its entry can outlive its bytes."""
    disk.file_fsyncs_lost = True


@pytest.mark.parametrize("mutant, found", [
    (_without_publish_directory_fsync, "lost: acknowledged transaction"),
    (_without_data_fsync, "reading the kept log failed: CorruptBatchError"),
])
def test_a_missing_fsync_is_caught(tmp_path, monkeypatch, mutant, found: str) -> None:
    """The power goes once the writers are done: every commit returned, and the mutant's
    unsynced publishes are what the checker must find lost (their names) or torn (their
    bytes)."""
    _, history, verdict = _run(tmp_path, monkeypatch, 0, None, mutant)
    assert workload.statuses(history).get("committed", 0) > 0
    assert any(v.startswith(found) for v in verdict.violations), verdict.violations


def test_a_decision_rolled_forward_by_another_writer_survives_the_cut(tmp_path,
                                                                       monkeypatch) -> None:
    """The driver of a shared transaction has linked its COMMIT decision and not yet
    fsynced its directory when another process, meeting the decision, rolls one member
    forward (its markers are durable at once); then the power goes.  The decision must
    not be lost under those markers: the other member would then be aborted, and one
    shared transaction would be half committed."""
    base = tmp_path / "disk"
    base.mkdir()
    disk = PowerLossDisk(base, 0)
    disk.install(monkeypatch)
    root = str(base / "log")
    log = Log(root)
    log.create_topic(workload.OUT, 2)
    job = SharedTransaction.start(log, workload.JOB, workload.TIMEOUT_MS)
    members = []
    for t in range(2):
        producer = job.join(Log(root), f"0-{t}")
        producer.send(workload.OUT, f"v{t}".encode(), partition=t)
        members.append(producer.prepare_transaction())
        producer.close()
    other = Log(root)
    decisions = str(base / "log" / DECISION_DIR)

    def roll_forward_before_the_decision_is_synced(op: str, target: object) -> None:
        if op == "open" and target == decisions:  # the driver's fsync of the directory
            disk.before = None
            other.coordinator.complete(members[0].transactional_id)
            disk.cut()

    disk.before = roll_forward_before_the_decision_is_synced
    with pytest.raises(PowerCut):
        job.commit(log, members)
    monkeypatch.undo()
    kept = str(disk.restore(tmp_path / "kept") / "log")
    workload.recover(kept)
    after = Log(kept, create=False)
    visible = [[v.decode() for v in after.read(workload.OUT, p).column("value").to_pylist()]
               for p in range(2)]
    assert visible == [["v0"], ["v1"]]
    assert [p for r in verify(after.services) for p in r.problems] == []


def test_the_checker_names_each_kind_of_anomaly() -> None:
    """Reads with one anomaly each, against a known history: every rule can fail."""
    history = workload.History()
    history.note("w0.0", "committed", {"w0.0.0": 0, "w0.0.1": 1})
    history.note("w0.1", "aborted", {"w0.1.0": 0})
    history.note("w0.2", "committing", {"w0.2.0": 0, "w0.2.1": 1})
    history.note("etl.0", "committed", {"etl:in.0": 2}, consumed=(0, 1))
    whole_input = [(k, f"in.{k}") for k in range(workload.INPUT_RECORDS)]
    good = {(workload.OUT, 0): [(0, "w0.0.0"), (2, "w0.2.0")],
            (workload.OUT, 1): [(0, "w0.0.1"), (2, "w0.2.1")],
            (workload.OUT, 2): [(0, "etl:in.0")], (workload.IN, 0): whole_input}
    offsets = {(workload.IN, 0): 1}
    assert workload.check(history, good, good, offsets) == []

    def found(final, first=None, committed=offsets) -> list[str]:
        return workload.check(history, first or final, final, committed)

    out0, out1 = (workload.OUT, 0), (workload.OUT, 1)
    assert "lost: acknowledged" in found({**good, out1: [(2, "w0.2.1")]})[0]
    assert "of aborted transaction w0.1 is visible" in found(
        {**good, out0: good[out0] + [(4, "w0.1.0")]})[0]
    assert "partial: transaction w0.2" in found({**good, out1: [(0, "w0.0.1")]})[0]
    assert "duplicate" in found({**good, out0: good[out0] + [(4, "w0.0.0")]})[0]
    assert "nobody wrote it" in found({**good, out0: good[out0] + [(4, "x.9")]})[0]
    assert "after a later record" in found({**good, out0: good[out0][::-1]})[0]
    assert "not a prefix" in found(good, {**good, out0: [(1, "w0.0.0")]})[0]
    assert "the acknowledged input is not whole" in found(
        {**good, (workload.IN, 0): whole_input[1:]})[0]
    assert "below acknowledged 1" in found(good, committed={})[-1]
    assert "were transformed" in found(good, committed={(workload.IN, 0): 2})[0]
