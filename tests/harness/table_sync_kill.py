"""Syncing maintainers SIGKILLed at random beside transactional writers: real processes.

    python tests/harness/table_sync_kill.py --root DIR [--seed S] [--txns N]

What runs (separate OS processes on one log root):

* 2 writers: transactional producers, each a loop of transactions over the
  topic's 3 partitions (one to four records, flushed), committed or aborted at
  random.  Each transaction's records (partition, offset, value, from the
  sends' futures) are recorded before its commit or abort, and its outcome
  after.  Two writer SIGKILLs, each restarted with the same transactional id,
  leave transactions whose outcome the history does not know.
* 2 maintainers: ``sync_table``, ``compact_table`` and ``expire_table`` in a
  loop (the table keeps 3 snapshots, so expiry by count runs often), each its
  own process.  The supervisor SIGKILLs one of them at random moments and
  starts it again, so that syncs, compactions and expiries die between
  writing their files and committing, and mid-commit.

When the writers are done the syncers are stopped, one last sync runs here,
and the checker verifies every snapshot the table keeps, against the
writers' history alone: exactly the committed records below its offsets,
none twice, every transaction whole or absent (one of unknown outcome either);
the last covers the whole log;
every data file a snapshot names exists.  Then an expiry that sees every file
as two hours old runs, and the newest snapshot is checked again: every file it
names is there, and no other data file is (every orphan of a killed writer,
and every file only expired snapshots named, is gone).
Exit status non-zero on any violation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

TOPIC = "events"
PARTITIONS = 3
WRITERS = 2
SYNCERS = 2
# Few snapshots kept in the metadata, so that expiry by count runs (and is killed) often.
KEPT_SNAPSHOTS = 3
WRITER_KILLS = 2  # writers SIGKILLed (each restarted as a new life of its transactional id)
# Between kills: a syncer starting up (pyiceberg imported) takes about a second here.
KILL_INTERVAL_S = (1.5, 3.0)
# Between a writer's transactions: spreads the writing over several kills.
WRITER_PAUSE_S = 0.2
SYNC_PAUSE_S = 0.05  # between a syncer's syncs: paces the loop, so it does not spin on a core
SELF = os.path.abspath(__file__)


def run_writer(args: argparse.Namespace) -> int:
    """Transactions of 1 to 4 records; each recorded as sent (once its sends returned)
    before its commit or abort, and its outcome after: a writer killed in between leaves
    a transaction of unknown outcome.  ``--life`` numbers this process among the
    writer's lives (its values stay unique across restarts)."""
    from txlog import Log

    rng = random.Random(f"{args.seed}/writer/{args.index}/{args.life}")
    producer = Log(args.root).producer(transactional_id=f"w{args.index}")
    producer.init_transactions()  # fences a killed life, whose open transaction aborts
    with open(args.history, "a", encoding="utf-8") as out:
        for n in range(args.txns):
            txn = f"w{args.index}.{args.life}.{n}"
            producer.begin_transaction()
            values = [(rng.randrange(PARTITIONS), f"{txn}.{i}") for i in range(rng.randint(1, 4))]
            futures = [(producer.send(TOPIC, v.encode(), partition=p), v) for p, v in values]
            producer.flush()
            records = [[m.partition, m.offset, v] for f, v in futures for m in [f.get()]]
            out.write(json.dumps({"txn": txn, "records": records}) + "\n")
            out.flush()
            commit = rng.random() < 0.7
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
            out.write(json.dumps({"txn": txn, "commit": commit}) + "\n")
            out.flush()
            time.sleep(rng.uniform(0, WRITER_PAUSE_S))
    producer.close()
    return 0


