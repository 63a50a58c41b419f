"""Tests of txlog.exactly_once.stream_sink.StreamSink, the exactly-once rule of a streaming sink, without Spark.

Each test plays what Spark does around a crash: a run writes micro-batch n
with some task attempts and commits it (or dies somewhere on the way), and
a new run replays batch n.  Whatever the crash point, batch n must end up
in the log exactly once and nothing of a dead run may stay visible or hold
an LSO.
"""

from __future__ import annotations

import pytest

from helpers_core import crash_after_the_decision, nothing_holds_the_lso
from txlog import READ_COMMITTED, READ_UNCOMMITTED, Log, SinkOwnerError, TxlogError
from txlog.exactly_once.stream_sink import StreamSink, batch_key

T = "out"
TIMEOUT_MS = 60_000
QUERY = "0f1e2d3c-0000-4000-8000-000000000001"


@pytest.fixture
def root(tmp_path) -> str:
    log = Log(tmp_path / "log")
    log.create_topic(T, 2)
    return str(tmp_path / "log")


def run_tasks(sink: StreamSink, log: Log, job, batch_id: int, rows: int = 3, attempt: int = 0):
    """Both tasks of a micro-batch, as the stream writer runs them: skip a committed batch."""
    if sink.is_committed(log, batch_id):
        return []
    members = []
    for task in range(2):
        producer = job.join(log, f"{task}-{attempt}")
        for i in range(rows):
            producer.send(T, f"b{batch_id}-t{task}-{i}".encode(), partition=task)
        members.append(producer.prepare_transaction())
    return members


def new_run(root: str) -> tuple[Log, StreamSink]:
    """A fresh driver process: its own Log, the same prefix; it fences the last run."""
    log = Log(root)
    sink = StreamSink("q", TIMEOUT_MS, QUERY)
    sink.fence(log)
    return log, sink


def values(root: str, isolation: str = READ_COMMITTED) -> list[str]:
    log = Log(root)
    out = []
    for p in range(2):
        out += [v.decode() for v in log.read(T, p, isolation_level=isolation)
                .column("value").to_pylist()]
    return sorted(out)


def expected(*batches: int, rows: int = 3) -> list[str]:
    return sorted(f"b{b}-t{t}-{i}" for b in batches for t in range(2) for i in range(rows))


def assert_nothing_hangs(root: str) -> None:
    assert nothing_holds_the_lso(Log(root), T, 2), f"an LSO of {T} is held"


def test_batches_commit_with_their_ids(root: str) -> None:
    log, sink = new_run(root)
    for batch in range(3):
        job = sink.begin_batch()
        assert sink.commit_batch(log, job, batch, run_tasks(sink, log, job, batch))
    assert sink.next_batch(log) == 3
    assert values(root) == expected(0, 1, 2)
    assert_nothing_hangs(root)


def test_replay_of_a_committed_batch_writes_nothing(root: str) -> None:
    log, sink = new_run(root)
    job = sink.begin_batch()
    sink.commit_batch(log, job, 0, run_tasks(sink, log, job, 0))
    # Crash after the commit, before Spark recorded it: the next run replays batch 0.
    log, sink = new_run(root)
    job = sink.begin_batch()
    assert run_tasks(sink, log, job, 0) == []
    assert not sink.commit_batch(log, job, 0, [])
    assert values(root) == expected(0)
    assert values(root, READ_UNCOMMITTED) == expected(0)


def test_a_replay_whose_tasks_wrote_anyway_is_aborted(root: str) -> None:
    log, sink = new_run(root)
    job = sink.begin_batch()
    sink.commit_batch(log, job, 0, run_tasks(sink, log, job, 0))
    job = sink.begin_batch()
    members = [job.join(log, "9-0")]
    members[0].send(T, b"late", partition=0)
    member = members[0].prepare_transaction()
    assert not sink.commit_batch(log, job, 0, [member])
    assert values(root) == expected(0)
    assert_nothing_hangs(root)


