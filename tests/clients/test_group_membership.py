"""Consumer groups with membership (issue 22, item 2): the assignors, the protocol in one
process, and the acceptance criteria as real processes (split and takeover, zombie
fencing, stress), the CLI, and the storage requests a heartbeat and a rebalance cost.

Session timeouts are short (1.5 s) so that the process tests take seconds.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from txlog import (CommitFailedError, GroupNotEmptyError, Log, ProducerFencedError,
                   TransactionAbortedError, clock)
from txlog.clients.assignors import (range_assign, roundrobin_assign, select_protocol,
                                     sticky_assign)
from txlog.clients.membership import GroupMember
from txlog.errors import InconsistentGroupProtocolError
from conftest import HARNESS_DIR, SRC
from helpers_core import DelegatingStorage
from txlog.storage.contract import Storage
from txlog.storage.memory import MemoryStorage
from txlog.storage.paths import GROUP_DIR
from txlog.transactions.group_members import (CLOCK_SKEW_MARGIN_MS, HEARTBEAT_SEPARATOR,
                                              GroupMembership, MemberInfo)

WORKER = HARNESS_DIR / "group_worker.py"
SESSION_MS, HEARTBEAT_MS = 1500, 300


def info(member_id: str, topics=("t",), assignors=("range",), instance=None) -> MemberInfo:
    return MemberInfo(member_id, "c", instance, tuple(topics), tuple(assignors), 1000, 1000, 0)


# --- assignors ---------------------------------------------------------------------------------


def test_range_gives_consecutive_ranges_first_members_one_more():
    members = [info("b"), info("a"), info("c")]
    assert range_assign(members, {"t": 7}) == {
        "a": [("t", 0), ("t", 1), ("t", 2)], "b": [("t", 3), ("t", 4)], "c": [("t", 5), ("t", 6)]}
    # Per topic: with two topics of 3 the first member gets 2 of each (Kafka's known skew).
    two = [info("a", ("t", "u")), info("b", ("t", "u"))]
    out = range_assign(two, {"t": 3, "u": 3})
    assert out["a"] == [("t", 0), ("t", 1), ("u", 0), ("u", 1)] and len(out["b"]) == 2


def test_roundrobin_deals_in_turn_and_skips_unsubscribed():
    members = [info("a", ("t", "u")), info("b", ("t",))]
    assert roundrobin_assign(members, {"t": 3, "u": 2}) == {
        "a": [("t", 0), ("t", 2), ("u", 0), ("u", 1)], "b": [("t", 1)]}


def test_cooperative_sticky_moves_only_what_balance_needs():
    a, b, c = info("a"), info("b"), info("c")
    first = sticky_assign([a, b], {"t": 6}, {})
    assert sorted(len(v) for v in first.values()) == [3, 3]
    second = sticky_assign([a, b, c], {"t": 6}, first)
    assert all(len(v) == 2 for v in second.values())
    for m in ("a", "b"):  # each kept two of its three; only two partitions moved, both to c
        assert set(second[m]) <= set(first[m])
    third = sticky_assign([a, c], {"t": 6}, second)  # b leaves: a and c keep theirs
    assert set(second["a"]) <= set(third["a"]) and set(second["c"]) <= set(third["c"])
    assert sorted(third["a"] + third["c"]) == [("t", p) for p in range(6)]


def test_protocol_is_chosen_as_kafka_chooses():
    assert select_protocol([info("a", assignors=("range", "cooperative-sticky")),
                            info("b", assignors=("cooperative-sticky", "range"))]) == "range"
    assert select_protocol([info("a", assignors=("range", "cooperative-sticky")),
                            info("b", assignors=("cooperative-sticky",)),
                            info("c", assignors=("cooperative-sticky", "range"))]) == \
        "cooperative-sticky"
    with pytest.raises(InconsistentGroupProtocolError, match="no partition assignor in common"):
        select_protocol([info("a", assignors=("range",)), info("b", assignors=("roundrobin",))])


# --- the protocol in one process ------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, list]] = []

    def on_partitions_revoked(self, revoked):
        self.events.append(("revoked", sorted(revoked)))

    def on_partitions_assigned(self, assigned):
        self.events.append(("assigned", sorted(assigned)))


def member(log, listener=None, **kw) -> GroupMember:
    kw.setdefault("session_timeout_ms", SESSION_MS)
    kw.setdefault("heartbeat_interval_ms", HEARTBEAT_MS)
    return GroupMember(log, "g", ["t"], listener=listener, **kw)


def settle(*members: GroupMember, timeout: float = 10) -> None:
    """Poll until every member owns what its newest generation assigns it."""
    deadline = time.monotonic() + timeout
    while True:
        for m in members:
            m._next_check = 0.0
            m.poll()
        gens = {m.generation for m in members}
        if len(gens) == 1 and not any(m.waiting() for m in members) and \
                GroupMembership(members[0].root.storage, "g").latest().generation in gens:
            return
        assert time.monotonic() < deadline, "members did not settle"
        time.sleep(0.02)


def test_cooperative_rebalance_revokes_only_moved_partitions(memlog):
    memlog.create_topic("t", 4)
    ra, rb = Recorder(), Recorder()
    a = member(memlog, ra, assignors=["cooperative-sticky"])
    a.poll()
    assert a.assignment() == {("t", p) for p in range(4)}
    b = member(memlog, rb, assignors=["cooperative-sticky"])
    b.poll()
    assert b.assignment() == set()  # its two partitions wait until a lets go of them
    settle(a, b)
    assert len(a.assignment()) == len(b.assignment()) == 2
    assert a.assignment() | b.assignment() == {("t", p) for p in range(4)}
    # a was told about the two it lost only, never about the two it kept.
    assert ra.events == [("assigned", [("t", p) for p in range(4)]),
                         ("revoked", sorted(b.assignment()))]
    assert rb.events == [("assigned", sorted(b.assignment()))]
    b.close()
    settle(a)
    assert a.assignment() == {("t", p) for p in range(4)}
    assert ra.events[-1] == ("assigned", rb.events[0][1])  # b's two come back to a
    a.close()


def test_eager_rebalance_revokes_everything_and_new_partitions_rebalance(memlog):
    memlog.create_topic("t", 2)
    ra = Recorder()
    a = member(memlog, ra)
    b = member(memlog)
    a.poll()
    b.poll()
    settle(a, b)
    assert ("revoked", [("t", 0), ("t", 1)]) in ra.events  # range is eager
    assert len(a.assignment()) == len(b.assignment()) == 1
    memlog.create_partitions("t", 4)
    leader = a if GroupMembership(memlog.storage, "g").latest().leader == a.member_id else b
    before = leader.generation
    settle(a, b)
    assert leader.generation > before
    assert a.assignment() | b.assignment() == {("t", p) for p in range(4)}
    a.close()
    b.close()


def test_stale_generation_commit_is_refused_and_static_member_replaces_itself(memlog):
    memlog.create_topic("t", 2)
    a = member(memlog, group_instance_id="worker-1")
    a.poll()
    a.commit({("t", 0): 1})
    old_id, old_generation = a.member_id, a.generation
    # The same instance restarts (a new process with the same group.instance.id).
    again = member(memlog, group_instance_id="worker-1")
    again.poll()
    assert again.member_id != old_id and again.assignment() == {("t", 0), ("t", 1)}
    with pytest.raises(CommitFailedError, match="no longer in the group"):
        a.commit({("t", 0): 0})
    with pytest.raises(CommitFailedError, match="no longer in the group"):
        producer = memlog.producer(transactional_id="x")
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_offsets_to_transaction({("t", 0): 0}, "g", member_id=old_id,
                                             generation=old_generation)
    with pytest.raises(CommitFailedError):
        producer.commit_transaction()  # abortable: the refusal stands until aborted
    producer.abort_transaction()
    assert memlog.committed("g") == {("t", 0): 1}
    a.close()  # replaced: closing takes nothing from the member that replaced it
    latest = GroupMembership(memlog.storage, "g").latest()
    assert [m.member_id for m in latest.members] == [again.member_id]
    again.close()


def test_the_fence_refuses_a_member_still_listed_once_another_took_over(memlog):
    """Atomic check: a member that is still in the group but behind (it has not seen
    the generation that moved its partition) cannot commit after the new owner fenced."""
    memlog.create_topic("t", 2)
    a = member(memlog)
    a.poll()
    a.commit({("t", 1): 3})
    b = member(memlog)
    b.poll()  # generation 2: t-1 moves to b, which waits for a
    stale = a.generation
    settle(a, b)  # a lets go, b fences the offsets at generation 2 and takes over
    with pytest.raises(CommitFailedError, match="generation 1 is stale"):
        _commit_as(a, stale, {("t", 1): 1})
    assert memlog.committed("g")[("t", 1)] == 3
    a.close()
    b.close()


def _commit_as(m: GroupMember, generation: int, offsets) -> None:
    from txlog.transactions.groups import commit_offsets

    commit_offsets(m.root.storage, "g", offsets, generation=generation)


def test_zombie_fenced_between_send_and_commit_cannot_commit(memlog):
    """KIP-447's hard case: the offsets were sent (the generation was current then), and
    the member is removed before it commits.  The new owner decides that transaction
    (aborts it) before it reads the offsets, so the zombie's commit fails and its output
    never becomes visible; the new owner starts from the offsets before it."""
    memlog.create_topic("t", 1)
    memlog.create_topic("out", 1)
    with memlog.producer() as p:
        for i in range(4):
            p.send("t", str(i).encode(), partition=0)
    zombie = member(memlog, session_timeout_ms=600, heartbeat_interval_ms=100)
    zombie.poll()
    producer = memlog.producer(transactional_id="ctp-zombie")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("out", b"from the zombie", partition=0)
    producer.send_offsets_to_transaction({("t", 0): 4}, "g", member_id=zombie.member_id,
                                         generation=zombie.generation)
    zombie._stop.set()  # it stalls here: no heartbeats, no polls
    heir = member(memlog, session_timeout_ms=600, heartbeat_interval_ms=100)
    deadline = time.monotonic() + 10
    while heir.assignment() != {("t", 0)}:  # waits for the zombie, then expires it
        assert time.monotonic() < deadline, "the heir never took over"
        heir.poll()
        time.sleep(0.02)
    assert memlog.committed("g").get(("t", 0), 0) == 0  # read after the zombie was decided
    with pytest.raises((ProducerFencedError, TransactionAbortedError)):
        producer.commit_transaction()
    assert memlog.read("out", 0).num_rows == 0  # the zombie's output is aborted
    assert memlog.committed("g").get(("t", 0), 0) == 0
    heir.close()


def test_fence_registrations_in_the_offsets_chain(memlog):
    from txlog.transactions.groups import (drop_pending, fence_generation,
                                           register_transactional_offsets)

    st = memlog.storage
    register_transactional_offsets(st, "g", "t1", (7, 0), 3, "m1", [("a", 0)])  # no group yet
    register_transactional_offsets(st, "g", "t2", (8, 0), 3, "m2", [("a", 1)])
    assert fence_generation(st, "g", 4, [("a", 0)]) == [("t1", 7, 0, 3)]  # only a-0's sender
    with pytest.raises(CommitFailedError, match="generation 3 is stale"):
        register_transactional_offsets(st, "g", "t1", (7, 1), 3, "m1", [("a", 0)])
    drop_pending(st, "g", [("t1", 7, 0, 3)])
    assert fence_generation(st, "g", 5, [("a", 0), ("a", 1)]) == [("t2", 8, 0, 3)]
    memlog.delete_group("g")  # a tombstone keeps the fence
    with pytest.raises(CommitFailedError):
        _commit_as(type("M", (), {"root": memlog.services})(), 4, {("a", 0): 1})


def test_membership_on_s3(s3_server, s3_root):
    """The object names (member ids, '@' in heartbeat names) survive a real S3 listing,
    and the requests of a heartbeat and a periodic look are what the table says."""
    from txlog.storage.schemes import open_storage

    storage = RequestCounter(open_storage(s3_root, s3_server.storage_options))
    # The counter sees the calling thread's requests only: lookups a remote store
    # overlaps on threads of their own (a topic's description, docs/protocol.md 6.1)
    # are made in the calling thread here, as they are on local storage.
    storage.remote = False
    log = Log(storage)
    log.create_topic("t", 2)
    a = GroupMember(log, "g", ["t"], session_timeout_ms=SESSION_MS,
                    heartbeat_interval_ms=HEARTBEAT_MS, client_id="a client")
    b = GroupMember(log, "g", ["t"], session_timeout_ms=SESSION_MS,
                    heartbeat_interval_ms=HEARTBEAT_MS)
    a.poll()
    b.poll()
    settle(a, b)
    assert a.member_id.startswith("a_client-")
    assert set(GroupMembership(storage, "g").heartbeats()) == {a.member_id, b.member_id}
    b.commit({tp: 1 for tp in b.assignment()})
    storage.take()
    b._heartbeat()
    heartbeat = storage.take()
    b._next_check = 0.0
    b.poll()
    look = storage.take()
    assert heartbeat == {"PUT": 1, "DELETE": 1}
    assert look in ({"GET": 1, "LIST": 1}, {"GET": 3, "LIST": 1})  # the leader: + metadata
    a.close()
    b.close()


def test_groups_are_independent(memlog):
    memlog.create_topic("t", 2)
    a = GroupMember(memlog, "g1", ["t"], session_timeout_ms=SESSION_MS,
                    heartbeat_interval_ms=HEARTBEAT_MS)
    b = GroupMember(memlog, "g2", ["t"], session_timeout_ms=SESSION_MS,
                    heartbeat_interval_ms=HEARTBEAT_MS)
    a.poll()
    b.poll()
    assert a.assignment() == b.assignment() == {("t", 0), ("t", 1)}
    a.commit({("t", 0): 1})
    assert memlog.committed("g1") == {("t", 0): 1} and memlog.committed("g2") == {}
    a.close()
    b.close()


def test_max_poll_interval_leaves_the_group(memlog):
    memlog.create_topic("t", 2)
    a = member(memlog, max_poll_interval_ms=400)
    b = member(memlog)
    a.poll()
    b.poll()
    settle(a, b)
    gone = a.member_id
    deadline = time.monotonic() + 5
    while GroupMembership(memlog.storage, "g").latest().member(gone) is not None:
        assert time.monotonic() < deadline, "a did not leave after max_poll_interval_ms"
        b.poll()
        time.sleep(0.05)
    settle(b)
    assert b.assignment() == {("t", 0), ("t", 1)}
    a.poll()  # a finds itself gone and rejoins as a new member
    assert a.member_id != gone
    a.close()
    b.close()


def test_reset_offsets_refused_while_members_live(memlog):
    memlog.create_topic("t", 1)
    memlog.commit_offsets("g", {("t", 0): 0})
    a = member(memlog)
    a.poll()
    with pytest.raises(GroupNotEmptyError, match="'g' is inactive, but the current state is "
                                                 "Stable"):
        memlog.reset_offsets("g", lambda current: {("t", 0): 0})
    a.close()
    assert memlog.reset_offsets("g", lambda current: {("t", 0): 0}) == {("t", 0): 0}


def test_reset_removes_expired_members_and_fences_them(memlog):
    """A member past its session timeout does not block a reset (as Kafka's coordinator
    would have expired it), and cannot commit over the reset if it comes back."""
    memlog.create_topic("t", 1)
    memlog.commit_offsets("g", {("t", 0): 3})
    a = member(memlog, session_timeout_ms=200, heartbeat_interval_ms=50)
    a.poll()
    a._stop.set()  # stalls
    deadline = time.monotonic() + 5
    while True:
        try:
            memlog.reset_offsets("g", lambda current: {("t", 0): 0})
            break
        except GroupNotEmptyError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert GroupMembership(memlog.storage, "g").latest().members == ()
    with pytest.raises(CommitFailedError):
        _commit_as(a, a.generation, {("t", 0): 3})  # even past the membership probe
    assert memlog.committed("g") == {("t", 0): 0}


# --- processes ------------------------------------------------------------------------------------


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(SRC)] + [p for p in e.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    return e


class Worker:
    """A group_worker.py process whose stdout lines are collected by a thread."""

    def __init__(self, mode: str, root: str, name: str, out: Path, **opts) -> None:
        self.name, self.out = name, out
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), mode, root, "g", name, str(out), json.dumps(opts)],
            stdout=subprocess.PIPE, stderr=open(out / f"{name}.stderr", "w"), text=True,
            env=env())
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def drain(self) -> list[str]:
        while True:
            try:
                self.seen.append(self.lines.get_nowait())
            except queue.Empty:
                return self.seen

    def wait_line(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            for line in self.drain():
                if line.startswith(prefix):
                    return line
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: no {prefix!r} line in {timeout}s; got "
                                     f"{self.seen[-5:]}; stderr "
                                     f"{(self.out / f'{self.name}.stderr').read_text()[-2000:]}")
            time.sleep(0.02)

    def owned(self) -> set[tuple[str, int]]:
        path = self.out / f"{self.name}.owned"
        if not path.exists():
            return set()
        return {tuple(tp) for tp in json.loads(path.read_text())["owned"]}

    def member_id(self) -> str | None:
        path = self.out / f"{self.name}.owned"
        return json.loads(path.read_text())["member_id"] if path.exists() else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def fill(root: str, partitions: int, per_partition: int, out: bool = False) -> Log:
    log = Log(root)
    log.create_topic("in", partitions)
    if out:
        log.create_topic("out", partitions)
    with log.producer() as producer:
        for p in range(partitions):
            for i in range(per_partition):
                producer.send("in", f"{p}:{i}".encode(), partition=p)
    return log


def records_of(out: Path, name: str) -> list[tuple[int, int]]:
    path = out / f"{name}.records"
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()] \
        if path.exists() else []


def test_two_processes_split_then_one_takes_over_after_sigkill(tmp_path):
    root, out = str(tmp_path / "log"), tmp_path
    per = 200
    log = fill(root, 4, per)
    a = Worker("consume", root, "a", out, batch=6, pause_s=0.05)
    b = None
    try:
        wait_for(lambda: len(a.owned()) == 4, 20, "a to own all 4 partitions")
        b = Worker("consume", root, "b", out, batch=6, pause_s=0.05)
        wait_for(lambda: len(a.owned()) == 2 and len(b.owned()) == 2, 20, "a 2+2 split")
        assert a.owned() | b.owned() == {("in", p) for p in range(4)}
        wait_for(lambda: len(records_of(out, "b")) > 20, 20, "b to consume")
        b_owned = {p for _t, p in b.owned()}
        killed = time.monotonic()
        b.kill()
        # What b committed last, read from the group (b's own record of its commits may
        # miss the one the kill cut short after it landed); nobody else commits b's
        # partitions before a takes them over, a session timeout later.
        at_kill = log.committed("g")
        b_committed = {p: at_kill.get(("in", p), 0) for p in b_owned}
        wait_for(lambda: len(a.owned()) == 4, 20, "a to take over all 4 partitions")
        takeover_ms = (time.monotonic() - killed) * 1000
        print(f"takeover after SIGKILL: {takeover_ms:.0f} ms (session timeout {SESSION_MS} ms, "
              f"clock-skew margin {CLOCK_SKEW_MARGIN_MS} ms, heartbeat {HEARTBEAT_MS} ms)")
        # Expiry is judged at the last heartbeat + session + margin and seen at the next
        # check (a heartbeat interval); the rest is one rebalance.
        assert takeover_ms < SESSION_MS + CLOCK_SKEW_MARGIN_MS + HEARTBEAT_MS + 3000
        wait_for(lambda: log.committed("g") == {("in", p): per for p in range(4)}, 60,
                 "a to consume and commit everything")
    finally:
        a.stop()
        if b is not None:
            b.kill()
    got_a, got_b = records_of(out, "a"), records_of(out, "b")
    # Each check names what the workers went through: a refused commit or a second
    # member id (a session that lapsed under load) would explain a re-delivery.
    seen = membership_story(a, b)
    repeated = [(w, r) for w, got in (("a", got_a), ("b", got_b))
                for r, n in collections.Counter(got).items() if n > 1]
    assert repeated == [], (repeated[:10], seen)
    assert set(got_a) | set(got_b) == {(p, i) for p in range(4) for i in range(per)}, seen
    twice = set(got_a) & set(got_b)
    # Re-delivered only after b's last commit: a resumed exactly at b's committed offsets.
    assert all(offset >= b_committed.get(p, 0) for p, offset in twice), (sorted(twice)[:10], seen)
    for p in {p for p, _ in got_b}:
        after_kill = [o for q, o in got_a if q == p and o >= b_committed.get(p, 0)]
        assert min(after_kill) == b_committed.get(p, 0), (p, b_committed, seen)


def membership_story(*workers: Worker) -> dict[str, list[str]]:
    """Each worker's membership events, in order (its MEMBER, OWNED, COMMIT-REFUSED and
    ABANDONED lines), for the message of a failed check."""
    return {w.name: [line for line in w.drain()
                     if line.startswith(("MEMBER", "OWNED", "COMMIT-REFUSED", "ABANDONED"))]
            for w in workers}


def test_zombie_of_a_consume_transform_produce_loop_is_fenced(tmp_path):
    root, out = str(tmp_path / "log"), tmp_path
    per = 150
    log = fill(root, 4, per, out=True)
    workers = {n: Worker("ctp", root, n, out, batch=6, pause_s=0.03) for n in ("a", "z", "b")}
    try:
        wait_for(lambda: all(w.owned() for w in workers.values()) and
                 sum(len(w.owned()) for w in workers.values()) == 4, 30, "three owners")
        (out / "z.stall").touch()
        stalled = json.loads(workers["z"].wait_line("STALLING", 20).split(" ", 1)[1])
        stalled_at = time.monotonic()
        workers["a"].kill()  # SIGKILL, wherever it is
        b = workers["b"]
        wait_for(lambda: len(b.owned()) == 4, 20, "b to take over from the dead and the stalled")
        # b re-processes what z had in flight, committing past it, while z sleeps on.
        wait_for(lambda: all(log.committed("g").get(("in", p), 0) > o for p, o in stalled), 30,
                 "b to commit past z's batch")
        # The scenario: z stays stopped for longer than max.poll.interval.ms (3 s).
        time.sleep(max(0.0, stalled_at + 3.2 - time.monotonic()))
        os.kill(workers["z"].proc.pid, signal.SIGCONT)
        wait_for(lambda: any(line.startswith(("REFUSED", "COMMITTED-AFTER-STALL"))
                             for line in workers["z"].drain()), 20, "z to try its commit")
        wait_for(lambda: log.committed("g") == {("in", p): per for p in range(4)}, 60,
                 "everything to be committed")
    finally:
        for w in workers.values():
            if w.proc.poll() is None:
                os.kill(w.proc.pid, signal.SIGCONT)
                w.stop()
    # a's transaction may have been open when it died: a new instance of its id ends it.
    log.producer(transactional_id="ctp-a").init_transactions()
    seen = collections.Counter()
    for p in range(4):
        for v in log.read("out", p).column("value").to_pylist():
            seen[v] += 1
    expected = {f"{p}:{i}".encode() for p in range(4) for i in range(per)}
    # Output values name their input (partition:offset), input values are "p:i" at offset i.
    assert set(seen) == expected, sorted(expected - set(seen))[:5]
    assert [v for v, n in seen.items() if n > 1] == []  # each input exactly once
    # ... because the woken zombie's transactional offset commit was refused.
    refused = [line for line in workers["z"].seen if line.startswith("REFUSED")]
    assert refused and ("no longer in the group" in refused[0] or "stale" in refused[0])


def group_history(log: Log) -> list[dict]:
    """Every stored version of the group's offsets, oldest first (gc never ran)."""
    import msgpack

    d = f"{GROUP_DIR}/g"
    return [msgpack.unpackb(log.storage.read(f"{d}/{n}"), strict_map_key=False)
            for n in sorted(log.storage.list(d)) if n.isdigit()]


