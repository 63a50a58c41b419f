"""A table's layout and upkeep: partitioned files, compaction, purge, expiry.

Each rewrite is checked against what the table held before it (every row, by
a checksum over every column) and against the offsets its snapshots cover;
races are made deterministic with the writers' pause hooks.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import pyarrow as pa
import pytest

from txlog.errors import CommitFailedError, InvalidConfigError, OffsetOutOfRangeError
from txlog.root.root import Root
from txlog.storage.paths import table_dir, table_pointer_dir

pytest.importorskip("pyiceberg", reason="needs the tables extra: pip install -e '.[tables]'")

from pyiceberg.manifest import ManifestContent  # noqa: E402

from txlog.tables import layout  # noqa: E402
from txlog.tables.catalog import RootCatalog, table_identifier  # noqa: E402
from txlog.tables.expiry import expire_table  # noqa: E402
from txlog.tables.sync import OFFSETS_KEY, TOPIC_ID_KEY, covered, sync_table  # noqa: E402
from txlog.tables.upkeep import PURGED_KEY, compact_table, purge_table  # noqa: E402

TOPIC = "events"
HOUR_MS = 3600 * 1000
T0 = 1_700_000_000_000 // HOUR_MS * HOUR_MS  # the start of an hour


def load(root: Root):
    return RootCatalog(root.storage).load_table(table_identifier(TOPIC))


def rows(root: Root) -> pa.Table:
    """The newest snapshot's rows in (partition, offset) order; each key once."""
    scanned = load(root).scan().to_arrow().sort_by([("partition", "ascending"),
                                                    ("offset", "ascending")])
    keys = list(zip(scanned["partition"].to_pylist(), scanned["offset"].to_pylist()))
    assert len(keys) == len(set(keys)), "a record in the table twice"
    return scanned


def checksum(table: pa.Table) -> str:
    """Over every column of every row (Arrow IPC of the sorted rows)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


def data_files(root: Root) -> list:
    return [t.file for t in load(root).scan().plan_files()]


def produce(log, partitions: int, per_partition: int, hour: int = 0) -> None:
    producer = log.producer()
    for p in range(partitions):
        for i in range(per_partition):
            producer.send(TOPIC, b"v%d-%d" % (p, i), key=b"k%d" % i, partition=p,
                          headers=[("h", b"%d" % i)], timestamp_ms=T0 + hour * HOUR_MS + i)
    producer.close()


def synced_in_pieces(log, tmp_path, syncs: int, partitions: int = 2) -> Root:
    """A table built by ``syncs`` syncs of a few records each: small files."""
    log.create_topic(TOPIC, partitions=partitions)
    root = Root(tmp_path / "log")
    for _ in range(syncs):
        produce(log, partitions, 3)
        sync_table(root, TOPIC)
    return root


def test_a_sync_writes_a_file_per_partition_and_time_bucket_of_the_target_size(log, tmp_path):
    log.create_topic(TOPIC, partitions=2, config={"txlog.table.time-bucket": "hour"})
    for hour in (0, 1):
        produce(log, 2, 40, hour)
    root = Root(tmp_path / "log")
    first = sync_table(root, TOPIC)
    assert layout.time_bucket(load(root)) == "hour"
    buckets = {(f.partition[0], f.partition[1]) for f in data_files(root)}
    hour0 = T0 // HOUR_MS
    assert buckets == {(p, h) for p in (0, 1) for h in (hour0, hour0 + 1)}
    assert len(first.files) == 4
    for f in data_files(root):  # every row of a file lies in the file's partition and hour
        got = load(root).scan(row_filter=f"partition = {f.partition[0]}").to_arrow()
        assert set(got["partition"].to_pylist()) == {f.partition[0]}
    # A smaller target: the next sync splits each bucket's records into several files.
    table = load(root)
    with table.transaction() as tx:
        tx.set_properties({"write.target-file-size-bytes": "2000"})
    produce(log, 2, 40, 2)
    second = sync_table(root, TOPIC)
    assert len(second.files) > 2
    sizes = [f.record_count for f in data_files(root) if f.partition[1] == hour0 + 2]
    assert sum(sizes) == 80 and max(sizes) < 40


def test_a_table_keeps_its_spec_and_a_changed_bucket_is_refused(log, tmp_path):
    log.create_topic(TOPIC, partitions=1)
    produce(log, 1, 3)
    root = Root(tmp_path / "log")
    sync_table(root, TOPIC)
    assert layout.time_bucket(load(root)) == "day"  # the default
    log.alter_topic_config(TOPIC, set={"txlog.table.time-bucket": "hour"})
    with pytest.raises(InvalidConfigError, match="created with day"):
        sync_table(Root(tmp_path / "log"), TOPIC)
    log.alter_topic_config(TOPIC, delete=["txlog.table.time-bucket"])
    produce(log, 1, 3)
    assert sync_table(Root(tmp_path / "log"), TOPIC).records == 3


def test_syncs_merge_the_tables_manifests(log, tmp_path):
    """pyiceberg's merge-append, on for new tables: the manifests stay few."""
    root = synced_in_pieces(log, tmp_path, 1, partitions=1)
    with load(root).transaction() as tx:
        tx.set_properties({"commit.manifest.min-count-to-merge": "3"})
    for _ in range(4):
        produce(log, 1, 2)
        sync_table(root, TOPIC)
    table = load(root)
    manifests = table.current_snapshot().manifests(table.io)
    assert len(manifests) < 3, len(manifests)  # five syncs, each an added manifest
    assert rows(root).num_rows == 11