def test_crash_after_the_decision_before_its_completion(root: str, monkeypatch) -> None:
    log, sink = new_run(root)
    job = sink.begin_batch()
    members = run_tasks(sink, log, job, 0)
    with crash_after_the_decision(monkeypatch, job.decision_id):
        sink.commit_batch(log, job, 0, members)

    log, sink = new_run(root)
    assert sink.next_batch(log) == 1  # rolled forward: batch 0 counts as committed
    job = sink.begin_batch()
    assert run_tasks(sink, log, job, 0) == []
    job = sink.begin_batch()
    sink.commit_batch(log, job, 1, run_tasks(sink, log, job, 1))
    job.wait_completed()  # its markers, written behind the decision
    assert values(root) == expected(0, 1)
    assert_nothing_hangs(root)


@pytest.mark.parametrize("crash_point", ["tasks wrote", "sink member prepared"])
def test_crash_before_the_decision(root: str, crash_point: str) -> None:
    log, sink = new_run(root)
    job = sink.begin_batch()
    # Second attempts wrote (so the next run's first attempts do not re-use their ids).
    run_tasks(sink, log, job, 0, attempt=1)
    if crash_point == "sink member prepared":
        producer = log.producer(transactional_id=sink.sink_id)
        producer.init_transactions()
        producer.begin_transaction(job.decision_id)
        producer.send_offsets_to_transaction({batch_key(QUERY): 1}, sink.sink_id)
        producer.prepare_transaction()
    assert values(root, READ_UNCOMMITTED) == expected(0)

    log, sink = new_run(root)
    assert sink.next_batch(log) == 0
    job = sink.begin_batch()
    assert sink.commit_batch(log, job, 0, run_tasks(sink, log, job, 0))
    assert values(root) == expected(0)  # once, though written twice
    assert len(values(root, READ_UNCOMMITTED)) == 2 * len(expected(0))
    assert_nothing_hangs(root)


def claiming_run(root: str) -> tuple[Log, StreamSink]:
    """A new run as the Spark writer starts each micro-batch: it claims, it does not
    fence (its commit does)."""
    log = Log(root)
    sink = StreamSink("q", TIMEOUT_MS, QUERY)
    sink.claim(log)
    return log, sink


def test_an_earlier_driver_committing_while_the_next_runs_tasks_write(root: str) -> None:
    """protocol.md 5.1: with no fence before the tasks, an earlier driver may decide
    batch 0 after this run's tasks found it open and wrote it; this run's commit
    fences, finds it committed and aborts its members: the batch is committed once."""
    old_log, old_sink = new_run(root)
    old_job = old_sink.begin_batch()
    # Second attempts (the new run's first attempts do not re-use, so fence, their ids).
    old_members = run_tasks(old_sink, old_log, old_job, 0, attempt=1)
    log, sink = claiming_run(root)
    job = sink.begin_batch()
    members = run_tasks(sink, log, job, 0)
    assert members  # the tasks found batch 0 open
    assert old_sink.commit_batch(old_log, old_job, 0, old_members)
    assert not sink.commit_batch(log, job, 0, members)
    assert values(root) == expected(0)
    assert Log(root).committed(sink.sink_id) == {batch_key(QUERY): 1}
    job = sink.begin_batch()
    assert sink.commit_batch(log, job, 1, run_tasks(sink, log, job, 1))
    job.wait_completed()
    assert values(root) == expected(0, 1)
    assert_nothing_hangs(root)


@pytest.mark.parametrize("start", [new_run, claiming_run], ids=["fenced", "claimed"])
def test_a_slow_driver_is_fenced_by_the_next_run(root: str, start) -> None:
    """Whether the next run fences at once or only claims (as the Spark writer starts a
    micro-batch), the old driver cannot commit after the next run's commit."""
    old_log, old_sink = new_run(root)
    old_job = old_sink.begin_batch()
    old_members = run_tasks(old_sink, old_log, old_job, 0, attempt=1)
    # The old driver stalls; a new run starts, replays batch 0 and commits it.
    log, sink = start(root)
    job = sink.begin_batch()
    assert sink.commit_batch(log, job, 0, run_tasks(sink, log, job, 0))
    # The old driver wakes up and tries to commit its batch 0.
    with pytest.raises(TxlogError):
        if not old_sink.commit_batch(old_log, old_job, 0, old_members):
            raise TxlogError("refused")
    assert values(root) == expected(0)
    assert Log(root).committed(sink.sink_id) == {batch_key(QUERY): 1}
    assert_nothing_hangs(root)


