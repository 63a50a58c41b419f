"""Compaction, retention and garbage collection under load: real processes, one checker.

    python tests/harness/maintenance_loop.py [--root DIR|URL] [--seed S] [--txns N]
                                             [--maintainers N]

What runs (separate OS processes on one log root):

* 4 writers: transactional producers (ids ``w0``..``w3``), each a loop of
  short transactions over the topic's partitions that commit or abort at
  random; each records every transaction's values and its outcome once the
  call returned.  Expiration is on and short (``producer.id.expiration.ms``
  3 s, gc's ``transactional.id.expiration.ms`` 2 s), and each writer pauses
  once past both: its producer entries expire and gc retires its id under
  it, so its next transaction meets Kafka's INVALID_PRODUCER_ID_MAPPING,
  aborts and starts the id again (the checker fails if none did).
* 2 readers: read_committed consumers from offset 0 with
  ``auto_offset_reset='none'``, so that a position deleted under them, or
  any other error, is an error they report (and exit non-zero); they record
  every record in the order received.
* a maintainer: in a loop, compaction in small steps (leaving the newest
  offsets as batch objects), ``Log.merge_segments`` (which joins those small
  segments), ``Log.apply_retention`` (the topic keeps a few segments),
  ``Log.gc`` and temp-file removal; it prints the number of objects in
  each partition directory after every pass.  The supervisor SIGKILLs it
  at random moments and starts it again, so that compactions and deletions
  stop half-way.  With ``--maintainers N``, N ``txlog maintain`` processes
  run at once instead (short jittered intervals, one JSON line per pass),
  and the supervisor SIGKILLs and restarts one of them at random moments,
  and now and then runs ``txlog delete-records`` up to where both readers
  have read (so retention also deletes by a recorded log start).

Then the supervisor lets one maintenance pass finish, the readers drain,
and the checker verifies: every writer and reader finished without error;
merged segments were made (else merging was not exercised);
each reader saw, per partition, exactly the committed records, each once,
in offset order, and nothing of an aborted transaction; the final read
(from the log start) is the tail of what the readers saw, offset for
offset; and the number of objects stayed bounded.  The exit status is
non-zero on any violation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from pathlib import Path

TOPIC = "events"
PARTITIONS = 2
WRITERS = 4
READERS = 2
SEGMENT_BYTES = 1024 * 1024  # far more than a pass compacts: small segments, merged
RETENTION_BYTES = 320 * 1024
LAG = 40  # offsets per partition left as batch objects by the maintainer
STEP = 20  # offsets per compaction of the maintainer role (small segments, which merge)
DEADLINE_S = 240.0
# Expiration on, and short: a writer's producer entry expires whenever it pauses for
# a few seconds (a loaded machine, a flush), and ids idle for 2 s are retired by gc.
PRODUCER_ID_EXPIRATION_MS = 3_000
TXN_ID_EXPIRATION_MS = 2_000
SELF = os.path.abspath(__file__)


def _names(root: str, *parts: str) -> list[str]:
    """Paths of the objects under ``root/parts``, relative to it (a local directory or an
    object-store URL, whose endpoint and credentials come from the environment, as the
    processes' do)."""
    if "://" not in root:
        top = Path(root, *parts)
        return [str(Path(d, f).relative_to(top)) for d, _, files in os.walk(top) for f in files]
    import fsspec

    fs, path = fsspec.core.url_to_fs("/".join([root.rstrip("/"), *parts]))
    return [name[len(path):].lstrip("/") for name in fs.find(path)] if fs.exists(path) else []


def _count(root: str, *parts: str) -> int:
    return len(_names(root, *parts))


def _objects(root: str, partition: int) -> int:
    return _count(root, "topics", TOPIC, str(partition))


def _merged_names(root: str) -> set[str]:
    """The merged segments (``<base>-<end>.segment``) in storage now, of every partition:
    the loop must see some, or it did not exercise merging."""
    found = set()
    for p in range(PARTITIONS):
        found.update(f"{p}/{n}" for n in _names(root, "topics", TOPIC, str(p), "segments")
                     if "-" in n and n.endswith(".segment"))
    return found


# --- roles ------------------------------------------------------------------------------------


def run_writer(args: argparse.Namespace) -> int:
    from txlog import InvalidPidMappingError, Log

    rng = random.Random(f"{args.seed}/writer/{args.index}")
    log = Log(args.root)
    producer = log.producer(transactional_id=f"w{args.index}", linger_ms=10**9)
    producer.init_transactions()
    pause_at = rng.randrange(args.txns)
    expired = 0
    with open(args.history, "a", encoding="utf-8") as out:
        for n in range(args.txns):
            if n == pause_at:
                # Once, idle past both expirations: the writer's producer entries expire
                # and gc may retire its transactional id while it still holds it.
                time.sleep((max(PRODUCER_ID_EXPIRATION_MS, TXN_ID_EXPIRATION_MS) + 1500) / 1000)
                _until_retired(args.root, f"w{args.index}")
            txn = f"w{args.index}.{n}"
            values = [(rng.randrange(PARTITIONS), f"{txn}.{i}") for i in range(rng.randint(1, 4))]
            producer.begin_transaction()
            commit = rng.random() < 0.75
            try:
                for p, value in values:
                    producer.send(TOPIC, value.encode(), partition=p)
                    if rng.random() < 0.5:
                        producer.flush()
                if commit:
                    producer.commit_transaction()
            except InvalidPidMappingError:
                # The id expired during the pause and gc retired it (Kafka's abortable
                # INVALID_PRODUCER_ID_MAPPING, met by a flush or, as AddPartitionsToTxn
                # answers behind the sends, by the commit): abort, which starts it again.
                expired += 1
                commit = False
            if not commit:
                producer.abort_transaction()
            out.write(json.dumps({"txn": txn, "values": values,
                                  "outcome": "committed" if commit else "aborted"}) + "\n")
            out.flush()
    print(f"transactions that met the id expired: {expired}", flush=True)
    return 0


def run_reader(args: argparse.Namespace) -> int:
    from txlog import Log

    log = Log(args.root)
    consumer = log.consumer(auto_offset_reset="none", max_poll_records=200)
    tps = [(TOPIC, p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(*tp, 0)
    stop = Path(args.stop)
    drain_to = None
    deadline = time.monotonic() + DEADLINE_S
    with open(args.history, "a", encoding="utf-8") as out:
        try:
            while time.monotonic() < deadline:
                records = consumer.poll()
                out.write("".join(f"R {r.partition} {r.offset} {r.value.decode()}\n"
                                  for r in records))
                out.flush()
                if drain_to is not None:
                    if all(consumer.position(*tp) >= drain_to[tp] for tp in tps):
                        out.write("D\n")
                        return 0
                elif stop.exists():
                    drain_to = consumer.end_offsets()
                if not records:
                    time.sleep(0.005)
            out.write("E deadline\n")
        except Exception as exc:  # any error is a finding: record it and fail
            # The object (an OSError's repr leaves its file out) and where it was raised,
            # so that a failure seen once in CI says what to look for.
            frames = traceback.extract_tb(exc.__traceback__)[-6:]
            where = " < ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
                               for f in reversed(frames))
            out.write(f"E {exc!r} {getattr(exc, 'filename', None) or ''} at {where}\n")
    return 2


def run_maintainer(args: argparse.Namespace) -> int:
    from txlog import Log

    log = Log(args.root)
    passes = 1 if args.once else 10**9
    for _ in range(passes):
        ends = {p: log.partition(TOPIC, p).end_offset() for p in range(PARTITIONS)}
        # Compaction in steps of STEP offsets, as a maintainer compacting every few
        # seconds would: the segments are small, and merging joins them.
        for p in range(PARTITIONS):
            part = log.partition(TOPIC, p)
            for upto in range(part.compacted_end() + STEP, ends[p] - LAG + STEP, STEP):
                while part.compact(SEGMENT_BYTES, 2, min(upto, ends[p] - LAG)) is not None:
                    pass
        merged = sum(len(m) for m in log.merge_segments(TOPIC).values())
        _report(f"M {merged}")
        log.apply_retention(TOPIC)
        log.gc(chain_age_s=1.0, decision_age_s=1.0, temp_age_s=2.0,
               txn_id_expiration_ms=TXN_ID_EXPIRATION_MS)
        counts = " ".join(str(_objects(args.root, p)) for p in range(PARTITIONS))
        _report(f"O {counts} {' '.join(str(ends[p]) for p in range(PARTITIONS))}")
        if not args.once:
            time.sleep(0.05)
    return 0


# --- supervisor and checker -------------------------------------------------------------------


def _report(line: str) -> None:
    """One line of the maintainer's output in one write: the supervisor SIGKILLs it at
    any moment, and print() once left a line without its newline, which the restarted
    maintainer's next line then continued ("O 42 44 753 731M 0")."""
    os.write(sys.stdout.fileno(), f"{line}\n".encode())


def _spawn(role: str, root: str, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, SELF, role, "--root", root, *extra],
                            stdout=open(out, "a"), stderr=subprocess.STDOUT)


def _until_retired(root: str, transactional_id: str, bound_s: float = 60.0) -> None:
    """Go on pausing until gc has retired ``transactional_id`` (Dead, or deleted), at most
    ``bound_s``.  A fixed pause left it to chance on S3, where a gc pass takes seconds and
    the maintainer is killed every few: a run could end with no writer meeting its id
    expired, and so not exercise expiration."""
    from txlog import Log
    from txlog.transactions.metadata import TxnState

    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        meta = Log(root).coordinator.metadata(transactional_id)  # a fresh Log: no cache
        if meta is None or meta.state == TxnState.DEAD:
            return
        time.sleep(0.2)


def _spawn_maintain(root: str, out: Path, *extra: str) -> subprocess.Popen:
    """``txlog maintain`` with every interval short, as the loop's maintainer."""
    return subprocess.Popen(
        [sys.executable, "-m", "txlog.cli", "--root", root, "maintain", "--topic", TOPIC,
         "--compact-interval", "0.05", "--retention-interval", "0.1", "--gc-interval", "0.3",
         "--jitter", "0.5", "--lag", str(LAG), "--chain-age", "1", "--decision-age", "1",
         "--temp-age", "2", "--transactional-id-expiration-ms", str(TXN_ID_EXPIRATION_MS),
         *extra], stdout=open(out, "a"), stderr=subprocess.STDOUT)


def supervise(root: str, logs: Path, seed: int, txns: int, maintainers: int = 0,
              kill_interval: tuple[float, float] | None = None) -> list[str]:
    """Run everything; return the problems found (empty: all checks hold)."""
    from txlog import Log

    rng = random.Random(seed)
    log = Log(root)
    log.create_topic(TOPIC, PARTITIONS, {"segment.bytes": SEGMENT_BYTES,
                                         "producer.id.expiration.ms": PRODUCER_ID_EXPIRATION_MS,
                                         "retention.bytes": RETENTION_BYTES})
    stop = logs / "stop"
    readers = [_spawn("reader", root, logs / f"reader{i}.out", "--history",
                      str(logs / f"reader{i}.log"), "--stop", str(stop))
               for i in range(READERS)]
    if maintainers:
        # Several maintainers retain fast: let the readers get going first, or a reader
        # still starting up would find its position deleted (auto_offset_reset='none').
        started = time.monotonic() + 60
        while time.monotonic() < started and not all(
                (logs / f"reader{i}.log").exists() for i in range(READERS)):
            time.sleep(0.05)
    writers = [_spawn("writer", root, logs / f"writer{i}.out", "--index", str(i), "--seed",
                      str(seed), "--txns", str(txns), "--history", str(logs / f"writer{i}.log"))
               for i in range(WRITERS)]
    if maintainers:
        def start(i: int) -> subprocess.Popen:
            return _spawn_maintain(root, logs / f"maintainer{i}.log")
    else:
        def start(i: int) -> subprocess.Popen:
            return _spawn("maintainer", root, logs / "maintainer.log")
    running = [start(i) for i in range(max(maintainers, 1))]
    kills = 0
    deleted_to = [0] * PARTITIONS
    merged: set[str] = set()
    deadline = time.monotonic() + DEADLINE_S
    while any(w.poll() is None for w in writers) and time.monotonic() < deadline:
        time.sleep(rng.uniform(*(kill_interval or ((1.0, 3.0) if not maintainers else (1.0, 2.0)))))
        merged |= _merged_names(root)
        i = rng.randrange(len(running))
        running[i].send_signal(signal.SIGKILL)  # mid-compaction, mid-deletion, mid-gc
        running[i].wait()
        kills += 1
        running[i] = start(i)
        if maintainers and rng.random() < 0.5:
            deleted_to = _delete_records_behind_the_readers(root, logs, deleted_to)
    for m in running:
        m.send_signal(signal.SIGKILL)
        m.wait()
    problems = [f"writer {i} exited with {w.wait(timeout=DEADLINE_S)}"
                for i, w in enumerate(writers) if w.wait(timeout=DEADLINE_S) != 0]
    # finish what was cut
    last = _spawn_maintain(root, logs / "maintainer0.log", "--once") if maintainers else \
        _spawn("maintainer", root, logs / "maintainer.log", "--once")
    if last.wait(timeout=DEADLINE_S) != 0:
        problems.append("the last maintenance pass failed (see maintainer.log)")
    stop.touch()
    problems += [f"reader {i} exited with {r.wait(timeout=DEADLINE_S)}"
                 for i, r in enumerate(readers) if r.wait(timeout=DEADLINE_S) != 0]
    problems += check(root, logs)
    merged |= _merged_names(root)
    expired = sum(int(line.rsplit(" ", 1)[1]) for i in range(WRITERS)
                  for line in (logs / f"writer{i}.out").read_text().splitlines()
                  if line.startswith("transactions that met the id expired: "))
    print(f"transactions that met their transactional id expired: {expired}")
    if not expired:
        problems.append("no writer's transactional id expired during its pause: the run "
                        "did not exercise expiration")
    print(f"maintainer killed {kills} times; merged segments seen in storage: {len(merged)}")
    if maintainers:
        starts = [Log(root).partition(TOPIC, p).log_start() for p in range(PARTITIONS)]
        print(f"delete-records moved the log starts to {deleted_to}; they are {starts}")
        if any(s < d for s, d in zip(starts, deleted_to)):
            problems.append(f"log starts {starts} below what delete-records set {deleted_to}")
    return problems


def _delete_records_behind_the_readers(root: str, logs: Path, deleted_to: list[int]
                                       ) -> list[int]:
    """``txlog delete-records`` up to the offset both readers have read past in each
    partition (their positions stay readable: auto_offset_reset='none' would report
    anything else), beside the writers and the maintainers."""
    seen = [[0] * PARTITIONS for _ in range(READERS)]
    for i in range(READERS):
        path = logs / f"reader{i}.log"
        for line in path.read_text().splitlines() if path.exists() else []:
            if line.startswith("R "):
                _, p, offset, _ = line.split(" ", 3)
                seen[i][int(p)] = max(seen[i][int(p)], int(offset))
    target = [min(seen[i][p] for i in range(READERS)) for p in range(PARTITIONS)]
    if target == deleted_to:
        return deleted_to
    plan = logs / "delete-records.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": TOPIC, "partition": p, "offset": target[p]} for p in range(PARTITIONS)]}))
    run = subprocess.run([sys.executable, "-m", "txlog.cli", "--root", root, "delete-records",
                          "--offset-json-file", str(plan), "--json"],
                         capture_output=True, text=True, timeout=DEADLINE_S)
    if run.returncode != 0:
        raise RuntimeError(f"txlog delete-records failed: {run.stderr}")
    return [max(a, b) for a, b in zip(deleted_to, target)]


