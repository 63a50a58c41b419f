"""Expiry under SIGKILL: writers, zombies and a maintainer that expires and deletes state.

    python tests/harness/expiry_kill_harness.py --root DIR [--seed S] [--seconds N] [--shared]

Separate OS processes on one log root, with every expiration shortened so
that it happens many times within the run (producer.id.expiration.ms 0.7 s,
transactional.id.expiration.ms 0.8 s, transaction timeout 1.5 s, dead chains
deleted after 1.5 s):

* writers: each transaction takes a fresh producer on an id from a small pool
  (``w<i>-<k mod 4>``), so ids are fenced, go idle, expire, are deleted and
  start again while other ids run.  Before sending, a writer records the
  values; after the call returned, the outcome.  Some transactions stall
  ("zombies"): after one flushed batch, and one more record waiting for a
  partition the transaction already added, the writer sleeps longer than
  the timeout and the producer expiration, checks whether its transaction
  was ended meanwhile, and then flushes and commits anyway.
* a maintainer: gc with the short expirations, and compaction, in a loop.
* the supervisor SIGKILLs writers and the maintainer at random moments and
  starts them again.

With ``--shared`` each writer instead runs jobs as the Spark writers do: a
``SharedTransaction`` of two attempts whose ids are the same in every job
(``j<i>-<task>``, as Spark's streaming writer names them), so every job's end
deletes its attempts' chains at once (docs/protocol.md 5.3) and the next job
starts them again.  In some jobs the second attempt is a zombie: it flushes
one batch, keeps one record buffered, is never handed over (the job's end
aborts it as an orphan and deletes its chain), and flushes after the job
ended, sometimes after the partitions forgot its producer.

The checker then ends what is left (after the timeout), reads every
partition and verifies: every committed transaction's records exactly once;
nothing of an aborted or failed one; a transaction killed mid-way entirely
or not at all; offsets increasing; and no record a zombie flushed after its
transaction had ended is in the log at all, even read_uncommitted (a fenced
zombie's batch is refused although the partition forgot its entry).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator

TOPIC = "e"
PARTITIONS = 2
WRITERS = 3
POOL = 4
PRODUCER_EXPIRY_MS = 700
TXN_ID_EXPIRY_MS = 800
TIMEOUT_MS = 1500
DEAD_AGE_S = 1.5
STALL_S = 5.0
SELF = os.path.abspath(__file__)


@contextlib.contextmanager
def _writing(args: argparse.Namespace) -> Iterator[tuple[random.Random, Any, Callable[..., None]]]:
    """What both writer roles start from: a random stream of their own, the log, and
    ``note``, which appends to the history a line at a time (the writer is SIGKILLed)."""
    from txlog import Log

    rng = random.Random(f"{args.seed}/{args.index}/{args.incarnation}")
    log = Log(args.root, fsync=False)
    try:  # pyarrow imports pandas on a first table: not inside the first transaction
        import pandas  # noqa: F401
    except ImportError:
        pass
    with open(args.history, "a", encoding="utf-8") as out:
        def note(**entry: object) -> None:
            out.write(json.dumps(entry) + "\n")
            out.flush()

        yield rng, log, note


def run_writer(args: argparse.Namespace) -> int:
    from txlog import Log

    deadline = time.time() + args.seconds
    k = args.incarnation * 1000
    with _writing(args) as (rng, log, note):
        while time.time() < deadline:
            k += 1
            txn = f"w{args.index}.{k}"
            tid = f"w{args.index}-{k % POOL}"
            parts = rng.sample(range(PARTITIONS), 2)
            values = [(parts[0], f"{txn}.0"), (parts[1], f"{txn}.1")]
            zombie = rng.random() < 0.1
            note(txn=txn, values=values, zombie=zombie)
            try:
                producer = log.producer(transactional_id=tid, transaction_timeout_ms=TIMEOUT_MS,
                                        linger_ms=10**9)
                producer.init_transactions()
                producer.begin_transaction()
                producer.send(TOPIC, values[0][1].encode(), partition=values[0][0])
                producer.flush()
                producer.send(TOPIC, values[1][1].encode(), partition=values[1][0])
                if zombie:
                    time.sleep(STALL_S)
                    meta = Log(args.root, fsync=False).coordinator.metadata(tid)
                    ended = meta is None or meta.state.value != "Ongoing" or \
                        (meta.txn_producer_id, meta.txn_epoch) != (producer.producer_id,
                                                                  producer.epoch)
                    note(txn=txn, ended_before_flush=ended)
                producer.flush()
                commit = rng.random() < 0.7
                (producer.commit_transaction if commit else producer.abort_transaction)()
                note(txn=txn, outcome="committed" if commit else "aborted")
            except Exception as exc:  # fenced, timed out: recorded, never committed
                note(txn=txn, outcome="failed", error=f"{type(exc).__name__}: {exc}"[:300])
    return 0


def run_shared_writer(args: argparse.Namespace) -> int:
    from txlog import SharedTransaction

    deadline = time.time() + args.seconds
    k = args.incarnation * 1000
    with _writing(args) as (rng, log, note):
        while time.time() < deadline:
            k += 1
            name = f"w{args.index}.{k}"
            zombie = rng.random() < 0.2
            commit = rng.random() < 0.7
            attempts: list[str] = []
            zombie_producer = None
            try:
                job = SharedTransaction.start(log, f"j{args.index}", TIMEOUT_MS)
                members = []
                for task in range(2):
                    txn = f"{name}a{task}"
                    parts = rng.sample(range(PARTITIONS), 2)
                    values = [(parts[0], f"{txn}.0"), (parts[1], f"{txn}.1")]
                    note(txn=txn, values=values, zombie=zombie and task == 1)
                    attempts.append(txn)
                    producer = job.join(log, str(task), linger_ms=10**9)
                    producer.send(TOPIC, values[0][1].encode(), partition=values[0][0])
                    producer.flush()
                    producer.send(TOPIC, values[1][1].encode(), partition=values[1][0])
                    if zombie and task == 1:
                        zombie_producer = producer  # never handed over: an orphan
                        continue
                    members.append(producer.prepare_transaction())
                    producer.close()
                (job.commit if commit else job.abort)(log, members)
                for txn in attempts:
                    won = commit and not (zombie and txn == attempts[1])
                    note(txn=txn, outcome="committed" if won else "aborted")
            except Exception as exc:  # outcome unknown: the checker wants all or nothing
                for txn in attempts:
                    note(txn=txn, error=f"{type(exc).__name__}: {exc}"[:300])
                continue
            if zombie_producer is not None:
                if rng.random() < 0.5:  # the partitions forget the zombie's producer
                    time.sleep(PRODUCER_EXPIRY_MS / 1000 + 0.3)
                note(txn=attempts[1], ended_before_flush=True)
                try:
                    zombie_producer.flush()
                except Exception:
                    pass
    return 0


def run_maintainer(args: argparse.Namespace) -> int:
    from txlog import Log
    from txlog.admin import gc

    gc.MIN_DEAD_AGE_S = DEAD_AGE_S  # shortened with everything else (still > 1 s)
    log = Log(args.root, fsync=False)
    while True:
        report = log.gc(chain_age_s=0.3, decision_age_s=1.0, temp_age_s=2.0,
                        txn_id_expiration_ms=TXN_ID_EXPIRY_MS)
        log.compact(TOPIC, upto_lag=20)
        print(f"G {report.count('transactional ids expired (Dead)')} "
              f"{len(report.removed.get('transactional id chains (expired)', []))} "
              f"{len(report.removed.get('transactional id chains (finished job attempts)', []))}",
              flush=True)
        time.sleep(0.05)


def _spawn(role: str, root: str, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, SELF, role, "--root", root, *extra],
                            stdout=open(out, "a"), stderr=subprocess.STDOUT)


def supervise(root: str, logs: Path, seed: int, seconds: float,
              shared: bool = False) -> list[str]:
    from txlog import Log

    rng = random.Random(seed)
    log = Log(root, fsync=False)
    log.create_topic(TOPIC, PARTITIONS, {"producer.id.expiration.ms": PRODUCER_EXPIRY_MS,
                                         "segment.bytes": 16 * 1024})
    incarnation = defaultdict(int)

    def writer(i: int) -> subprocess.Popen:
        incarnation[i] += 1
        left = max(1.0, end - time.time())
        return _spawn("writer", root, logs / f"writer{i}.out", "--index", str(i), "--seed",
                      str(seed), "--incarnation", str(incarnation[i]), "--seconds",
                      f"{left:.1f}", "--history", str(logs / f"writer{i}.log"),
                      *(["--shared"] if shared else []))

    end = time.time() + seconds
    writers = {i: writer(i) for i in range(WRITERS)}
    maintainer = _spawn("maintainer", root, logs / "maintainer.log")
    kills = 0
    while time.time() < end:
        time.sleep(rng.uniform(1.5, 3.0))
        victim = rng.randrange(WRITERS + 1)
        if victim == WRITERS:
            maintainer.send_signal(signal.SIGKILL)
            maintainer.wait()
            maintainer = _spawn("maintainer", root, logs / "maintainer.log")
        elif time.time() < end - 1:
            writers[victim].send_signal(signal.SIGKILL)
            writers[victim].wait()
            writers[victim] = writer(victim)
        kills += 1
    problems = [f"writer {i} exited with {w.wait(timeout=60)}" for i, w in writers.items()
                if w.wait(timeout=60) not in (0, -signal.SIGKILL)]
    maintainer.send_signal(signal.SIGKILL)
    maintainer.wait()
    print(f"{kills} SIGKILLs")
    return problems + check(root, logs)


def check(root: str, logs: Path) -> list[str]:
    from txlog import Log

    time.sleep(TIMEOUT_MS / 1000 + 0.2)
    log = Log(root, fsync=False)
    log.abort_expired_transactions()
    txns: dict[str, dict] = {}
    for i in range(WRITERS):
        for line in (logs / f"writer{i}.log").read_text().splitlines():
            entry = json.loads(line)
            txns.setdefault(entry["txn"], {}).update(entry)
    problems: list[str] = []
    committed_seen: dict[str, list[str]] = defaultdict(list)
    everything: set[str] = set()
    for p in range(PARTITIONS):
        table = log.read(TOPIC, p, log.partition(TOPIC, p).log_start())
        offsets = table.column("offset").to_pylist()
        if offsets != sorted(set(offsets)):
            problems.append(f"partition {p}: offsets not increasing")
        for v in table.column("value").to_pylist():
            committed_seen[v.decode().rsplit(".", 1)[0]].append(v.decode())
        raw = log.read(TOPIC, p, log.partition(TOPIC, p).log_start(),
                       isolation_level="read_uncommitted")
        everything.update(v.decode() for v in raw.column("value").to_pylist())
    counts = defaultdict(int)
    for name, txn in txns.items():
        values = [v for _, v in txn["values"]]
        seen = committed_seen.get(name, [])
        outcome = txn.get("outcome", "unknown")
        counts[outcome] += 1
        if outcome == "committed" and sorted(seen) != sorted(values):
            problems.append(f"{name} committed, read {seen}")
        elif outcome in ("aborted", "failed") and seen:
            problems.append(f"{name} {outcome}, yet read {seen}")
        elif outcome == "unknown" and seen and sorted(seen) != sorted(values):
            problems.append(f"{name} (killed) partly visible: {seen}")
        if txn.get("ended_before_flush"):
            counts["zombies fenced before their flush"] += 1
            if values[1] in everything:
                problems.append(f"{name}: a zombie's batch {values[1]} landed after its "
                                f"transaction was ended")
    if unknown := set(committed_seen) - set(txns):
        problems.append(f"records nobody wrote: {sorted(unknown)[:5]}")
    chains = len(log.storage.list("coordinator/transactions"))
    print(f"transactions: {dict(counts)}; transactional-id chains left: {chains}")
    gcs = [line.split() for line in (logs / "maintainer.log").read_text().splitlines()
           if line.startswith("G ")]
    print(f"gc passes {len(gcs)}: ids expired {sum(int(g[1]) for g in gcs)}, chain versions "
          f"deleted with their chains {sum(int(g[2]) for g in gcs)}, versions of finished job "
          f"attempts deleted at once {sum(int(g[3]) for g in gcs if len(g) > 3)}")
    if counts["committed"] < 10:
        problems.append(f"only {counts['committed']} transactions committed: too little checked")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", nargs="?", default="supervise",
                        choices=["supervise", "writer", "maintainer"])
    parser.add_argument("--root")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--index", type=int)
    parser.add_argument("--incarnation", type=int, default=0)
    parser.add_argument("--history")
    parser.add_argument("--shared", action="store_true",
                        help="writers run shared-transaction jobs on re-used attempt ids")
    args = parser.parse_args(argv)
    if args.role == "writer":
        return run_shared_writer(args) if args.shared else run_writer(args)
    if args.role == "maintainer":
        return run_maintainer(args)
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    work = Path(args.root).parent if args.root else Path(tempfile.mkdtemp(prefix="txlog-expiry-"))
    root = args.root or str(work / "log")
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    print(f"seed {seed}, root {root}, logs {logs}")
    problems = supervise(root, logs, seed, args.seconds, args.shared)
    for problem in problems:
        print("PROBLEM:", problem)
    print("OK" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