def test_group_offsets_commit_with_the_batch(root: str) -> None:
    log, sink = new_run(root)
    job = sink.begin_batch()
    sink.commit_batch(log, job, 0, run_tasks(sink, log, job, 0),
                      {"readers": {("in", 0): 10, ("in", 1): 7}})
    assert log.committed("readers") == {("in", 0): 10, ("in", 1): 7}
    job = sink.begin_batch()
    members = run_tasks(sink, log, job, 1)
    sink.abort_batch(log, job, members)
    assert log.committed("readers") == {("in", 0): 10, ("in", 1): 7}
    assert values(root) == expected(0)


# --- one query owns a prefix ----------------------------------------------------------------

OTHER = "0f1e2d3c-0000-4000-8000-000000000002"


def run_of(root: str, query: str, take_over_from: str | None = None) -> tuple[Log, StreamSink]:
    log = Log(root)
    sink = StreamSink("q", TIMEOUT_MS, query, take_over_from)
    sink.fence(log)
    return log, sink


def commit(sink: StreamSink, log: Log, batch_id: int) -> bool:
    job = sink.begin_batch()
    return sink.commit_batch(log, job, batch_id, run_tasks(sink, log, job, batch_id))


def test_a_second_query_on_the_prefix_is_refused_before_it_writes(root: str) -> None:
    log, sink = run_of(root, QUERY)
    assert commit(sink, log, 0) and commit(sink, log, 1)
    with pytest.raises(SinkOwnerError) as refused:
        run_of(root, OTHER)
    message = str(refused.value)
    assert QUERY in message and OTHER in message and "takeOverFrom" in message
    assert (refused.value.owner, refused.value.query) == (QUERY, OTHER)
    # The owner goes on as if nothing happened.
    assert commit(sink, log, 2)
    assert values(root) == expected(0, 1, 2)
    assert Log(root).committed(sink.sink_id) == {batch_key(QUERY): 3}


def test_a_reset_checkpoint_never_skips_its_batches_once_it_takes_over(root: str) -> None:
    log, sink = run_of(root, QUERY)
    for batch in range(3):
        commit(sink, log, batch)
    # The checkpoint is deleted: the query restarts with a new id and batch ids from 0.
    with pytest.raises(SinkOwnerError):
        run_of(root, OTHER)
    log, new = run_of(root, OTHER, take_over_from=QUERY)
    assert new.next_batch(log) == 0
    for batch in range(2):
        job = new.begin_batch()
        assert new.commit_batch(log, job, batch, run_tasks(new, log, job, batch, rows=2))
    assert values(root) == sorted(expected(0, 1, 2) + expected(0, 1, rows=2))
    # Taking over is one way: the old query cannot come back, even naming the new one.
    with pytest.raises(SinkOwnerError):
        run_of(root, QUERY)
    log, again = run_of(root, OTHER, take_over_from=QUERY)  # a restart keeps the option: fine
    assert again.next_batch(log) == 2


def test_an_owner_that_lost_the_prefix_cannot_commit(root: str) -> None:
    old_log, old = run_of(root, QUERY)
    commit(old, old_log, 0)
    job = old.begin_batch()
    members = run_tasks(old, old_log, job, 1)
    log, new = run_of(root, OTHER, take_over_from=QUERY)
    with pytest.raises(SinkOwnerError):
        old.commit_batch(old_log, job, 1, members)
    assert values(root) == expected(0)  # the old query's batch 1 was aborted
    assert Log(root).committed(new.sink_id) == {batch_key(QUERY): 1}
    assert_nothing_hangs(root)


