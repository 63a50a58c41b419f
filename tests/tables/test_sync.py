"""A topic's table kept by syncs: exactly the committed records, never a split transaction.

Every expectation comes from the writers' own history (what each send's future
returned, and whether its transaction's commit returned), never from txlog's
reader.  Interleavings are made deterministic with the sync's pause hook.
"""

from __future__ import annotations

import json
import random
import threading
from dataclasses import dataclass, field

import pyarrow as pa
import pytest

from txlog import Log
from txlog.clients.columns import spark_schema
from txlog.errors import InconsistentTopicIdError
from txlog.root.root import Root
from txlog.storage.paths import table_dir
from txlog.tables.catalog import RootCatalog, table_identifier
from txlog.tables.sync import SKIPPED_KEY, covered, sync_table

pytest.importorskip("pyiceberg", reason="needs the tables extra: pip install -e '.[tables]'")

TOPIC = "events"


@dataclass
class History:
    """What the writers were told: each transaction's records by (partition, offset)."""

    committed: list[dict[tuple[int, int], bytes]] = field(default_factory=list)
    aborted: list[dict[tuple[int, int], bytes]] = field(default_factory=list)


class Writer:
    """A transactional producer that records what each of its transactions wrote."""

    def __init__(self, log: Log, name: str, history: History) -> None:
        self.producer = log.producer(transactional_id=name)
        self.producer.init_transactions()
        self.history = history
        self.sent: list[tuple[object, bytes]] = []

    def send(self, *records: tuple[int, bytes]) -> Writer:
        if not self.sent:
            self.producer.begin_transaction()
        self.sent += [(self.producer.send(TOPIC, v, partition=p), v) for p, v in records]
        self.producer.flush()  # in the log now, its transaction still open
        return self

    def end(self, commit: bool) -> dict[tuple[int, int], bytes]:
        written = {(m.partition, m.offset): v for f, v in self.sent for m in [f.get()]}
        if commit:
            self.producer.commit_transaction()
            self.history.committed.append(written)
        else:
            self.producer.abort_transaction()
            self.history.aborted.append(written)
        self.sent = []
        return written


def table_rows(root: Root) -> dict[tuple[int, int], bytes]:
    """The newest snapshot's records, read back by pyiceberg; each (partition, offset) once."""
    scanned = RootCatalog(root.storage).load_table(table_identifier(TOPIC)).scan().to_arrow()
    assert scanned.schema.equals(spark_schema(True), check_metadata=False)
    keys = list(zip(scanned["partition"].to_pylist(), scanned["offset"].to_pylist()))
    assert len(keys) == len(set(keys)), "a record appended twice"
    return dict(zip(keys, scanned["value"].to_pylist()))


def expected(history: History, offsets: dict[int, int]) -> dict[tuple[int, int], bytes]:
    return {k: v for txn in history.committed for k, v in txn.items() if k[1] < offsets[k[0]]}


def check_snapshot(root: Root, history: History, plain: dict[tuple[int, int], bytes]
                   ) -> dict[int, int]:
    """The newest snapshot holds exactly the committed and plain records below its offsets,
    and every committed transaction wholly or not at all; returns the offsets."""
    offsets = covered(RootCatalog(root.storage).load_table(table_identifier(TOPIC))).offsets
    rows = table_rows(root)
    wanted = expected(History(history.committed + [plain]), offsets)
    assert rows == wanted
    for txn in history.committed:
        inside = [k in rows for k in txn]
        assert all(inside) or not any(inside), f"transaction split: {txn} against {offsets}"
    return offsets