def check(root: str, logs: Path) -> list[str]:
    from txlog import Log
    from txlog.clients.columns import to_spark_table

    problems: list[str] = []
    committed: dict[int, set[str]] = defaultdict(set)
    aborted: set[str] = set()
    for i in range(WRITERS):
        for line in (logs / f"writer{i}.log").read_text().splitlines():
            txn = json.loads(line)
            for p, value in txn["values"]:
                (committed[p].add if txn["outcome"] == "committed" else aborted.add)(value)
    final: dict[int, list[tuple[int, str]]] = {}
    log = Log(root)
    for p in range(PARTITIONS):
        part = log.partition(TOPIC, p)
        try:
            pieces, _ = part.read(part.log_start())
            table = to_spark_table(pieces, TOPIC, p, include_headers=False)
        except Exception as exc:  # reported like any other violation
            problems.append(f"partition {p}: the final read failed: {exc!r}")
            table = None
        final[p] = [] if table is None else list(zip(
            table.column("offset").to_pylist(),
            (v.decode() for v in table.column("value").to_pylist())))
    for i in range(READERS):
        seen: dict[int, list[tuple[int, str]]] = defaultdict(list)
        for line in (logs / f"reader{i}.log").read_text().splitlines():
            if line.startswith("E"):
                problems.append(f"reader {i} saw an error: {line[2:]}")
            elif line.startswith("R"):
                _, p, offset, value = line.split(" ", 3)
                seen[int(p)].append((int(offset), value))
        for p in range(PARTITIONS):
            got = seen[p]
            offsets = [o for o, _ in got]
            values = [v for _, v in got]
            if offsets != sorted(set(offsets)):
                problems.append(f"reader {i} partition {p}: offsets not strictly increasing")
            if leaked := aborted.intersection(values):
                problems.append(f"reader {i} partition {p}: aborted records read: "
                                f"{sorted(leaked)[:5]}")
            if len(values) != len(set(values)) or set(values) != committed[p]:
                missing = committed[p] - set(values)
                problems.append(f"reader {i} partition {p}: {len(values)} records, "
                                f"{len(set(values))} distinct, {len(committed[p])} committed; "
                                f"missing {sorted(missing)[:5]}")
            if final[p] != got[len(got) - len(final[p]):] or (got and not final[p]):
                problems.append(f"partition {p}: the final read is not the tail of what "
                                f"reader {i} saw")
    counts, ends = _maintainer_counts(logs, problems)
    if not any(ends):  # txlog maintain does not print them: the log ends now
        ends = [log.partition(TOPIC, p).end_offset() for p in range(PARTITIONS)]
    peak = [max((int(c[p]) for c in counts), default=0) for p in range(PARTITIONS)]
    after = [_objects(root, p) for p in range(PARTITIONS)]
    print(f"objects per partition directory: peak {peak}, after the last pass {after}, "
          f"for log end offsets {ends} ({len(counts)} maintenance passes)")
    coordinator = _count(root, "coordinator")
    print(f"objects under coordinator/: {coordinator}")
    bound = 2 * LAG + 3 * RETENTION_BYTES // SEGMENT_BYTES + 10
    if any(a > bound for a in after):
        problems.append(f"partition directories hold {after} objects after maintenance, more "
                        f"than {bound}")
    return problems