def test_two_queries_claiming_at_once_never_both_own_the_prefix(root: str) -> None:
    import threading

    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def claim(query: str) -> None:
        sink = StreamSink("q", TIMEOUT_MS, query)
        barrier.wait()
        try:
            sink.claim(Log(root))
            outcomes.append(query)
        except SinkOwnerError:
            pass

    queries = [f"0f1e2d3c-0000-4000-8000-00000000001{i}" for i in range(8)]
    threads = [threading.Thread(target=claim, args=(q,)) for q in queries]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outcomes) == 1
    from txlog.transactions.groups import group_owner
    assert group_owner(Log(root).storage, "q-sink") == outcomes[0]


def test_a_sink_written_before_owners_is_adopted_by_its_first_query(root: str) -> None:
    log = Log(root)
    log.commit_offsets("q-sink", {("_batch", 0): 5})  # what an older txlog recorded
    log, sink = run_of(root, QUERY)
    assert sink.next_batch(log) == 5
    assert Log(root).committed("q-sink") == {batch_key(QUERY): 5}


def test_a_failed_micro_batch_is_ended_at_once(root: str) -> None:
    log, sink = run_of(root, QUERY)
    job = sink.begin_batch()
    run_tasks(sink, log, job, 0)  # prepared, never handed over: every task failed later
    retry = job.join(log, "0-1")  # an attempt still open
    retry.send(T, b"late", partition=0)
    retry.flush()
    assert not all(Log(root).partition(T, p).last_stable_offset() ==
                   Log(root).partition(T, p).end_offset() for p in range(2))
    # Spark's abort: a fresh writer (a new run of fence), no members, no decision id.
    log, sink = run_of(root, QUERY)
    sink.abort_batch(log, None, [])
    assert_nothing_hangs(root)
    other = Log(root).producer(transactional_id="someone-else")
    other.init_transactions()
    other.begin_transaction()
    other.send(T, b"visible", partition=0)
    other.commit_transaction()
    assert values(root) == ["visible"]
    assert commit(sink, log, 0)  # the replay writes the batch once
    assert values(root) == sorted(expected(0) + ["visible"])


def test_a_deleted_sink_group_is_claimed_again_and_skips_nothing(root: str) -> None:
    log, sink = run_of(root, QUERY)
    commit(sink, log, 0)
    log.delete_group(sink.sink_id)  # `txlog groups delete q-sink`: owner and batch ids go
    assert commit(sink, log, 1)  # the running query owns the prefix again
    with pytest.raises(SinkOwnerError):
        run_of(root, OTHER)
    assert values(root) == expected(0, 1)


def test_the_sink_members_chain_outlives_its_batch_so_offsets_survive_a_slow_clock(
        root: str, monkeypatch) -> None:
    """gc deletes a finished batch's attempt chains at once (protocol.md 5.3), but not
    the sink member's, whose transactions carry the batch id as group offsets: a
    chain restarted without a Dead tombstone takes the restarting process's clock as
    its incarnation, and behind the deleted chain's marks its commits would be skipped
    silently (batch 1 would read as uncommitted and be written again).  Fails with the
    rule's offsets condition removed."""
    from helpers_core import manual_clock

    clock = manual_clock(monkeypatch)
    log, sink = new_run(root)
    job = sink.begin_batch()
    assert sink.commit_batch(log, job, 0, run_tasks(sink, log, job, 0))
    job.wait_completed()  # the members' Complete versions, behind the decision
    log.gc()  # the attempts' chains go:
    assert [t for t in log.coordinator.transactional_ids() if t != sink.sink_id] == []
    clock.now_ms -= 60_000  # the next driver's clock is a minute behind
    log, sink = new_run(root)
    job = sink.begin_batch()
    assert sink.commit_batch(log, job, 1, run_tasks(sink, log, job, 1))
    assert sink.next_batch(log) == 2
    assert values(root) == expected(0, 1)
    assert_nothing_hangs(root)