def test_stress_eight_members_join_and_leave_at_random(tmp_path):
    """8 processes whose members leave (or stop heartbeating, as if crashed) and join again
    at random moments, 3 of them SIGKILLed and replaced on the way; then they settle."""
    root, out = str(tmp_path / "log"), tmp_path
    rng = random.Random(int(os.environ.get("TXLOG_STRESS_SEED", time.time())))
    log = fill(root, 8, 400)
    started = 0

    def spawn() -> Worker:
        nonlocal started
        started += 1
        return Worker("consume", root, f"w{started}", out, batch=5, pause_s=0.05,
                      churn=[0.5, 2.5], assignors=rng.choice(
                          [["range"], ["roundrobin", "range"], ["range", "cooperative-sticky"]]))

    live = [spawn() for _ in range(8)]
    killed: list[Worker] = []
    kills = sorted(rng.uniform(1, 5) for _ in range(3))
    wait_for(lambda: all(w.member_id() for w in live), 60, "all 8 processes to join")
    t0 = time.monotonic()
    try:
        for at in kills:
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            victim = live.pop(rng.randrange(len(live)))
            victim.kill()
            killed.append(victim)
            live.append(spawn())
        time.sleep(max(0.0, t0 + 6 - time.monotonic()))
        (out / "settle").touch()
        membership = GroupMembership(log.storage, "g")

        def settled() -> bool:
            state = membership.latest()
            ids = {w.member_id() for w in live}
            if {m.member_id for m in state.members} != ids:
                return False
            return all(w.owned() == set(state.assignment.get(w.member_id(), ()))
                       for w in live)
        wait_for(settled, 30, "the live members to own the final generation's assignment")
        state = membership.latest()
        owners = collections.Counter(tp for w in live for tp in w.owned())
        assert set(owners) == {("in", p) for p in range(8)} and set(owners.values()) == {1}
        joins = sum(1 for w in live + killed for line in w.drain() if line.startswith("MEMBER"))
        print(f"stress: {started} processes, {joins} joins, {len(killed)} SIGKILLs, final "
              f"generation {state.generation}")
        assert joins >= started + 4  # members left and joined again inside the processes
    finally:
        for w in live:
            w.stop()
    history = group_history(log)
    highest: dict[tuple[str, int], int] = {}
    for version in history:
        for t, p, o in version["offsets"]:
            assert o >= highest.get((t, p), 0), f"{t}-{p} went back from {highest[(t, p)]} to {o}"
            highest[(t, p)] = o
    assert history


