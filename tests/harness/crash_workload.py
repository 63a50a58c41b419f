"""Writers run until a power cut (power_loss.py), then fresh readers judge what the disk kept.

The writers are threads, each with a ``Log`` of its own, as separate processes
would be (nothing cached is shared; the OS calls are one machine's):

* transactional producers ``w<i>``, each a loop of transactions over several
  partitions of ``out`` that commit or abort at random, some flushed in several
  batches;
* ``etl``, a consume-transform-produce loop: it reads ``in`` read_committed
  (written and acknowledged before the writers start), writes one record to
  ``out`` per record read and commits the group ``g``'s offset in the same
  transaction; sometimes it aborts and reads the same records again;
* ``job``, shared transactions of two members each (two more ``Log``s, as two
  Spark tasks), committed or aborted by the thread that plays the driver.

Each transaction is noted before its first record is sent, again when its commit
or abort is called, and once that call returned.  So "acknowledged" means what
the brief says: the commit call returned.  Nothing here depends on when markers
are written.

After the cut, a reader on the kept image reads every partition read_committed
and runs ``verify``; then every transactional id and the job's prefix are
opened again (which ends whatever the cut left undecided), and a last reader
reads everything once more.  ``check`` holds both reads to the rules in
docs/protocol.md, section 1.2.1.
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from power_loss import PowerLossDisk
from txlog import Log
from txlog.admin.verify import verify
from txlog.exactly_once.shared_transaction import SharedTransaction

OUT, IN, GROUP, JOB = "out", "in", "g", "job"
OUT_PARTITIONS = 3
INPUT_RECORDS = 24
TIMEOUT_MS = 600_000  # no transaction times out during a run: only the cut ends them
HANG_GUARD_S = 120.0  # a writer still running this long after the cut is a hang


@dataclass
class Txn:
    values: dict[str, int]  # value -> partition
    status: str = "open"  # open, aborting, aborted, committing, committed
    consumed: tuple[int, int] | None = None  # etl: the input offsets [a, b) it consumed


@dataclass
class History:
    txns: dict[str, Txn] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # failures that were not the cut
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, name: str, status: str, values: dict[str, int] | None = None,
             consumed: tuple[int, int] | None = None) -> None:
        with self.lock:
            if values is not None:
                self.txns[name] = Txn(values, consumed=consumed)
            self.txns[name].status = status


def _end(producer, history: History, name: str, commit: bool) -> None:
    history.note(name, "committing" if commit else "aborting")
    if commit:
        producer.commit_transaction()
    else:
        producer.abort_transaction()
    history.note(name, "committed" if commit else "aborted")


def _producer_writer(root: str, i: int, txns: int, seed: int, history: History) -> None:
    rng = random.Random(f"{seed}/w{i}")
    producer = Log(root).producer(transactional_id=f"w{i}", transaction_timeout_ms=TIMEOUT_MS,
                                  linger_ms=10**9)
    producer.init_transactions()
    for n in range(txns):
        name = f"w{i}.{n}"
        parts = rng.sample(range(OUT_PARTITIONS), rng.randint(1, OUT_PARTITIONS))
        values = {f"{name}.{k}": parts[k % len(parts)] for k in range(rng.randint(len(parts), 6))}
        history.note(name, "open", values)
        producer.begin_transaction()
        for value, p in values.items():
            producer.send(OUT, value.encode(), partition=p)
            if rng.random() < 0.3:
                producer.flush()  # a transaction of several batches in a partition
        _end(producer, history, name, rng.random() < 0.75)


def _etl_writer(root: str, seed: int, history: History) -> None:
    rng = random.Random(f"{seed}/etl")
    log = Log(root)
    producer = log.producer(transactional_id="etl", transaction_timeout_ms=TIMEOUT_MS,
                            linger_ms=10**9)
    producer.init_transactions()
    consumer = log.consumer(group_id=GROUP, auto_offset_reset="earliest")
    consumer.assign([(IN, 0)])
    n = 0
    while (start := consumer.position(IN, 0)) < INPUT_RECORDS:
        records = consumer.poll(max_records=rng.randint(1, 4))
        name, n = f"etl.{n}", n + 1
        end = records[-1].offset + 1 if records else start
        values = {f"etl:{r.value.decode()}": rng.randrange(OUT_PARTITIONS) for r in records}
        history.note(name, "open", values, consumed=(start, end))
        producer.begin_transaction()
        for value, p in values.items():
            producer.send(OUT, value.encode(), partition=p)
        producer.send_offsets_to_transaction({(IN, 0): end}, GROUP)
        commit = rng.random() < 0.8
        _end(producer, history, name, commit)
        if not commit:
            consumer.seek(IN, 0, start)  # read them again, as after a failed transaction


def _job_writer(root: str, jobs: int, seed: int, history: History) -> None:
    rng = random.Random(f"{seed}/job")
    driver = Log(root)
    tasks = [Log(root), Log(root)]
    for j in range(jobs):
        job = SharedTransaction.start(driver, JOB, TIMEOUT_MS)
        name = f"job.{j}"
        values = {f"{name}.{t}.{k}": (t + k) % OUT_PARTITIONS
                  for t in range(len(tasks)) for k in range(rng.randint(1, 3))}
        history.note(name, "open", values)
        members = []
        for t, task in enumerate(tasks):
            producer = job.join(task, f"{j}-{t}", linger_ms=10**9)
            for value, p in values.items():
                if value.startswith(f"{name}.{t}."):
                    producer.send(OUT, value.encode(), partition=p)
            members.append(producer.prepare_transaction())
            producer.close()
        commit = rng.random() < 0.75
        history.note(name, "committing" if commit else "aborting")
        if commit:
            job.commit(driver, members)
        else:
            job.abort(driver, members)
        history.note(name, "committed" if commit else "aborted")


def _guarded(disk: PowerLossDisk, history: History, run, *args) -> None:
    try:
        run(*args)
    except BaseException as exc:  # the cut, or a failure the test must report
        if not disk.is_cut:
            history.problems.append(f"{run.__name__} failed before the cut: {exc!r}")


def setup(root: str) -> None:
    """The topics, and the input ``etl`` reads, acknowledged before the writers start."""
    log = Log(root)
    log.create_topic(OUT, OUT_PARTITIONS)
    log.create_topic(IN, 1)
    producer = log.producer(linger_ms=10**9)
    for k in range(INPUT_RECORDS):
        producer.send(IN, f"in.{k}".encode(), partition=0)
    producer.flush()


def run_writers(disk: PowerLossDisk, root: str, seed: int, txns: int = 5, jobs: int = 2,
                producers: int = 2) -> History:
    """Run every writer until it finished or the power went; then the power goes."""
    history = History()
    targets = [(_producer_writer, root, i, txns, seed, history) for i in range(producers)]
    targets += [(_etl_writer, root, seed, history), (_job_writer, root, jobs, seed, history)]
    threads = [threading.Thread(target=_guarded, args=(disk, history, *t), daemon=True)
               for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_GUARD_S)
        if t.is_alive():
            history.problems.append(f"{t.name} still runs {HANG_GUARD_S} s after the cut")
    disk.cut()  # those that finished did so before it: all they were told is kept
    return history


# --- after the cut -------------------------------------------------------------------------


Read = dict[tuple[str, int], list[tuple[int, str]]]


def read_all(log: Log) -> Read:
    out: Read = {}
    for topic, count in ((OUT, OUT_PARTITIONS), (IN, 1)):
        for p in range(count):
            table = log.read(topic, p, 0)
            out[(topic, p)] = list(zip(table.column("offset").to_pylist(),
                                       [v.decode() for v in table.column("value").to_pylist()],
                                       strict=True))
    return out


def recover(root: str) -> None:
    """Every writer comes back: opening its transactional id ends what the cut left open."""
    log = Log(root)
    ids = [t for t in log.coordinator.transactional_ids() if not t.startswith(f"{JOB}-")]
    for transactional_id in ids:
        log.producer(transactional_id=transactional_id).init_transactions()
    SharedTransaction.start(log, JOB, TIMEOUT_MS)  # ends the jobs left open


@dataclass
class Verdict:
    violations: list[str]
    first: Read
    final: Read
    committed: dict[tuple[str, int], int]


def judge(kept: Path, history: History) -> Verdict:
    """Readers on the kept image, before and after the writers come back."""
    violations: list[str] = []
    root = str(kept)
    try:
        first = read_all(Log(root, create=False))
        violations += _verify(root, "first")
        recover(root)
        log = Log(root, create=False)
        final = read_all(log)
        violations += _verify(root, "final")
        # The end first: markers of a transaction recovery ended may still land behind it
        # (docs/protocol.md 4.6), moving the end between the two reads.
        ends = {tp: log.end_offset(*tp) for tp in final}
        violations += [f"{tp}: LSO {lso} below the end {ends[tp]} after recovery"
                       for tp in final if (lso := log.last_stable_offset(*tp)) != ends[tp]]
        committed = log.committed(GROUP)
    except Exception as exc:  # a reader that cannot read what was kept is itself a finding
        return Verdict(violations + [f"reading the kept log failed: {exc!r}"], {}, {}, {})
    violations += check(history, first, final, committed)
    return Verdict(violations, first, final, committed)


def _verify(root: str, when: str) -> list[str]:
    reports = verify(Log(root, create=False).services)
    return [f"verify ({when}) {r.topic}/{r.partition}: {p}" for r in reports
            for p in r.problems]


def check(history: History, first: Read, final: Read,
          committed: dict[tuple[str, int], int]) -> list[str]:
    v = [f"writer: {p}" for p in history.problems]
    owner = {value: (name, t) for name, t in history.txns.items() for value in t.values}
    v += _check_input(final)
    places: dict[str, list[tuple[int, int]]] = defaultdict(list)  # value -> (partition, offset)
    for (topic, p), rows in final.items():
        for o, value in rows if topic == OUT else []:
            places[value].append((p, o))
    for value, found in places.items():
        name, t = owner.get(value, (None, None))
        if len(found) > 1:
            v.append(f"duplicate: {value!r} at {found}")
        if t is None:
            v.append(f"{value!r} at {found}: nobody wrote it")
            continue
        if {p for p, _ in found} != {t.values[value]}:
            v.append(f"{value!r} was sent to partition {t.values[value]}, read at {found}")
        if t.status in ("open", "aborting", "aborted"):
            v.append(f"{value!r} of {t.status} transaction {name} is visible")
    where = {value: found[0] for value, found in places.items()}
    for name, t in history.txns.items():
        present = [value for value in t.values if value in where]
        if t.status == "committed" and len(present) != len(t.values):
            v.append(f"lost: acknowledged transaction {name} lacks "
                     f"{sorted(set(t.values) - set(present))}")
        if t.status == "committing" and present and len(present) != len(t.values):
            v.append(f"partial: transaction {name} (commit under way at the cut) shows "
                     f"{sorted(present)} of {sorted(t.values)}")
    v += _check_order(final)
    v += _check_prefix(first, final)
    v += _check_offsets(history, where, committed)
    return v


def _check_input(final: Read) -> list[str]:
    expected = [(k, f"in.{k}") for k in range(INPUT_RECORDS)]
    if final.get((IN, 0)) != expected:
        return [f"the acknowledged input is not whole: {final.get((IN, 0))}"]
    return []


def _check_order(final: Read) -> list[str]:
    """Within a partition, each writer's records in the order it sent them."""
    out = []
    for (topic, p), rows in final.items():
        last: dict[str, tuple[int, ...]] = {}
        for _, value in rows:
            writer, *numbers = value.replace("etl:in", "etl.0").split(".")
            key = tuple(int(n) for n in numbers)
            if writer in last and key <= last[writer]:
                out.append(f"{topic}/{p}: {value!r} after a later record of {writer}")
            last[writer] = key
    return out


def _check_prefix(first: Read, final: Read) -> list[str]:
    """What the first reader saw, the last one sees too, at the same offsets."""
    return [f"{tp}: the first read is not a prefix of the last: {rows[:3]}..."
            for tp, rows in first.items() if final.get(tp, [])[:len(rows)] != rows]


def _check_offsets(history: History, where: dict[str, tuple[int, int]],
                   committed: dict[tuple[str, int], int]) -> list[str]:
    """The group's offset and etl's records moved together: exactly the input below the
    committed offset was transformed, once; never less than an acknowledged commit."""
    offset = committed.get((IN, 0), 0)
    out = []
    transformed = sorted(int(value.split(".")[1]) for value in where if value.startswith("etl:"))
    if transformed != list(range(offset)):
        out.append(f"group {GROUP!r} committed {offset}, but input records {transformed} "
                   "were transformed")
    acked = [t.consumed[1] for t in history.txns.values()
             if t.consumed is not None and t.status == "committed"]
    if acked and offset < max(acked):
        out.append(f"group {GROUP!r} committed {offset}, below acknowledged {max(acked)}")
    return out


def statuses(history: History) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for t in history.txns.values():
        counts[t.status] += 1
    return dict(counts)

