"""``txlog gc`` after many transactions: the coordinator keeps O(live transactional ids)
objects, not O(transactions), and nothing any reader sees changes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from txlog import Log

IDS = 4
TRANSACTIONS = 10_000
WRITER = """
import sys
from txlog import Log
log = Log(sys.argv[1], fsync=False)
for i in map(int, sys.argv[3:]):
    producer = log.producer(transactional_id=f"x{i}")
    producer.init_transactions()
    for n in range(int(sys.argv[2])):
        producer.begin_transaction()
        producer.send("t", f"x{i}.{n}".encode(), partition=n % 2)
        (producer.commit_transaction if n % 4 else producer.abort_transaction)()
"""


def _objects(root: Path, under: str) -> int:
    return sum(len(files) for _, _, files in os.walk(root / under))


def _visible(root: Path) -> list:
    log = Log(root)
    return [(log.read("t", p).column("value").to_pylist(), log.partition("t", p).end_offset(),
             log.partition("t", p).last_stable_offset()) for p in range(2)]


@pytest.fixture
def fast_root(tmp_path: Path):
    """A root in memory-backed /dev/shm where there is one: 40,000 small files are written
    here, and what is tested is gc, not the disk."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        directory = tempfile.mkdtemp(dir="/dev/shm", prefix="txlog-gc-")
        yield Path(directory) / "log"
        shutil.rmtree(directory, ignore_errors=True)
    else:
        yield tmp_path / "log"


def test_gc_after_ten_thousand_transactions_keeps_objects_per_live_id(fast_root: Path) -> None:
    root = fast_root
    Log(root).create_topic("t", 2)
    each = TRANSACTIONS // IDS
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(each), *ids])
               for ids in (["0", "1"], ["2", "3"])]  # two processes: the machine has 2 cores
    assert [w.wait(timeout=600) for w in writers] == [0, 0]
    before = _objects(root, "coordinator")
    visible = _visible(root)
    assert sum(len(v[0]) for v in visible) == TRANSACTIONS * 3 // 4
    done = subprocess.run([sys.executable, "-m", "txlog.cli", "--root", str(root), "gc",
                           "--chain-age", "0", "--json"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    removed = {row["removed"]: row["objects"] for row in map(json.loads,
                                                              done.stdout.splitlines())}
    after = _objects(root, "coordinator")
    print(f"coordinator objects: {before} before gc, {after} after ({removed})")
    assert removed["decisions"] == TRANSACTIONS
    # per live transactional id its newest metadata version; plus the newest producer-id block
    assert after == IDS + 1
    assert _visible(root) == visible
