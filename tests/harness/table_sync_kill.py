"""Syncing maintainers SIGKILLed at random beside transactional writers: real processes.

    python tests/harness/table_sync_kill.py --root DIR [--seed S] [--txns N]

What runs (separate OS processes on one log root):

* 2 writers: transactional producers, each a loop of transactions over the
  topic's 3 partitions (one to four records, flushed), committed or aborted at
  random; after each one's commit or abort returned, the writer records its
  records (partition, offset, value, from the sends' futures) and the outcome.
* 2 syncers: ``sync_table`` in a loop, each its own process.  The supervisor
  SIGKILLs one of them at random moments and starts it again, so that syncs
  die between writing their data file and committing, and mid-commit.

When the writers are done the syncers are stopped, one last sync runs here,
and the checker verifies every snapshot the table ever had, against the
writers' history alone: exactly the committed records below its offsets,
none twice, every transaction whole or absent; the last covers the whole log;
every data file a snapshot names exists.  Data files no snapshot names (a
killed sync's) are counted, not an error: their removal is a later step.
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
# Between kills: a syncer starting up (pyiceberg imported) takes about a second here.
KILL_INTERVAL_S = (1.5, 3.0)
# Between a writer's transactions: spreads the writing over several kills.
WRITER_PAUSE_S = 0.2
SYNC_PAUSE_S = 0.05  # between a syncer's syncs: paces the loop, so it does not spin on a core
SELF = os.path.abspath(__file__)


def run_writer(args: argparse.Namespace) -> int:
    from txlog import Log

    rng = random.Random(f"{args.seed}/writer/{args.index}")
    producer = Log(args.root).producer(transactional_id=f"w{args.index}")
    producer.init_transactions()
    with open(args.history, "a", encoding="utf-8") as out:
        for n in range(args.txns):
            producer.begin_transaction()
            values = [(rng.randrange(PARTITIONS), f"w{args.index}.{n}.{i}")
                      for i in range(rng.randint(1, 4))]
            futures = [(producer.send(TOPIC, v.encode(), partition=p), v) for p, v in values]
            producer.flush()
            records = [[m.partition, m.offset, v] for f, v in futures for m in [f.get()]]
            commit = rng.random() < 0.7
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
            out.write(json.dumps({"commit": commit, "records": records}) + "\n")
            out.flush()
            time.sleep(rng.uniform(0, WRITER_PAUSE_S))
    producer.close()
    return 0


def run_syncer(args: argparse.Namespace) -> int:
    from txlog.root.root import Root
    from txlog.tables.sync import sync_table

    root = Root(args.root)
    while not os.path.exists(args.stop):
        result = sync_table(root, TOPIC)
        if result.snapshot_id is not None:
            print(f"synced {result.records} records to {result.offsets}, "
                  f"{result.conflicts} conflicts", flush=True)
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

    Log(args.root).create_topic(TOPIC, partitions=PARTITIONS)
    rng = random.Random(f"{args.seed}/supervisor")
    writers = [_start("writer", args, index=i) for i in range(WRITERS)]
    syncers = [_start("syncer", args) for _ in range(SYNCERS)]
    kills = 0
    while any(w.poll() is None for w in writers):
        time.sleep(rng.uniform(*KILL_INTERVAL_S))  # a random moment to kill at, not a wait
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
    return check(args, kills)


def check(args: argparse.Namespace, kills: int) -> int:
    from txlog import Log
    from txlog.root.root import Root
    from txlog.storage.paths import table_dir
    from txlog.tables.catalog import RootCatalog, table_identifier
    from txlog.tables.sync import sync_table

    root = Root(args.root)
    sync_table(root, TOPIC)
    lines = [json.loads(line) for line in Path(args.history).read_text().splitlines()]
    committed = [{(p, o): v for p, o, v in t["records"]} for t in lines if t["commit"]]
    table = RootCatalog(root.storage).load_table(table_identifier(TOPIC))
    problems, named = [], set()
    for snapshot in table.snapshots():
        offsets = {int(p): o for p, o in json.loads(snapshot.summary["txlog.offsets"]).items()}
        scan = table.scan(snapshot_id=snapshot.snapshot_id)
        named |= {task.file.file_path.rpartition("/")[2] for task in scan.plan_files()}
        rows = scan.to_arrow()
        keys = list(zip(rows["partition"].to_pylist(), rows["offset"].to_pylist()))
        got = dict(zip(keys, (v.decode() for v in rows["value"].to_pylist())))
        wanted = {k: v for t in committed for k, v in t.items() if k[1] < offsets[k[0]]}
        if len(keys) != len(got) or got != wanted:
            problems.append(f"snapshot {snapshot.snapshot_id} at {offsets}: "
                            f"{len(keys) - len(got)} duplicates, "
                            f"{len(set(got) ^ set(wanted))} records differ")
        problems += [f"snapshot {snapshot.snapshot_id} splits {sorted(t)}" for t in committed
                     if 0 < sum(k in got for k in t) < len(t)]
    log = Log(args.root)
    if offsets != {p: log.end_offset(TOPIC, p) for p in range(PARTITIONS)}:
        problems.append(f"the last snapshot ends at {offsets}, not at the log's end")
    stored = set(root.storage.list(f"{table_dir(TOPIC)}/data"))
    problems += [f"data file {n} is named but missing" for n in sorted(named - stored)]
    for problem in problems:
        print("FAIL:", problem)
    print(f"{len(lines)} transactions ({len(committed)} committed), {kills} syncers killed, "
          f"{len(table.snapshots())} snapshots, {len(stored - named)} orphaned data files")
    print("FAIL" if problems else "OK")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["supervisor", "writer", "syncer"],
                        default="supervisor")
    parser.add_argument("--root", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--txns", type=int, default=30)
    parser.add_argument("--index", type=int, default=0)
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