def run_syncer(args: argparse.Namespace) -> int:
    """A maintainer's pass in a loop: sync, then compact and expire the table, as
    ``txlog maintain`` does, so that kills land in all three."""
    from txlog.root.root import Root
    from txlog.tables.expiry import expire_table
    from txlog.tables.sync import sync_table
    from txlog.tables.upkeep import compact_table

    root = Root(args.root)
    while not os.path.exists(args.stop):
        result = sync_table(root, TOPIC)
        if result.snapshot_id is not None:
            print(f"synced {result.records} records to {result.offsets}, "
                  f"{result.conflicts} conflicts", flush=True)
        compact_table(root, TOPIC, min_files=2)
        expire_table(root, TOPIC)
        time.sleep(SYNC_PAUSE_S)
    return 0


def _start(role: str, args: argparse.Namespace, **extra: object) -> subprocess.Popen:
    argv = [sys.executable, SELF, "--role", role, "--root", args.root, "--seed", str(args.seed),
            "--txns", str(args.txns), "--history", args.history, "--stop", args.stop]
    for key, value in extra.items():
        argv += [f"--{key}", str(value)]
    return subprocess.Popen(argv)


def supervise(args: argparse.Namespace) -> int:
    from txlog import Log

    from txlog.root.root import Root
    from txlog.tables.catalog import RootCatalog, table_identifier
    from txlog.tables.layout import MAX_SNAPSHOTS_KEY
    from txlog.tables.sync import sync_table

    Log(args.root).create_topic(TOPIC, partitions=PARTITIONS)
    root = Root(args.root)
    sync_table(root, TOPIC)  # the table, empty, so that it can keep few snapshots
    with RootCatalog(root.storage).load_table(table_identifier(TOPIC)).transaction() as tx:
        tx.set_properties({MAX_SNAPSHOTS_KEY: str(KEPT_SNAPSHOTS)})
    rng = random.Random(f"{args.seed}/supervisor")
    writers = [_start("writer", args, index=i, life=0) for i in range(WRITERS)]
    syncers = [_start("syncer", args) for _ in range(SYNCERS)]
    kills, writer_kills = 0, 0
    while any(w.poll() is None for w in writers):
        time.sleep(rng.uniform(*KILL_INTERVAL_S))  # a random moment to kill at, not a wait
        if writer_kills < WRITER_KILLS and (kills + writer_kills) % 2 == 1:  # every other
            index = rng.randrange(WRITERS)
            if writers[index].poll() is None:
                writers[index].send_signal(signal.SIGKILL)
                writers[index].wait()
                writer_kills += 1
                writers[index] = _start("writer", args, index=index, life=writer_kills)
            continue
        victim = rng.randrange(SYNCERS)
        if syncers[victim].poll() is None:
            syncers[victim].send_signal(signal.SIGKILL)
            syncers[victim].wait()
            kills += 1
        elif syncers[victim].returncode != -signal.SIGKILL:
            print(f"FAIL: a syncer exited with status {syncers[victim].returncode}")
            return 1
        syncers[victim] = _start("syncer", args)
    Path(args.stop).touch()
    failed = [w.returncode for w in writers if w.returncode] + \
        [s.wait() for s in syncers if s.wait() not in (0, -signal.SIGKILL)]
    if failed:
        print(f"FAIL: a writer or syncer exited with status {failed}")
        return 1
    print(f"{writer_kills} writers killed")
    return check(args, kills)