def test_an_unpartitioned_table_of_before_specs_keeps_working(log, tmp_path, monkeypatch):
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC

    def old_layout(desc, columns=None):
        schema, _, _ = layout.new_table(desc, columns)
        return schema, UNPARTITIONED_PARTITION_SPEC, {}

    import txlog.tables.sync as sync

    monkeypatch.setattr(sync, "new_table", old_layout)
    root = synced_in_pieces(log, tmp_path, 3)
    monkeypatch.undo()
    produce(log, 2, 3)
    sync_table(root, TOPIC)
    assert load(root).spec().is_unpartitioned() and len(data_files(root)) == 4
    before = rows(root)
    done = compact_table(root, TOPIC, min_files=2)
    assert len(done.removed) == 4 and len(data_files(root)) == 1
    # and its syncs merge manifests from now on
    assert load(root).metadata.properties["commit.manifest-merge.enabled"] == "true"
    assert checksum(rows(root)) == checksum(before)


def test_compaction_rewrites_small_files_with_the_rows_and_offsets_unchanged(log, tmp_path):
    root = synced_in_pieces(log, tmp_path, 4)
    before, files = rows(root), data_files(root)
    held = load(root).current_snapshot().summary
    done = compact_table(root, TOPIC, min_files=2)
    assert len(files) == 8 and len(data_files(root)) == 2  # one per partition (and day)
    assert done.records == done.kept == before.num_rows == 24
    assert checksum(rows(root)) == checksum(before)
    summary = load(root).current_snapshot().summary
    assert (summary[OFFSETS_KEY], summary[TOPIC_ID_KEY]) == (held[OFFSETS_KEY], held[TOPIC_ID_KEY])
    assert compact_table(root, TOPIC, min_files=2).snapshot_id is None  # nothing small left
    # The next sync starts at the offsets the compaction carried: nothing twice.
    produce(log, 2, 3)
    assert sync_table(root, TOPIC).records == 6
    assert rows(root).num_rows == 30


@pytest.mark.parametrize("pinned, retries, isolation, twice", [
    (True, 0, "serializable", False),   # as built
    (True, 4, "snapshot", False),       # pyiceberg's retry and weak isolation: the pin holds
    (False, 4, "snapshot", True),       # none of them: stale offsets land on the sync's
])
def test_a_compaction_racing_a_sync_loses_nothing_and_duplicates_nothing(
        log, tmp_path, monkeypatch, pinned, retries, isolation, twice):
    """The compaction's commit waits while a sync commits: refused, it plans again.  Were
    it re-applied onto the sync's snapshot, it would carry the older offsets there, and
    the next sync would append the first sync's records again."""
    import txlog.tables.upkeep as upkeep

    root = synced_in_pieces(log, tmp_path, 2)
    with load(root).transaction() as tx:
        tx.set_properties({"commit.retry.num-retries": str(retries),
                           "commit.retry.min-wait-ms": "0",
                           "write.delete.isolation-level": isolation})
    if not pinned:
        monkeypatch.setattr(upkeep, "RootCatalog",
                            lambda storage, pinned=None: RootCatalog(storage))
    other = Root(tmp_path / "log")

    def pause(step: str) -> None:
        if not synced:
            produce(log, 2, 3)
            synced.append(sync_table(other, TOPIC))

    synced: list = []
    done = compact_table(root, TOPIC, min_files=2, pause=pause)
    produce(log, 2, 3)
    sync_table(root, TOPIC)  # from the offsets the newest snapshot says it covers
    if twice:
        with pytest.raises(AssertionError, match="twice"):
            rows(root)
        return
    assert done.conflicts == 1
    table = rows(root)
    assert table.num_rows == 24 == sum(log.end_offset(TOPIC, p) for p in range(2))
    assert table["offset"].to_pylist() == [o for _ in range(2) for o in range(12)]