def test_exactly_the_committed_records_and_no_split_transaction(log, tmp_path):
    log.create_topic(TOPIC, partitions=3)
    history = History()
    a, b, c = (Writer(log, n, history) for n in "abc")
    plain_producer = log.producer()
    a.send((0, b"a1"), (1, b"a2")).end(commit=True)
    a.send((0, b"x1"), (2, b"x2")).end(commit=False)
    b.send((0, b"b1"), (1, b"b2"))                      # B stays open: undecided at the start
    a.send((0, b"a3"), (1, b"a4")).end(commit=True)     # committed, interleaved with B
    c.send((1, b"c1"), (2, b"c2"))                      # C stays open
    b.send((0, b"b3"))                                  # B straddles A's transaction in p0
    d = a.send((0, b"d1"), (1, b"d2")).end(commit=True)  # above C in p1: must go wholly
    plain = {(m.partition, m.offset): b"p" for m in
             [plain_producer.send(TOPIC, b"p", partition=2).get()]}
    late: dict[str, dict[tuple[int, int], bytes]] = {}

    def pause(step: str, partition: int | None) -> None:
        if step == "state" and partition == 0:
            # B is decided after p0's state was read and before p1's; F writes p0 after
            # its state was read and p2 before: a cut from those states alone splits F.
            b.end(commit=True)
            late["f"] = a.send((0, b"f1"), (2, b"f2")).end(commit=True)
        if step == "resolved":
            late["c"] = c.end(commit=True)  # decided after the resolution: not in this cut

    syncer = Root(tmp_path / "log")  # another process's view: a maintainer of its own
    result = sync_table(syncer, TOPIC, pause)
    offsets = check_snapshot(syncer, history, plain)
    rows = table_rows(syncer)
    assert result.offsets == offsets and result.records == len(rows)
    assert {(0, 0), (1, 0)} <= rows.keys()              # A's first transaction
    assert not any(k in rows for k in d), "D lies above C's first batch in p1"
    assert not any(k in rows for k in late["c"])

    for producer in (a.producer, b.producer, c.producer, plain_producer):
        producer.close()
    again = sync_table(syncer, TOPIC)
    offsets = check_snapshot(syncer, history, plain)
    assert offsets == {p: log.end_offset(TOPIC, p) for p in range(3)}
    assert again.previous == result.offsets
    assert set(table_rows(syncer)) == set(expected(History(history.committed + [plain]), offsets))


def test_a_transaction_written_while_the_states_are_read_is_whole(log, tmp_path):
    """F writes partition 0 after the sync read its state, and partition 1 before: cuts from
    those states alone would hold F's record in 1 and not in 0.  The states read again
    after the resolution hold both."""
    log.create_topic(TOPIC, partitions=2)
    history = History()
    a = Writer(log, "a", history)
    a.send((0, b"a1"), (1, b"a2")).end(commit=True)
    late = {}

    def pause(step: str, partition: int | None) -> None:
        if step == "state" and partition == 0:
            late["f"] = a.send((0, b"f1"), (1, b"f2")).end(commit=True)

    root = Root(tmp_path / "log")
    sync_table(root, TOPIC, pause)
    check_snapshot(root, history, {})
    assert late["f"].keys() <= table_rows(root).keys()


def test_a_sync_with_nothing_new_commits_nothing(log, tmp_path):
    log.create_topic(TOPIC, partitions=1)
    history = History()
    writer = Writer(log, "a", history)
    writer.send((0, b"v")).end(commit=True)
    writer.producer.close()  # the commit marker lands behind the decision: wait for it,
    root = Root(tmp_path / "log")  # or the second sync finds the marker new (tables.md)
    first = sync_table(root, TOPIC)
    second = sync_table(root, TOPIC)
    assert first.snapshot_id is not None and second.snapshot_id is None
    assert second.metadata_location == first.metadata_location


def test_a_recreated_topic_is_refused_naming_both_ids(log, tmp_path):
    log.create_topic(TOPIC, partitions=1)
    root = Root(tmp_path / "log")
    old = sync_table(root, TOPIC).topic_id
    log.delete_topic(TOPIC)
    log.create_topic(TOPIC, partitions=1)
    new = log.describe_topic(TOPIC, refresh=True).topic_id
    with pytest.raises(InconsistentTopicIdError) as refused:
        sync_table(Root(tmp_path / "log"), TOPIC)
    assert TOPIC in str(refused.value) and old in str(refused.value) and new in str(refused.value)


