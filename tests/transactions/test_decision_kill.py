"""Committers SIGKILLed between the decision and the markers (docs/protocol.md 4.5).

Since EndTxn returns at its decision, the markers, group offsets and Complete
version come after it, in a thread a SIGKILL takes with it.  Runs of
tests/harness/decision_kill.py commit and abort consume-transform-produce
transactions and kill themselves right after decisions; each run is a new
transactional id, so only readers and offset fetches meet what a killed run
left.  After every run, and at the end, read_committed readers must see each
committed transaction whole and no aborted one; and since each run starts
from the group's offsets as its consumer fetches them, a fetch that returned
offsets older than a committed transaction's would copy some input records
twice into the committed output, which is checked too.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from txlog import Log
from txlog.transactions.metadata import TxnState

from conftest import HARNESS_DIR

WORKER = HARNESS_DIR / "decision_kill.py"
RECORDS = 90  # per input partition: six batches of decision_kill.BATCH
PARTITIONS = 2
KILL_PROBABILITY = 0.4
MAX_RUNS = 40


def _committed_output(root: Path) -> dict[str, list[tuple[int, int, int]]]:
    """Per transaction, (output partition, input partition, input offset) of each of its
    records a fresh read_committed reader sees."""
    log = Log(str(root))
    seen: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for p in range(PARTITIONS):
        for value in log.read("out", p).column("value").to_pylist():
            txn, in_partition, offset = value.decode().split("|")
            seen[txn].append((p, int(in_partition), int(offset)))
    return seen


def _check(root: Path, history: Path) -> dict[str, list[tuple[int, int, int]]]:
    intents = {}
    returned = set()
    for line in history.read_text().splitlines():
        txn, what = line.split()
        if what == "returned":
            returned.add(txn)
        else:
            intents[txn] = what
    seen = _committed_output(root)
    for txn, records in seen.items():
        assert intents.get(txn) == "commit", f"{txn} is visible but was {intents.get(txn)}"
        by_partition = defaultdict(list)
        for out_p, in_p, offset in records:
            assert out_p == in_p
            by_partition[in_p].append(offset)
        for offsets in by_partition.values():  # whole: one contiguous batch, each once
            assert sorted(offsets) == list(range(min(offsets), max(offsets) + 1)), txn
        assert len(by_partition) == PARTITIONS, f"{txn} is visible in some partitions only"
    for txn in returned:
        assert txn in seen, f"the commit of {txn} returned, but readers do not see it"
    copies = defaultdict(list)
    for txn, records in seen.items():
        for _, in_p, offset in records:
            copies[(in_p, offset)].append(txn)
    twice = {k: v for k, v in copies.items() if len(v) > 1}
    assert not twice, ("input records copied by more than one committed transaction (an "
                       f"offset fetch returned offsets older than a committed one's): {twice}")
    return seen


def test_kills_between_decision_and_markers(tmp_path: Path) -> None:
    root = tmp_path / "log"
    history = tmp_path / "history"
    history.touch()
    log = Log(str(root))
    log.create_topic("in", PARTITIONS)
    log.create_topic("out", PARTITIONS)
    with log.producer() as producer:
        for p in range(PARTITIONS):
            for i in range(RECORDS):
                producer.send("in", f"{p}-{i}".encode(), partition=p)
    killed_decided = 0
    for run in range(MAX_RUNS):
        before = history.read_text().splitlines()
        proc = subprocess.run([sys.executable, str(WORKER), str(root), str(run), str(history),
                               str(run), str(KILL_PROBABILITY)], capture_output=True,
                              text=True, timeout=120)
        _check(root, history)
        if proc.returncode == 0:
            break
        assert proc.returncode == -9, proc.stderr
        last = history.read_text().splitlines()[len(before):]
        if last and last[-1].endswith(" commit"):
            killed_decided += 1
    else:
        raise AssertionError(f"the input was not consumed in {MAX_RUNS} runs")
    assert killed_decided >= 2, "too few runs died right after a COMMIT decision"
    seen = _check(root, history)
    consumed = {(in_p, offset) for records in seen.values() for _, in_p, offset in records}
    assert consumed == {(p, i) for p in range(PARTITIONS) for i in range(RECORDS)}
    assert Log(str(root)).committed("g") == {("in", p): RECORDS for p in range(PARTITIONS)}
    # What the killed runs left unfinished is rolled forward by whoever meets it.
    final = Log(str(root))
    final.abort_expired_transactions()
    for run in range(MAX_RUNS):
        meta = final.coordinator.metadata(f"c{run}")
        assert meta is None or meta.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT,
                                              TxnState.COMPLETE_ABORT), (run, meta.state)