def test_a_sync_racing_a_compaction_starts_again_from_the_same_offsets(log, tmp_path):
    root = synced_in_pieces(log, tmp_path, 2)
    produce(log, 2, 3)
    compacted: list = []

    def pause(step: str, partition: int | None) -> None:
        if step == "commit" and not compacted:
            compacted.append(compact_table(Root(tmp_path / "log"), TOPIC, min_files=2))

    result = sync_table(root, TOPIC, pause)
    assert result.conflicts == 1 and compacted[0].snapshot_id is not None
    assert rows(root).num_rows == 18 and result.records == 6


def test_purge_rewrites_files_and_leaves_exactly_the_rest(log, tmp_path):
    root = synced_in_pieces(log, tmp_path, 3)
    before = rows(root)
    held = load(root).current_snapshot().summary[OFFSETS_KEY]
    with pytest.raises(OffsetOutOfRangeError, match="below 9"):
        purge_table(root, TOPIC, {0: 10})
    done = purge_table(root, TOPIC, {0: 4, 1: 9})
    after = rows(root)
    keep = [(p, o) for p, o in zip(before["partition"].to_pylist(), before["offset"].to_pylist())
            if o >= {0: 4, 1: 9}[p]]
    assert list(zip(after["partition"].to_pylist(), after["offset"].to_pylist())) == keep
    assert checksum(after) == checksum(before.filter(pa.array(
        [o >= {0: 4, 1: 9}[p] for p, o in zip(before["partition"].to_pylist(),
                                                before["offset"].to_pylist())])))
    assert done.records - done.kept == 13
    snapshot = load(root).current_snapshot()
    assert snapshot.summary[OFFSETS_KEY] == held
    assert json.loads(snapshot.summary[PURGED_KEY]) == {"0": 4, "1": 9}
    table = load(root)
    for manifest in snapshot.manifests(table.io):  # never a delete file
        assert manifest.content == ManifestContent.DATA
    assert all(not t.delete_files for t in table.scan().plan_files())
    produce(log, 2, 3)  # the next sync does not bring the purged records back
    sync_table(root, TOPIC)
    assert rows(root).num_rows == len(keep) + 6


def age(root: Root, path: str, seconds: float) -> None:
    """Set a file's creation time as the store sees it (local disk: its mtime)."""
    full = os.path.join(root.storage.url.removeprefix("file://"), path)
    os.utime(full, (time.time() + seconds, time.time() + seconds))


def all_files(root: Root) -> set[str]:
    return {f"{table_dir(TOPIC)}/{d}/{n}" for d in ("data", "metadata")
            for n in root.storage.list(f"{table_dir(TOPIC)}/{d}")}


def test_expiry_removes_old_snapshots_their_files_and_old_orphans_only(log, tmp_path):
    root = synced_in_pieces(log, tmp_path, 3)
    compact_table(root, TOPIC, min_files=2)
    before = rows(root)
    old_orphan, young_orphan = (f"{table_dir(TOPIC)}/data/{n}.parquet" for n in ("a", "b"))
    for path in (old_orphan, young_orphan):
        root.storage.publish_if_absent(path, b"a sync that died")
    # An hour's bound seen two hours from now: every snapshot but the newest, and every file
    # written so far, is old; the young orphan was written (as the store says) since.
    age(root, young_orphan, 2 * 3600 - 60)
    done = expire_table(root, TOPIC, age_s=3600, now_ms=int(time.time() * 1000) + 2 * HOUR_MS)
    table = load(root)
    assert [s.snapshot_id for s in table.snapshots()] == [table.current_snapshot().snapshot_id]
    assert len(done.snapshots) == 3  # three syncs; the compaction is the newest
    assert old_orphan in done.files and young_orphan not in done.files
    named = {RootCatalog(root.storage).relative(f.file_path) for f in data_files(root)}
    assert all_files(root) >= named | {young_orphan}
    assert all(p.endswith(".parquet") or "metadata" in p for p in done.files)
    assert len(root.storage.list(f"{table_dir(TOPIC)}/data")) == len(named) + 1
    assert len(root.storage.list(table_pointer_dir(TOPIC))) == 1  # the newest version only
    assert checksum(rows(root)) == checksum(before)  # every file the newest names is there
    produce(log, 2, 3)
    assert sync_table(Root(tmp_path / "log"), TOPIC).records == 6