def check(args: argparse.Namespace, kills: int) -> int:
    """Every snapshot the table keeps, then the newest again after an expiry that sees
    everything as two hours old: it must delete every orphan and nothing a snapshot
    still names."""
    from txlog import Log
    from txlog.root.root import Root
    from txlog.storage.paths import table_dir
    from txlog.tables.catalog import RootCatalog, table_identifier
    from txlog.tables.expiry import expire_table
    from txlog.tables.sync import sync_table

    root = Root(args.root)
    sync_table(root, TOPIC)
    lines = [json.loads(line) for line in Path(args.history).read_text().splitlines()]
    sent = {t["txn"]: {(p, o): v for p, o, v in t["records"]} for t in lines if "records" in t}
    outcome = {t["txn"]: t["commit"] for t in lines if "commit" in t}
    committed = [r for txn, r in sent.items() if outcome.get(txn) is True]
    unknown = [r for txn, r in sent.items() if txn not in outcome]
    table = RootCatalog(root.storage).load_table(table_identifier(TOPIC))
    problems, named, offsets = _check_snapshots(table, table.snapshots(), committed, unknown)
    log = Log(args.root)
    if offsets != {p: log.end_offset(TOPIC, p) for p in range(PARTITIONS)}:
        problems.append(f"the last snapshot ends at {offsets}, not at the log's end")
    stored = set(root.storage.list(f"{table_dir(TOPIC)}/data"))
    problems += [f"data file {n} is named but missing" for n in sorted(named - stored)]
    kept = len(table.snapshots())
    if kept > KEPT_SNAPSHOTS:
        problems.append(f"{kept} snapshots kept, more than {KEPT_SNAPSHOTS}")
    expire_table(root, TOPIC, now_ms=int(time.time() * 1000) + 2 * 3600 * 1000)
    table = RootCatalog(root.storage).load_table(table_identifier(TOPIC))
    later, still_named, _ = _check_snapshots(table, [table.current_snapshot()], committed,
                                             unknown)
    problems += [f"after the late expiry: {p}" for p in later]
    left = set(root.storage.list(f"{table_dir(TOPIC)}/data"))
    problems += [f"after the late expiry, data file {n} is named but missing"
                 for n in sorted(still_named - left)]
    problems += [f"after the late expiry, orphan {n} is left" for n in sorted(left - still_named)]
    for problem in problems:
        print("FAIL:", problem)
    print(f"{len(sent)} transactions ({len(committed)} committed, {len(unknown)} of unknown "
          f"outcome), {kills} syncers killed, "
          f"{kept} snapshots, {len(stored - named)} orphaned data files, "
          f"{len(stored - left)} deleted by the late expiry")
    print("FAIL" if problems else "OK")
    return 1 if problems else 0


def _check_snapshots(table, snapshots, committed, unknown
                     ) -> tuple[list[str], set[str], dict[int, int]]:
    """Problems of ``snapshots`` against the writers' history (a transaction of unknown
    outcome may be in or out, but whole), the data files they name, and the offsets of
    the last."""
    problems: list[str] = []
    named: set[str] = set()
    offsets: dict[int, int] = {}
    for snapshot in snapshots:
        offsets = {int(p): o for p, o in json.loads(snapshot.summary["txlog.offsets"]).items()}
        scan = table.scan(snapshot_id=snapshot.snapshot_id)
        named |= {task.file.file_path.rpartition("/")[2] for task in scan.plan_files()}
        rows = scan.to_arrow()
        keys = list(zip(rows["partition"].to_pylist(), rows["offset"].to_pylist()))
        got = dict(zip(keys, (v.decode() for v in rows["value"].to_pylist())))
        wanted = {k: v for t in committed for k, v in t.items() if k[1] < offsets[k[0]]}
        for t in unknown:  # in: it committed (the snapshot holds all of it, or splits it)
            if any(k in got for k in t):
                wanted.update(t)
        if len(keys) != len(got) or got != wanted:
            problems.append(f"snapshot {snapshot.snapshot_id} at {offsets}: "
                            f"{len(keys) - len(got)} duplicates, "
                            f"{len(set(got) ^ set(wanted))} records differ")
        problems += [f"snapshot {snapshot.snapshot_id} splits {sorted(t)}"
                     for t in committed + unknown if 0 < sum(k in got for k in t) < len(t)]
    return problems, named, offsets


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["supervisor", "writer", "syncer"],
                        default="supervisor")
    parser.add_argument("--root", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--txns", type=int, default=30)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--life", type=int, default=0)
    parser.add_argument("--history")
    parser.add_argument("--stop")
    args = parser.parse_args()
    if args.role == "supervisor":
        args.history = args.history or f"{args.root}.history.jsonl"
        args.stop = args.stop or f"{args.root}.stop"
        return supervise(args)
    return {"writer": run_writer, "syncer": run_syncer}[args.role](args)


if __name__ == "__main__":
    sys.exit(main())