def _maintainer_counts(logs: Path, problems: list[str]) -> tuple[list[list[int]], list[int]]:
    """Objects per partition after each pass, and the largest log ends, from the
    maintainers' output: "O" lines of the maintainer role, JSON lines of txlog maintain
    (whose errors are problems too: two maintainers must never trip over each other)."""
    counts: list[list[int]] = []
    ends = [0] * PARTITIONS
    deleted = merged = 0
    for path in sorted(logs.glob("maintainer*.log")):
        for line in path.read_text().splitlines():
            if line.startswith("M "):
                merged += int(line.split()[1])
            elif line.startswith("O "):
                fields = [int(f) for f in line.split()[1:]]
                counts.append(fields[:PARTITIONS])
                ends = [max(e, f) for e, f in zip(ends, fields[PARTITIONS:])]
            elif line.startswith("{"):
                report = json.loads(line)
                problems.extend(f"{path.name}: {e}" for e in report["errors"])
                deleted += report["segments_deleted"]
                merged += report["segments_merged"]
                counts.append([report["objects"].get(f"{TOPIC}-{p}", 0)
                               for p in range(PARTITIONS)])
            elif line.strip() and "txlog: error: a maintenance pass reported" not in line:
                problems.append(f"{path.name}: {line}")
    if deleted:
        print(f"segments deleted by retention: {deleted}")
    print(f"merged segments made: {merged}")
    if not merged:
        problems.append("no merged segment was made: segment merging was not exercised")
    return counts, ends


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", nargs="?", default="supervise",
                        choices=["supervise", "writer", "reader", "maintainer"])
    parser.add_argument("--root")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--txns", type=int, default=60)
    parser.add_argument("--index", type=int)
    parser.add_argument("--history")
    parser.add_argument("--stop")
    parser.add_argument("--once", action="store_true")
    parser.add_argument("--maintainers", type=int, default=0,
                        help="run this many `txlog maintain` processes at once instead of "
                             "the maintainer role")
    parser.add_argument("--kill-interval", type=float, nargs=2, metavar=("MIN", "MAX"),
                        help="seconds between maintainer kills (default 1 to 3, or 1 to 2 "
                             "with --maintainers): longer on a slow store, so passes finish")
    args = parser.parse_args(argv)
    if args.role == "writer":
        return run_writer(args)
    if args.role == "reader":
        return run_reader(args)
    if args.role == "maintainer":
        return run_maintainer(args)
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    work = Path(tempfile.mkdtemp(prefix="txlog-maintenance-"))
    root = args.root or str(work / "log")
    logs = work / "logs"
    logs.mkdir()
    print(f"seed {seed}, root {root}, logs {logs}")
    problems = supervise(root, logs, seed, args.txns, args.maintainers,
                         tuple(args.kill_interval) if args.kill_interval else None)
    for problem in problems:
        print("PROBLEM:", problem)
    print("OK" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