def test_an_expiry_age_inside_the_writers_commit_window_is_refused(log, tmp_path):
    """A bound shorter than the window would take a sync's uncommitted files for orphans,
    whether an argument or the table's property sets it."""
    root = synced_in_pieces(log, tmp_path, 1)
    with pytest.raises(InvalidConfigError, match="age_s: 60000 ms"):
        expire_table(root, TOPIC, age_s=60)
    with load(root).transaction() as tx:
        tx.set_properties({layout.MAX_SNAPSHOT_AGE_KEY: "60000"})
    files = all_files(root)
    with pytest.raises(InvalidConfigError, match=layout.MAX_SNAPSHOT_AGE_KEY):
        expire_table(root, TOPIC, now_ms=int(time.time() * 1000) + 2 * HOUR_MS)
    assert all_files(root) == files


def test_snapshots_past_the_count_go_young_but_their_files_stay_for_the_bound(log, tmp_path):
    """At most txlog.expire.max-snapshots stay in the metadata, however young, so that an
    append's cost does not grow with the table's history, and as many pointer versions;
    the files only they named are old by their creation (as a compaction's inputs are)
    yet a reader may hold them, so the retired records keep them for the bound from the
    expiry."""
    root = synced_in_pieces(log, tmp_path, 4)
    compact_table(root, TOPIC, min_files=2)
    with load(root).transaction() as tx:
        tx.set_properties({layout.MAX_SNAPSHOTS_KEY: "2"})
    before = rows(root)
    replaced = all_files(root) - {RootCatalog(root.storage).relative(f.file_path)
                                  for f in data_files(root)}
    for path in all_files(root):
        age(root, path, -2 * 3600)  # written two hours ago: old by their creation
    done = expire_table(root, TOPIC)
    assert len(load(root).snapshots()) == 2 and len(done.snapshots) == 3  # of 4 syncs + 1
    assert done.files == () and all_files(root) >= replaced  # metadata files included
    assert len(root.storage.list(table_pointer_dir(TOPIC))) == 2  # pointer versions too
    assert root.storage.list(f"{table_dir(TOPIC)}/retired")
    later = expire_table(root, TOPIC, now_ms=int(time.time() * 1000) + 2 * HOUR_MS)
    old_data = {p for p in replaced if "/data/" in p}
    assert old_data and old_data <= set(later.files)
    assert root.storage.list(f"{table_dir(TOPIC)}/retired") == []
    assert checksum(rows(root)) == checksum(before)


def test_expiry_keeps_a_snapshot_until_its_successor_is_older_than_the_bound(log, tmp_path):
    """A reader may hold a snapshot for as long as it was the newest, plus the bound."""
    root = synced_in_pieces(log, tmp_path, 2)
    first, second = sorted(load(root).snapshots(), key=lambda s: s.sequence_number)
    assert second.timestamp_ms >= first.timestamp_ms + 2
    middle = (first.timestamp_ms + second.timestamp_ms) // 2
    done = expire_table(root, TOPIC, age_s=3600, now_ms=middle + HOUR_MS)
    assert done.snapshots == () and len(load(root).snapshots()) == 2
    # Only the metadata file of the empty table went: the first sync replaced it before.
    assert [f.rpartition("/")[2][:5] for f in done.files] == ["00000"]


def test_expiry_never_removes_the_files_of_a_sync_in_progress(log, tmp_path):
    root = synced_in_pieces(log, tmp_path, 1)
    produce(log, 2, 3)
    expired: list = []

    def pause(step: str, partition: int | None) -> None:
        if step == "commit" and not expired:  # its data files written, not yet committed
            expired.append(expire_table(Root(tmp_path / "log"), TOPIC, age_s=3600))

    result = sync_table(root, TOPIC, pause)
    assert expired[0].files == () and result.conflicts == 0
    assert rows(root).num_rows == 12