def test_a_range_lost_before_its_sync_is_reported(log, tmp_path):
    log.create_topic(TOPIC, partitions=2)
    history = History()
    writer = Writer(log, "a", history)
    for i in range(3):
        writer.send((0, b"v%d" % i), (1, b"w%d" % i)).end(commit=True)
    writer.producer.close()
    root = Root(tmp_path / "log")
    sync_table(root, TOPIC)
    for i in range(3, 6):
        writer = Writer(log, "a", history)
        writer.send((0, b"v%d" % i)).end(commit=True)
        writer.producer.close()
    synced = covered(RootCatalog(root.storage).load_table(table_identifier(TOPIC))).offsets
    gone_to = log.end_offset(TOPIC, 0) - 2  # the last transaction's record and marker stay
    log.delete_records({(TOPIC, 0): gone_to})
    result = sync_table(root, TOPIC)
    assert result.skipped == {0: (synced[0], gone_to)}
    table = RootCatalog(root.storage).load_table(table_identifier(TOPIC))
    assert table.current_snapshot().summary[SKIPPED_KEY] == f'{{"0": [{synced[0]}, {gone_to}]}}'
    rows = table_rows(root)
    lost = {k for k in expected(history, result.offsets) if k[0] == 0 and synced[0] <= k[1] < gone_to}
    assert lost and not lost & rows.keys()
    assert rows == {k: v for k, v in expected(history, result.offsets).items() if k not in lost}


def test_pyiceberg_reads_what_log_read_returns_for_the_same_offsets(log, tmp_path):
    log.create_topic(TOPIC, partitions=2)
    producer = log.producer()
    for i in range(20):
        producer.send(TOPIC, b"v%d" % i, key=b"k%d" % i, partition=i % 2,
                      headers=[("h", b"%d" % i)])
    producer.close()
    root = Root(tmp_path / "log")
    result = sync_table(root, TOPIC)
    scanned = RootCatalog(root.storage).load_table(table_identifier(TOPIC)).scan().to_arrow()
    read = pa.concat_tables([log.read(TOPIC, p, start=0, end=result.offsets[p],
                                      include_headers=True) for p in range(2)])
    order = [("partition", "ascending"), ("offset", "ascending")]
    assert scanned.sort_by(order).select(read.column_names).equals(read.sort_by(order))
    assert sorted(root.storage.list(f"{table_dir(TOPIC)}/data")) == \
        sorted(f.rpartition("/")[2] for f in result.files)  # one file per partition and day


def race(log: Log, path, history: History) -> tuple[Root, dict[str, object]]:
    """Two maintainers: the first's commit waits while the second syncs, and more is
    committed; the first then commits (or fails to) on what it read before."""
    first, second = Root(path), Root(path)
    writer = Writer(log, "a", history)
    writer.send((0, b"1"), (1, b"2")).end(commit=True)
    sync_table(first, TOPIC)
    writer.send((0, b"3"), (1, b"4")).end(commit=True)
    results: dict[str, object] = {}

    def pause(step: str, partition: int | None) -> None:
        if step == "commit" and "second" not in results:
            results["second"] = sync_table(second, TOPIC)
            results["later"] = writer.send((1, b"5")).end(commit=True)
            writer.producer.close()

    results["first"] = sync_table(first, TOPIC, pause)
    return first, results


def test_two_syncs_racing_append_each_record_once(log, tmp_path):
    log.create_topic(TOPIC, partitions=2)
    history = History()
    root, results = race(log, tmp_path / "log", history)
    first, second = results["first"], results["second"]
    assert first.conflicts == 1 and first.previous == second.offsets
    assert first.records == len(results["later"])  # only what came after the second's sync
    check_snapshot(root, history, {})
    assert table_rows(root).keys() == expected(history, first.offsets).keys()
    # The loser's file was withdrawn: every data file is one the newest snapshot names.
    assert set(root.storage.list(f"{table_dir(TOPIC)}/data")) == named_files(root)


def named_files(root: Root) -> set[str]:
    """The data files any snapshot of the table names."""
    table = RootCatalog(root.storage).load_table(table_identifier(TOPIC))
    return {task.file.file_path.rpartition("/")[2] for task in table.scan().plan_files()}


