"""A Jepsen-style test of txlog transactions: real processes, real SIGKILLs, one checker.

    python tests/harness/jepsen_txn.py --scale N [--root DIR] [--log URL] [--seed S]

What runs (all separate OS processes on one log root):

* writers -- one transactional producer each (transactional id ``w<i>``), in
  a loop of transactions over several partitions that commit or abort at
  random.  Before anything reaches the log a writer appends (and flushes) to
  its own history file which values the transaction holds; then it records
  the decision it is about to carry out and, once the call returned, the
  outcome it knows.
* readers -- read_committed consumers over every partition, recording every
  record in the order they receive it, plus their positions.  Every now and
  then a reader starts a new session from offset 0 (a read must be
  repeatable).  One reader aborts expired transactions, the others never do.
* the supervisor (this process) -- SIGKILLs writers: some while they hang in
  the middle of a transaction on purpose (their records are in the log, the
  transaction is open), some at a random moment (possibly inside commit,
  between the decision and the markers), and restarts them with the same
  transactional id, so that init_transactions fences the dead instance and
  aborts its transaction.  One writer is killed mid-transaction and never
  restarted: only the transaction timeout can end its transaction.

Then every transaction is decided (waiting, with a deadline, for the timeout),
the readers catch up and stop, a final reader reads every partition, and the
checker verifies:

* no aborted read: nothing of an aborted transaction, of one that never
  reached its commit, or of a fenced instance is returned to any reader;
* no intermediate read: within a partition each reader got all of a
  transaction's records there or none;
* no lost write: every transaction whose commit returned is in the final
  read, each record exactly once, in the partition it was sent to; a
  transaction whose outcome is unknown (killed inside commit) is there in
  all of its partitions or in none;
* no duplicates, no records nobody wrote;
* one order: each reader session's sequence of each partition is a prefix of
  the final reader's (same offsets, same values, same order).

Faults are chosen from ``--seed`` (printed), so a failing run can be
repeated; the checks hold for every interleaving, so the verdict does not
depend on timing.  The exit status is non-zero on any violation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

TOPIC = "jepsen"
PARTITIONS = 4
WRITERS = 3
READERS = 2
TXN_TIMEOUT_MS = 2000
STOP_FILE = "STOP"
POLL_S = 0.01  # supervisor / idle reader pacing (not synchronisation)


# --- shared helpers -------------------------------------------------------------------------


class History:
    """An append-only line file: every line is flushed (to the OS) before going on.

    SIGKILL cannot lose a flushed line (no fsync needed: the machine stays up).
    A line cut short by the kill has no newline and is ignored when read back.
    """

    def __init__(self, path: Path) -> None:
        self._f = open(path, "a", encoding="utf-8")

    def write(self, **event) -> None:
        event["t"] = round(time.time(), 3)
        self._f.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._f.flush()


def read_history(path: Path) -> list[dict]:
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")[:-1]  # the part after the last newline is unfinished
    return [json.loads(line) for line in lines if line]


def open_log(root: str, fsync: bool):
    from txlog import Log

    return Log(root, fsync=fsync)


# --- writer -----------------------------------------------------------------------------------


def run_writer(args: argparse.Namespace) -> int:
    from txlog import TxlogError

    rng = random.Random(f"{args.seed}/writer/{args.writer}/{args.incarnation}")
    log = open_log(args.root, args.fsync)
    history = History(Path(args.history))
    name = f"w{args.writer}"

    def fresh_producer():
        producer = log.producer(transactional_id=name, transaction_timeout_ms=TXN_TIMEOUT_MS,
                                linger_ms=10**9)  # batches close on our flushes only
        producer.init_transactions()
        return producer

    producer = fresh_producer()
    history.write(ev="ready", pid=producer.producer_id, epoch=producer.epoch)
    stalling = {"txn": None}
    real_complete = log.coordinator.ender.complete

    def complete_or_stall(transactional_id, only_decision=None):
        """Failpoint: die right after our own commit point, before any marker.

        EndTxn publishes the decision and then calls complete(); hanging here
        leaves the decision published, the metadata Ongoing, no markers.
        """
        if stalling["txn"] is not None and transactional_id == name:
            meta = log.coordinator.metadata(name)
            decision = log.coordinator.decision(meta.decision_id)
            history.write(ev="stall", txn=stalling["txn"], where="decided",
                          commit=decision.commits(meta.txn_producer_id, meta.txn_epoch))
            while True:
                signal.pause()
        return real_complete(transactional_id, only_decision)

    log.coordinator.ender.complete = complete_or_stall
    stall_at, txns, n = args.stall_at, args.txns, 0
    while n < txns:
        n += 1
        txn = f"{name}.{args.incarnation}.{n}"
        parts = rng.sample(range(PARTITIONS), rng.randint(1, 3))
        values = [(rng.choice(parts), f"{txn}.{i}") for i in range(rng.randint(1, 6))]
        for p in parts:  # every chosen partition gets at least one record
            if all(q != p for q, _ in values):
                values.append((p, f"{txn}.{len(values)}"))
        history.write(ev="intent", txn=txn, values=values)
        decided = None
        try:
            producer.begin_transaction()
            for i, (p, value) in enumerate(values):
                producer.send(TOPIC, value.encode(), key=txn.encode(), partition=p)
                if rng.random() < 0.25:
                    producer.flush()  # some transactions span several batches per partition
                if rng.random() < 0.3:
                    time.sleep(rng.random() * 0.01)  # think time: other writers interleave
            producer.flush()
            history.write(ev="sent", txn=txn)
            if n == stall_at and args.stall_where == "sent":
                history.write(ev="stall", txn=txn, where="sent")
                while True:  # hang mid-transaction until the supervisor kills us
                    signal.pause()
            decided = rng.random() < 0.7 or n == stall_at
            history.write(ev="decide", txn=txn, commit=decided)
            if decided:
                if n == stall_at:
                    stalling["txn"] = txn  # see complete_or_stall
                producer.commit_transaction()
            else:
                producer.abort_transaction()
            history.write(ev="done", txn=txn, outcome="committed" if decided else "aborted")
        except TxlogError as exc:  # e.g. fenced after a timeout: the outcome is not ours to know
            history.write(ev="error", txn=txn, decided=decided, error=repr(exc))
            producer = fresh_producer()
            if n == stall_at:
                # Aborted under us before it could stall (its timeout passed on a loaded
                # machine, and another process aborted it): stall in the next one, or the
                # planned kill would never come and the writer would exit by itself.
                stalling["txn"] = None
                stall_at, txns = stall_at + 1, txns + 1
    history.write(ev="finished")
    return 0


# --- reader -----------------------------------------------------------------------------------


def run_reader(args: argparse.Namespace) -> int:
    rng = random.Random(f"{args.seed}/reader/{args.reader}")
    log = open_log(args.root, args.fsync)
    out = open(args.history, "a", encoding="utf-8")
    stop = Path(args.stop)
    tps = [(TOPIC, p) for p in range(PARTITIONS)]
    session = 0

    def new_consumer():
        consumer = log.consumer(auto_offset_reset="earliest", max_poll_records=50,
                                abort_expired_transactions=args.abort_expired)
        consumer.assign(tps)
        return consumer

    consumer = new_consumer()
    out.write(f"S {session}\n")
    positions = {tp: 0 for tp in tps}
    draining_until = None
    deadline = time.monotonic() + args.deadline
    while True:
        if time.monotonic() > deadline:
            out.write("X deadline\n")
            out.flush()
            return 3
        records = consumer.poll()
        lines = [f"R {r.partition} {r.offset} {r.value.decode()}\n" for r in records]
        for tp in tps:
            pos = consumer.position(*tp)
            if pos != positions[tp]:
                positions[tp] = pos
                lines.append(f"P {tp[1]} {pos}\n")
        out.write("".join(lines))
        out.flush()
        if draining_until is not None:
            if all(positions[tp] >= draining_until[tp] for tp in tps):
                break
        elif stop.exists():
            # Everything is decided now and nothing more is written: read to the end.
            draining_until = {(TOPIC, p): log.end_offset(TOPIC, p) for p in range(PARTITIONS)}
        elif rng.random() < 0.01:
            session += 1
            consumer = new_consumer()
            positions = {tp: 0 for tp in tps}
            out.write(f"S {session}\n")
        if not records:
            time.sleep(args.reader_idle)
    out.write("D\n")
    out.flush()
    return 0


# --- supervisor -------------------------------------------------------------------------------


@dataclass
class Incarnation:
    writer: int
    number: int
    # "stall" (hangs mid-transaction, then killed: after sending its records, or
    # right after its commit decision), "random" (killed at any moment), "finish"
    mode: str
    stall_where: str = "sent"
    restart: bool = True
    stall_at: int = 0
    kill_delay: float = 0.0
    txns: int = 0
    history: Path = Path()
    proc: subprocess.Popen | None = None
    ready_at: float | None = None
    killed: bool = False


@dataclass
class Plan:
    incarnations: dict[int, list[Incarnation]] = field(default_factory=dict)


def make_plan(seed: int, scale: int, logs: Path, finish_txns: int | None = None) -> Plan:
    rng = random.Random(f"{seed}/plan")
    plan = Plan()
    victim = rng.randrange(WRITERS)  # killed mid-transaction and never restarted
    for w in range(WRITERS):
        if w == victim:
            modes = ["stall"]
        else:
            modes = [rng.choice(["stall", "random"]) for _ in range(2 * scale)] + ["finish"]
            if "stall" not in modes:
                modes[0] = "stall"
        incs = []
        for i, mode in enumerate(modes):
            inc = Incarnation(w, i, mode, restart=w != victim,
                              history=logs / f"writer-{w}-{i}.jsonl")
            if mode == "stall":
                inc.stall_at = rng.randint(2, 3 + 4 * scale)
                inc.txns = inc.stall_at
                # The victim's transaction must stay undecided: only its timeout ends it.
                inc.stall_where = "sent" if w == victim else rng.choice(["sent", "decided"])
            elif mode == "random":
                inc.kill_delay = rng.uniform(0.1, 1.0 + 0.5 * scale)
                inc.txns = 1000 * scale  # killed long before
            else:
                inc.txns = 12 * scale if finish_txns is None else finish_txns
            incs.append(inc)
        plan.incarnations[w] = incs
    return plan


def spawn(role_args: list[str], common: list[str], out: Path) -> subprocess.Popen:
    stderr = open(out, "a")
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), *role_args, *common],
                            stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr)


class Supervisor:
    def __init__(self, root: Path, seed: int, scale: int, fsync: bool,
                 log_url: str | None = None, reader_idle: float = POLL_S,
                 finish_txns: int | None = None, writers_deadline: float | None = None
                 ) -> None:
        self.root = root
        self.writers_deadline = writers_deadline
        self.reader_idle = reader_idle
        # The log itself may live elsewhere (an object store); histories stay in root.
        self.log_url = log_url or str(root / "log")
        self.seed = seed
        self.scale = scale
        self.fsync = fsync
        self.logs = root / "jepsen-history"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.plan = make_plan(seed, scale, self.logs, finish_txns)
        self.common = ["--root", self.log_url, "--seed", str(seed)] + \
            (["--fsync"] if fsync else [])
        self.problems: list[str] = []  # infrastructure failures (not consistency violations)
        self.kills: list[tuple[str, str]] = []  # (incarnation, mode)

    def start_writer(self, inc: Incarnation) -> None:
        inc.proc = spawn(["--role", "writer", "--writer", str(inc.writer), "--incarnation",
                          str(inc.number), "--txns", str(inc.txns), "--stall-at",
                          str(inc.stall_at if inc.mode == "stall" else 0), "--stall-where",
                          inc.stall_where, "--history",
                          str(inc.history)], self.common,
                         self.logs / f"writer-{inc.writer}-{inc.number}.stderr")

    def kill(self, inc: Incarnation) -> None:
        assert inc.proc is not None
        os.kill(inc.proc.pid, signal.SIGKILL)
        inc.proc.wait()
        inc.killed = True
        mode = f"stall-{inc.stall_where}" if inc.mode == "stall" else inc.mode
        self.kills.append((f"w{inc.writer}.{inc.number}", mode))

    def run_writers(self, deadline_s: float) -> None:
        """Run every writer's incarnations, injecting the planned kills."""
        queue = {w: list(incs) for w, incs in self.plan.incarnations.items()}
        current: dict[int, Incarnation] = {}
        for w in queue:
            current[w] = queue[w].pop(0)
            self.start_writer(current[w])
        deadline = time.monotonic() + deadline_s
        while current:
            if time.monotonic() > deadline:
                self.problems.append("writers did not finish before the deadline")
                for inc in current.values():
                    self.kill(inc)
                return
            for w, inc in list(current.items()):
                events = read_history(inc.history)
                kinds = {e["ev"] for e in events}
                if inc.ready_at is None and "ready" in kinds:
                    inc.ready_at = time.monotonic()
                code = inc.proc.poll()
                if code is not None:  # exited by itself
                    if inc.mode != "finish" or code != 0:
                        self.problems.append(
                            f"writer w{w}.{inc.number} ({inc.mode}) exited with {code}; see "
                            f"{self.logs}/writer-{w}-{inc.number}.stderr")
                elif inc.mode == "stall" and "stall" in kinds:
                    self.kill(inc)
                elif inc.mode == "random" and inc.ready_at is not None and \
                        time.monotonic() >= inc.ready_at + inc.kill_delay:
                    self.kill(inc)
                else:
                    continue
                if queue[w] and inc.restart:
                    current[w] = queue[w].pop(0)
                    self.start_writer(current[w])
                else:
                    del current[w]
            time.sleep(POLL_S)

    def settle(self, deadline_s: float) -> None:
        """Wait until no transaction is undecided (the victim's only by its timeout)."""
        log = open_log(self.log_url, self.fsync)
        deadline = time.monotonic() + deadline_s
        while True:
            log.abort_expired_transactions()
            if all(log.last_stable_offset(TOPIC, p) == log.end_offset(TOPIC, p)
                   for p in range(PARTITIONS)):
                return
            if time.monotonic() > deadline:
                self.problems.append("an open transaction still holds the LSO back")
                return
            time.sleep(0.05)

    def run(self) -> int:
        from txlog import Log

        started = time.monotonic()
        log = Log(self.log_url, fsync=self.fsync)
        log.create_topic(TOPIC, PARTITIONS)
        readers = []
        try:
            for r in range(READERS):
                args = ["--role", "reader", "--reader", str(r), "--history",
                        str(self.logs / f"reader-{r}.txt"), "--deadline",
                        str(120 + 60 * self.scale), "--stop", str(self.root / STOP_FILE),
                        "--reader-idle", str(self.reader_idle)]
                if r == 0:
                    args.append("--abort-expired")
                readers.append(spawn(args, self.common, self.logs / f"reader-{r}.stderr"))
            self.run_writers(deadline_s=self.writers_deadline or 40.0 * self.scale)
            writers_done = time.monotonic()
            self.settle(deadline_s=TXN_TIMEOUT_MS / 1000 + 20)
            (self.root / STOP_FILE).touch()
            # Readers may lag by an amount that grows with the run's length.
            reader_deadline = time.monotonic() + 30 * max(1.0, self.scale / 5)
            for r, proc in enumerate(readers):
                try:
                    code = proc.wait(timeout=max(0.1, reader_deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    code = "a timeout while catching up"
                if code != 0:
                    self.problems.append(f"reader {r} ended with {code}")
        finally:  # never leave a process behind, whatever happened
            for proc in readers + [inc.proc for incs in self.plan.incarnations.values()
                                   for inc in incs if inc.proc is not None]:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        final = final_read(self.log_url, self.fsync)
        outcome = check(self.plan, self.logs, final)
        outcome.problems[:0] = self.problems
        self.report(outcome, started, writers_done)
        return 1 if outcome.violations or outcome.problems else 0

    def report(self, outcome: "Outcome", started: float, writers_done: float) -> None:
        s = outcome.stats
        print(f"jepsen_txn: seed={self.seed} scale={self.scale} root={self.root} "
              f"log={self.log_url}")
        print(f"  writers {WRITERS}, readers {READERS}, partitions {PARTITIONS}, "
              f"timeout {TXN_TIMEOUT_MS} ms; writers ran {writers_done - started:.1f}s, "
              f"total {time.monotonic() - started:.1f}s")
        print(f"  kills: {len(self.kills)} ({', '.join(f'{n}:{m}' for n, m in self.kills)}); "
              f"mid-transaction: {s['killed_mid_txn']}")
        print(f"  transactions: {s['committed']} committed, {s['aborted']} aborted, "
              f"{s['never_committed']} never reached commit (killed/fenced/errored), "
              f"{s['unknown']} unknown outcome ({s['unknown_visible']} of them visible)")
        print(f"  final read: {s['final_records']} records; reader sessions: "
              f"{s['sessions']}, records observed: {s['observed']}")
        for p in outcome.problems:
            print(f"  PROBLEM: {p}")
        for v in outcome.violations[:50]:
            print(f"  VIOLATION: {v}")
        if len(outcome.violations) > 50:
            print(f"  ... and {len(outcome.violations) - 50} more violations")
        print("  RESULT: " + ("FAIL" if outcome.violations or outcome.problems else "OK"))


def final_read(root: str, fsync: bool) -> dict[int, list[tuple[int, str]]]:
    """Every partition read to its end, read_committed, by a fresh process-like Log."""
    log = open_log(root, fsync)
    final = {}
    for p in range(PARTITIONS):
        table = log.read(TOPIC, p, 0)
        final[p] = [(o, v.decode()) for o, v in zip(table.column("offset").to_pylist(),
                                                    table.column("value").to_pylist(), strict=True)]
    return final


# --- checker ----------------------------------------------------------------------------------


@dataclass
class Txn:
    name: str
    values: dict[str, int]  # value -> partition it was sent to
    status: str = "never_committed"  # committed / aborted / unknown / never_committed


@dataclass
class Outcome:
    violations: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)


def load_transactions(plan: Plan, logs: Path) -> tuple[dict[str, Txn], int]:
    """Every transaction any writer started, classified by what its writer knew.

    committed: commit returned.  aborted: the writer decided to abort.
    unknown: the writer called commit, which never returned (killed) or
    raised.  never_committed: killed, fenced or failed before deciding --
    only a writer's own commit can commit its transaction, so these must
    never be visible.
    """
    txns: dict[str, Txn] = {}
    mid_txn_kills = 0
    for incs in plan.incarnations.values():
        for inc in incs:
            events = read_history(inc.history)
            for e in events:
                if e["ev"] == "intent":
                    txns[e["txn"]] = Txn(e["txn"], {v: p for p, v in e["values"]})
                elif e["ev"] == "decide":
                    txns[e["txn"]].status = "unknown" if e["commit"] else "aborted"
                elif e["ev"] == "done":
                    txns[e["txn"]].status = e["outcome"]
                elif e["ev"] == "stall" and e["where"] == "decided":
                    # Killed after the decision was published: it stands, markers or not.
                    txns[e["txn"]].status = "committed" if e["commit"] else "aborted"
                elif e["ev"] == "error":
                    pass  # status stays what the decision made it
            if inc.killed and events and events[-1]["ev"] in ("intent", "sent", "stall",
                                                               "decide"):
                mid_txn_kills += 1
    return txns, mid_txn_kills


def read_observations(logs: Path) -> dict[str, dict]:
    """Per reader session: partition -> [(offset, value)] in the order seen, and positions."""
    sessions: dict[str, dict] = {}
    for path in sorted(logs.glob("reader-*.txt")):
        reader = path.stem
        current = None
        text = path.read_text(encoding="utf-8")
        for line in text.split("\n")[:-1]:
            kind, _, rest = line.partition(" ")
            if kind == "S":
                current = sessions[f"{reader}/s{rest}"] = {
                    "records": defaultdict(list), "positions": defaultdict(int)}
            elif kind == "R":
                p, o, v = rest.split(" ", 2)
                current["records"][int(p)].append((int(o), v))
            elif kind == "P":
                p, pos = rest.split(" ")
                current["positions"][int(p)] = int(pos)
    return sessions


def check(plan: Plan, logs: Path, final: dict[int, list[tuple[int, str]]]) -> Outcome:
    out = Outcome()
    v = out.violations
    txns, mid_kills = load_transactions(plan, logs)
    owner = {value: t for t in txns.values() for value in t.values}

    # The final read: nothing invisible, nothing unknown, nothing twice, nothing lost.
    final_where: dict[str, tuple[int, int]] = {}
    for p, rows in final.items():
        offsets = [o for o, _ in rows]
        if offsets != sorted(set(offsets)):
            v.append(f"final read of partition {p}: offsets not strictly increasing")
        for o, value in rows:
            t = owner.get(value)
            if t is None:
                v.append(f"final read: {value!r} at {p}/{o} was never written by anyone")
                continue
            if value in final_where:
                v.append(f"duplicate: {value!r} at {final_where[value]} and {(p, o)}")
            final_where[value] = (p, o)
            if t.values[value] != p:
                v.append(f"{value!r} was sent to partition {t.values[value]}, read from {p}")
            if t.status in ("aborted", "never_committed"):
                v.append(f"aborted read (final): {value!r} of {t.status} transaction {t.name}")
    unknown_visible = 0
    for t in txns.values():
        present = [value for value in t.values if value in final_where]
        if t.status == "committed" and len(present) != len(t.values):
            missing = sorted(set(t.values) - set(present))
            v.append(f"lost write: committed transaction {t.name} lacks {missing}")
        if t.status == "unknown":
            if present and len(present) != len(t.values):
                v.append(f"unknown-outcome transaction {t.name} is partly visible: {present} "
                         f"of {sorted(t.values)}")
            unknown_visible += bool(present)

    # Reader sessions: each partition a prefix of the final read, transactions whole.
    sessions = read_observations(logs)
    observed = 0
    for name, s in sessions.items():
        for p in range(PARTITIONS):
            rows = s["records"].get(p, [])
            observed += len(rows)
            pos = s["positions"].get(p, 0)
            expected = [(o, value) for o, value in final[p] if o < pos]
            seen_values = [value for _, value in rows]
            if len(seen_values) != len(set(seen_values)):
                v.append(f"{name}: duplicate records in partition {p}")
            for o, value in rows:
                t = owner.get(value)
                if t is None:
                    v.append(f"{name}: {value!r} at {p}/{o} was never written by anyone")
                elif t.status in ("aborted", "never_committed"):
                    v.append(f"aborted read: {name} got {value!r} of {t.status} "
                             f"transaction {t.name}")
            if rows != expected:
                pairs = zip(rows, expected, strict=False)  # lengths may differ here
                first = next((i for i, (a, b) in enumerate(pairs) if a != b),
                             min(len(rows), len(expected)))
                v.append(f"{name}: partition {p} (read to {pos}) is not a prefix of the final "
                         f"read: first difference at index {first}: "
                         f"{rows[first:first + 2]} vs {expected[first:first + 2]}")
            # Intermediate reads, per transaction: all of its records here, or none.
            by_txn: dict[str, set[str]] = defaultdict(set)
            for _, value in rows:
                if value in owner:
                    by_txn[owner[value].name].add(value)
            for tname, got in by_txn.items():
                here = {value for value, q in txns[tname].values.items() if q == p}
                below = {value for value in here
                         if value in final_where and final_where[value][1] < pos}
                if got != here and got != below:
                    v.append(f"intermediate read: {name} saw {sorted(got)} of {tname}'s "
                             f"{sorted(here)} in partition {p}")
                elif got != here and pos >= max(final_where.get(x, (p, -1))[1]
                                                for x in here) + 1:
                    v.append(f"intermediate read: {name} read past {tname} in partition "
                             f"{p} but saw only {sorted(got)}")
    if not sessions or observed == 0:
        out.problems.append("readers observed nothing: the run checked nothing")

    counts = defaultdict(int)
    for t in txns.values():
        counts[t.status] += 1
    if counts["committed"] == 0 or counts["aborted"] + counts["never_committed"] == 0:
        out.problems.append(f"degenerate run (transactions by status: {dict(counts)})")
    if mid_kills == 0:
        out.problems.append("no writer was killed in the middle of a transaction")
    out.stats = {"committed": counts["committed"], "aborted": counts["aborted"],
                 "never_committed": counts["never_committed"], "unknown": counts["unknown"],
                 "unknown_visible": unknown_visible, "killed_mid_txn": mid_kills,
                 "final_records": sum(len(r) for r in final.values()),
                 "sessions": len(sessions), "observed": observed}
    return out


# --- entry point ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=1,
                        help="multiplies kills and transactions per writer (default 1)")
    parser.add_argument("--root", help="directory for the log and histories (default: temp); "
                                       "for the writer and reader roles, the log's URL")
    parser.add_argument("--log", help="the log's root URL instead of ROOT/log, e.g. "
                                      "s3://bucket/prefix (credentials and endpoint from the "
                                      "environment); it must hold no log yet")
    parser.add_argument("--seed", type=int, default=20240611)
    parser.add_argument("--fsync", action="store_true",
                        help="fsync every publish (SIGKILL alone does not need it)")
    parser.add_argument("--keep", action="store_true", help="keep a temporary root")
    parser.add_argument("--finish-txns", type=int,
                        help="transactions of each writer's last, unkilled incarnation "
                             "(default 12 x scale); fewer where each costs more, as on an "
                             "object store")
    parser.add_argument("--writers-deadline", type=float,
                        help="seconds all writers' incarnations may take before the run "
                             "fails (default 40 x scale)")
    # internal: the child roles
    parser.add_argument("--role", default="supervisor", choices=["supervisor", "writer", "reader"])
    parser.add_argument("--writer", type=int)
    parser.add_argument("--incarnation", type=int)
    parser.add_argument("--txns", type=int)
    parser.add_argument("--stall-at", type=int, default=0)
    parser.add_argument("--stall-where", choices=["sent", "decided"], default="sent")
    parser.add_argument("--reader", type=int)
    parser.add_argument("--abort-expired", action="store_true")
    parser.add_argument("--deadline", type=float, default=300.0)
    parser.add_argument("--reader-idle", type=float, default=POLL_S,
                        help="seconds an idle reader waits before polling again (default "
                             f"{POLL_S}); on an object store every poll costs requests")
    parser.add_argument("--history")
    parser.add_argument("--stop", help="readers drain and exit once this file exists")
    args = parser.parse_args(argv)
    if args.role == "writer":
        return run_writer(args)
    if args.role == "reader":
        return run_reader(args)
    if args.scale < 1:
        parser.error("--scale must be >= 1")
    temporary = args.root is None
    root = Path(args.root or tempfile.mkdtemp(prefix="jepsen-txn-"))
    if (root / "log").exists():
        parser.error(f"{root}/log already exists: give an empty --root")
    if args.finish_txns is not None and args.finish_txns < 1:
        parser.error("--finish-txns must be at least 1")
    code = Supervisor(root, args.seed, args.scale, args.fsync, args.log,
                      args.reader_idle, args.finish_txns, args.writers_deadline).run()
    if temporary and code == 0 and not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    elif temporary:
        print(f"  (histories kept in {root})")
    return code


if __name__ == "__main__":
    sys.exit(main())