def test_a_commit_after_its_window_is_refused_and_its_files_withdrawn(log, tmp_path,
                                                                      monkeypatch):
    root = synced_in_pieces(log, tmp_path, 2)
    files = all_files(root)
    produce(log, 2, 3)
    import txlog.tables.sync as sync
    import txlog.tables.upkeep as upkeep

    monkeypatch.setattr(layout, "COMMIT_WINDOW_S", -1.0)  # every commit comes too late
    monkeypatch.setattr(sync, "MAX_ATTEMPTS", 2)
    monkeypatch.setattr(upkeep, "MAX_ATTEMPTS", 2)
    with pytest.raises(CommitFailedError):
        sync_table(root, TOPIC)
    with pytest.raises(CommitFailedError):
        compact_table(root, TOPIC, min_files=1)
    assert {p for p in all_files(root) if "/data/" in p} == {p for p in files if "/data/" in p}
    assert covered(load(root)).offsets == {0: 6, 1: 6}


def test_compaction_across_an_added_value_field_reads_old_rows_with_it_null(log, tmp_path):
    """Typed values: the files before and after a field was added are rewritten together
    in the table's current schema, the old row's new field null."""
    def schema(fields: dict) -> dict:
        return {"txlog.value.format": "json", "txlog.value.schema": json.dumps(fields)}

    log.create_topic(TOPIC, partitions=1, config=schema({"id": "long"}))
    root = Root(tmp_path / "log")
    producer = log.producer()
    producer.send(TOPIC, b'{"id": 1, "n": 5}', partition=0).get()
    sync_table(root, TOPIC)
    log.alter_topic_config(TOPIC, set=schema({"id": "long", "n": "int"}))
    producer.send(TOPIC, b'{"id": 2, "n": 6}', partition=0).get()
    producer.close()
    sync_table(root, TOPIC)
    before = rows(root)
    done = compact_table(root, TOPIC, min_files=2)
    assert len(done.removed) == 2 and len(data_files(root)) == 1
    assert checksum(rows(root)) == checksum(before)
    assert rows(root)["value_fields"].to_pylist() == [{"id": 1, "n": None}, {"id": 2, "n": 6}]



def test_compaction_leaves_a_large_file_until_the_newer_ones_are_half_its_size(log, tmp_path):
    """A partition's compacted file is still small (below three quarters of the target),
    but is not rewritten with every batch of new small files: only once they add up to
    half its size.  Fails with every small file rewritten each time (the growing file
    written again by each compaction)."""
    log.create_topic(TOPIC, partitions=1)
    root = Root(tmp_path / "log")

    def synced(records: int) -> None:
        producer = log.producer()
        for _ in range(records):
            producer.send(TOPIC, os.urandom(100), partition=0)
        producer.close()
        sync_table(root, TOPIC)

    synced(1000)
    [large] = data_files(root)
    for _ in range(6):
        synced(3)
        synced(3)
        compact_table(root, TOPIC, min_files=2)
        newer = [f for f in data_files(root) if f.file_path != large.file_path]
        assert large.file_path in {f.file_path for f in data_files(root)}
        assert len(newer) == 1  # the new small files merged, the large one left as it is
    before = rows(root)
    synced(600)  # the newer files now hold more than half the large one's bytes
    done = compact_table(root, TOPIC, min_files=2)
    assert len(data_files(root)) == 1 and any(large.file_path.endswith(p) for p in done.removed)
    assert rows(root).num_rows == before.num_rows + 600


def test_compaction_writes_each_stretch_of_offsets_into_one_file(log, tmp_path):
    """Runs of small files are taken in offset order, so a purge finds a stretch of
    offsets in few files."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import LongType

    root = synced_in_pieces(log, tmp_path, 6, partitions=1)
    size = max(f.file_size_in_bytes for f in data_files(root))
    done = compact_table(root, TOPIC, min_files=2, target_bytes=int(size * 2.2))
    assert len(done.removed) == 6 and len(done.added) == 3  # three runs of two files
    field = load(root).schema().find_field("offset").field_id
    ranges = sorted((from_bytes(LongType(), f.lower_bounds[field]),
                     from_bytes(LongType(), f.upper_bounds[field])) for f in data_files(root))
    assert ranges == [(0, 5), (6, 11), (12, 17)]