@pytest.mark.parametrize("pinned, retries, twice", [
    (True, 0, False),   # the sync as built
    (True, 4, False),   # pyiceberg's retry on: every retry meets the pin
    (False, 0, False),  # pin off: the pointer's conditional publish alone refuses the loser
    (False, 4, True),   # both off: pyiceberg re-applies the loser's files on the winner's
])
def test_what_keeps_a_losing_sync_from_appending_twice(log, tmp_path, monkeypatch, pinned,
                                                       retries, twice):
    import txlog.tables.sync as sync

    monkeypatch.setattr(sync, "TABLE_PROPERTIES", {"commit.retry.num-retries": str(retries),
                                                   "commit.retry.min-wait-ms": "0"})
    if not pinned:
        monkeypatch.setattr(sync, "RootCatalog",
                            lambda storage, pinned=None: RootCatalog(storage))
    log.create_topic(TOPIC, partitions=2)
    history = History()
    root, _ = race(log, tmp_path / "log", history)
    if twice:
        with pytest.raises(AssertionError, match="appended twice"):
            table_rows(root)
    else:
        check_snapshot(root, history, {})


def test_an_unconditional_commit_appends_twice(log, tmp_path, monkeypatch):
    """A commit made onto whatever snapshot is newest, not the one its offsets came from."""
    import txlog.tables.sync as sync

    def unconditional(root: Root, table, files: list[str], summary: dict[str, str], until=None):
        catalog = RootCatalog(root.storage)
        tx = catalog.load_table(table.name()).transaction()
        tx.add_files([catalog.location(f) for f in files], snapshot_properties=summary,
                     check_duplicate_files=False)
        return tx.commit_transaction()

    monkeypatch.setattr(sync, "_commit", unconditional)
    log.create_topic(TOPIC, partitions=2)
    root, _ = race(log, tmp_path / "log", History())
    with pytest.raises(AssertionError, match="appended twice"):
        table_rows(root)


def test_offsets_move_over_aborted_records_in_a_snapshot_without_files(log, tmp_path):
    from pyiceberg.table import StaticTable

    log.create_topic(TOPIC, partitions=1)
    writer = Writer(log, "a", History())
    aborted = writer.send((0, b"x")).end(commit=False)
    writer.producer.close()
    root = Root(tmp_path / "log")
    result = sync_table(root, TOPIC)
    assert result.snapshot_id is not None and result.records == 0 and not result.files
    assert result.offsets == {0: log.end_offset(TOPIC, 0)} and result.offsets[0] > max(
        o for _, o in aborted)
    static = StaticTable.from_metadata(result.metadata_location)
    assert covered(static).offsets == result.offsets and static.scan().to_arrow().num_rows == 0
    assert sync_table(root, TOPIC).snapshot_id is None


def test_every_snapshot_is_exact_while_writers_and_two_syncs_run(log, tmp_path):
    """Threads: three transactional writers (a third of their transactions aborted) and two
    maintainers syncing in a loop.  Every snapshot the table ever had must hold exactly
    the committed records below its offsets, each transaction whole or absent."""
    log.create_topic(TOPIC, partitions=3)
    history = History()
    lock = threading.Lock()

    def write(name: str, seed: int) -> None:
        rng = random.Random(seed)
        writer = Writer(log, name, History())
        for i in range(8):
            chosen = rng.sample(range(3), rng.randint(1, 3))
            writer.send(*[(p, b"%s-%d-%d" % (name.encode(), i, p)) for p in chosen])
            commit = rng.random() > 1 / 3
            with lock:
                (history.committed if commit else history.aborted).append(writer.end(commit))
        writer.producer.close()

    writers = [threading.Thread(target=write, args=(n, i)) for i, n in enumerate("abc")]
    done = threading.Event()
    errors: list[BaseException] = []

    def maintain() -> None:
        root = Root(tmp_path / "log")
        try:
            while not done.is_set():
                sync_table(root, TOPIC)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    syncers = [threading.Thread(target=maintain) for _ in range(2)]
    for t in writers + syncers:
        t.start()
    for t in writers:
        t.join()
    done.set()
    for t in syncers:
        t.join()
    assert errors == []
    root = Root(tmp_path / "log")
    sync_table(root, TOPIC)
    table = RootCatalog(root.storage).load_table(table_identifier(TOPIC))
    snapshots = table.snapshots()
    assert len(snapshots) > 2
    print('SNAPSHOTS', len(snapshots))
    for snapshot in snapshots:
        offsets = {int(p): o for p, o in json.loads(snapshot.summary["txlog.offsets"]).items()}
        scanned = table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()
        keys = list(zip(scanned["partition"].to_pylist(), scanned["offset"].to_pylist()))
        assert len(keys) == len(set(keys))
        rows = dict(zip(keys, scanned["value"].to_pylist()))
        assert rows == expected(history, offsets)
        for txn in history.committed:
            inside = [k in rows for k in txn]
            assert all(inside) or not any(inside), f"split: {txn} against {offsets}"
    assert offsets == {p: log.end_offset(TOPIC, p) for p in range(3)}