# --- the command line -------------------------------------------------------------------------------


def txlog(root: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "txlog.cli", "--root", root, *argv],
                          capture_output=True, text=True, timeout=60, env=env())


def test_cli_consume_group_joins_describe_shows_it_reset_refused(tmp_path):
    root = str(tmp_path / "log")
    fill(root, 2, 5)
    consume = subprocess.Popen(
        [sys.executable, "-m", "txlog.cli", "--root", root, "consume", "in", "--group", "g",
         "--from-beginning", "--follow", "--session-timeout-ms", "3000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    try:
        wait_for(lambda: Log(root).committed("g") == {("in", 0): 5, ("in", 1): 5}, 30,
                 "consume --group to commit what it printed")
        desc = txlog(root, "groups", "describe", "g", "--json")
        assert desc.returncode == 0, desc.stderr
        lines = [json.loads(line) for line in desc.stdout.splitlines()]
        group, rows = lines[0], lines[1:]
        assert group["state"] == "Stable" and group["protocol"] == "range"
        [m] = group["members"]
        assert m["client_id"] == "txlog-consume" and 0 <= m["heartbeat_age_ms"] < 3000
        assert m["assignment"] == [["in", 0], ["in", 1]]
        assert [(r["partition"], r["committed_offset"], r["lag"], r["consumer_id"])
                for r in rows] == [(0, 5, 0, m["member_id"]), (1, 5, 0, m["member_id"])]
        text = txlog(root, "groups", "describe", "g")
        assert "GENERATION" in text.stdout and "HEARTBEAT-AGE-MS" in text.stdout
        refused = txlog(root, "groups", "reset-offsets", "g", "--all-topics", "--to-earliest",
                        "--execute")
        assert refused.returncode == 1
        assert "Assignments can only be reset if the group 'g' is inactive, but the current " \
               "state is Stable" in refused.stderr
        assert Log(root).committed("g") == {("in", 0): 5, ("in", 1): 5}
    finally:
        consume.send_signal(signal.SIGTERM)
        stdout, _ = consume.communicate(timeout=30)
    assert sorted(stdout.split()) == sorted(f"{p}:{i}" for p in range(2) for i in range(5))
    # It left the group when it stopped: the reset goes through now.
    assert GroupMembership(Log(root).storage, "g").latest().state == "Empty"
    done = txlog(root, "groups", "reset-offsets", "g", "--all-topics", "--to-earliest",
                 "--execute")
    assert done.returncode == 0, done.stderr
    assert Log(root).committed("g") == {("in", 0): 0, ("in", 1): 0}


# --- requests on an object store ----------------------------------------------------------------


class RequestCounter(DelegatingStorage):
    """Counts the requests each call makes on S3 (a publish is one conditional PUT, a
    listing one LIST per 1,000 names): the calling thread's only, so that the members'
    background heartbeats, which start at their own moments, stay out of the counts."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.counts: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()
        self.thread = threading.current_thread()

    def _count(self, kind: str) -> None:
        if threading.current_thread() is not self.thread:
            return
        with self.lock:
            self.counts[kind] += 1

    def take(self) -> dict[str, int]:
        with self.lock:
            out = dict(self.counts)
            self.counts.clear()
            return out

    def publish_if_absent(self, path, data):
        self._count("PUT")
        return super().publish_if_absent(path, data)

    def read(self, path):
        self._count("GET")
        return super().read(path)

    def read_prefix(self, path, length):
        self._count("GET")
        return super().read_prefix(path, length)

    def exists(self, path):
        self._count("HEAD")
        return super().exists(path)

    def list(self, directory):
        self._count("LIST")
        return super().list(directory)

    def delete(self, path):
        self._count("DELETE")
        return super().delete(path)


def test_requests_per_heartbeat_and_per_rebalance_stay_flat_with_many_members(monkeypatch):
    storage = RequestCounter(MemoryStorage())
    log = Log(storage)
    log.create_topic("t", 64)
    # Long intervals: the background heartbeats stay out of the counts.
    kw = dict(session_timeout_ms=600_000, heartbeat_interval_ms=300_000)
    members = []
    try:
        _count_requests_with_many_members(monkeypatch, storage, log, kw, members)
    finally:
        for m in members:
            m._stop.set()
        for m in members:
            if m._thread is not None:
                m._thread.join()


def _count_requests_with_many_members(monkeypatch, storage, log, kw, members):
    joins = []
    for i in range(200):
        m = GroupMember(log, "g", ["t"], assignors=["cooperative-sticky"], **kw)
        storage.take()
        m.poll()
        joins.append(sum(storage.take().values()))
        members.append(m)
    leader, last = members[0], members[-1]
    storage.take()
    # A heartbeat within the millisecond of the join's own is the same object, so
    # nothing is written: step the clock past it, as the next beat always is.
    joined_at = int(last._heartbeat_name.rsplit(HEARTBEAT_SEPARATOR, 1)[1])
    with monkeypatch.context() as mp:
        mp.setattr(clock, "now_ms", lambda: joined_at + 1)
        last._heartbeat()
    heartbeat = storage.take()
    last._next_check = 0.0
    last.poll()  # the periodic check: a new generation? anyone expired?
    check = storage.take()
    leader._next_check = 0.0
    leader.poll()  # catching up over 199 generations: one probe per generation
    catch_up = storage.take()
    leader._next_check = 0.0
    leader.poll()  # the leader also looks for new partitions (Kafka's metadata refresh)
    leader_check = storage.take()
    print(f"requests: join of member 1: {joins[0]}, of member 200: {joins[-1]}; heartbeat "
          f"{heartbeat}; periodic check {check}, by the leader {leader_check}; catching up "
          f"over 199 generations {catch_up}")
    assert heartbeat == {"PUT": 1, "DELETE": 1}
    assert check == {"GET": 1, "LIST": 1}
    # + the topic's directory listed, which names neither a partition-count nor a config
    # chain, so neither is read (docs/protocol.md 1.8)
    assert leader_check == {"GET": 1, "LIST": 2}
    # The join of the 200th member costs what the first one's did, give or take the
    # handovers it waits for: nothing grows with the number of members.
    assert joins[-1] <= joins[0] + 6