def test_every_file_of_the_table_is_published_through_the_roots_storage(log, tmp_path,
                                                                         monkeypatch):
    """Metadata, manifests, manifest lists and data files alike: created exclusively and
    durable (fsynced) before the pointer that names them is published."""
    log.create_topic(TOPIC, partitions=1)
    root = Root(tmp_path / "log")
    published: list[str] = []
    publish = type(root.storage).publish_if_absent

    def recording(storage, path: str, data: bytes) -> bool:
        published.append(path)
        return publish(storage, path, data)

    monkeypatch.setattr(type(root.storage), "publish_if_absent", recording)
    for i in range(2):
        producer = log.producer()
        producer.send(TOPIC, b"v%d" % i)
        producer.close()
        sync_table(root, TOPIC)
    stored = {p.relative_to(tmp_path / "log").as_posix()
              for p in (tmp_path / "log" / table_dir(TOPIC)).rglob("*") if p.is_file()}
    assert stored == {p for p in published if p.startswith(table_dir(TOPIC) + "/")}
    assert any(p.endswith(".avro") for p in stored)


def test_a_sync_lists_the_pointer_once_per_process(log, tmp_path, monkeypatch):
    """The pointer chain is listed once and then only probed for its next version, so a
    sync's requests for it do not grow with the table's snapshots."""
    log.create_topic(TOPIC, partitions=1)
    root = Root(tmp_path / "log")
    listed: list[str] = []
    list_names = type(root.storage).list

    def recording(storage, directory: str) -> list[str]:
        listed.append(directory)
        return list_names(storage, directory)

    monkeypatch.setattr(type(root.storage), "list", recording)
    for i in range(4):
        producer = log.producer()
        producer.send(TOPIC, b"v%d" % i)
        producer.close()
        assert sync_table(root, TOPIC).snapshot_id is not None
    assert listed.count(f"{table_dir(TOPIC)}/pointer") == 1


def test_a_syncs_metadata_copies_do_not_grow_with_its_reads(log, tmp_path, monkeypatch):
    """pyiceberg rebuilds a transaction's staged metadata, a deep copy of the whole
    metadata, at every read (20 in one sync); a sync's commit builds it once per
    set of staged updates, so its cost does not grow with the snapshots kept (issue 35's
    sync-cost goal).  Counted with pyiceberg's own transaction it is 20 per sync."""
    from pyiceberg.table import Transaction

    log.create_topic(TOPIC, partitions=2)
    root = Root(tmp_path / "log")
    built = 0
    view = Transaction.table_metadata.fget

    def counting(tx):
        nonlocal built
        built += 1
        return view(tx)

    monkeypatch.setattr(Transaction, "table_metadata", property(counting))
    history = History()
    for i in range(3):
        writer = Writer(log, "w", history)
        writer.send((0, b"a%d" % i), (1, b"b%d" % i)).end(commit=True)
        writer.producer.close()
        built = 0
        sync_table(root, TOPIC)
        assert 0 < built <= 3  # an empty view, then one with the snapshot staged
    check_snapshot(root, history, {})
