"""pyiceberg, Polars and DuckDB read a topic's table as docs/tables.md shows, on local disk
and on S3, and each returns exactly the committed records the newest snapshot covers.

The expectation is twofold: the writers' own history (which (partition, offset)
each committed send was given) for which records, and txlog's read_committed
read pinned to the snapshot's offsets for every value of every column.
"""

from __future__ import annotations

import pytest
from table_readers import TOPIC, build, checksum, engine_reads, keys, typed

from txlog import Log
from txlog.errors import InconsistentTopicIdError
from txlog.root.root import Root
from txlog.tables.readers import newest_snapshot
from txlog.tables.sync import sync_table

pytest.importorskip("pyiceberg", reason="needs the tables extra: pip install -e '.[tables]'")
pytest.importorskip("polars", reason="needs the test extra: pip install -e '.[test]'")
pytest.importorskip("duckdb", reason="needs the test extra: pip install -e '.[test]'")


def check_engines(log: Log, url: str, storage_options: dict, polars_options: dict) -> None:
    syncer = Root(url, storage_options=storage_options, create=False)
    built = build(log, syncer)
    pinned = typed(log.read(TOPIC, start=0, end=built.snapshot, include_headers=True))
    assert 0 < pinned["value_error"].null_count < pinned.num_rows  # typed, and errors kept
    covered = {k for k in built.committed if k[1] < built.snapshot[k[0]]}
    assert keys(pinned) == covered and len(covered) < len(built.committed)  # a tail past it
    for engine, records in engine_reads(url, storage_options, polars_options).items():
        assert keys(records) == covered, engine
        assert checksum(records) == checksum(pinned), engine


@pytest.fixture(autouse=True)
def _quiet_polars(monkeypatch):
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")  # its warning (docs/tables.md)


def test_every_engine_reads_the_snapshots_records_on_local_disk(tmp_path):
    url = str(tmp_path / "log")
    check_engines(Log(url), url, {}, {})


def test_every_engine_reads_the_snapshots_records_on_s3(s3_server, s3_root):
    from s3_server import ACCESS_KEY, REGION, SECRET_KEY

    polars_options = {"s3.endpoint": s3_server.endpoint, "s3.access-key-id": ACCESS_KEY,
                      "s3.secret-access-key": SECRET_KEY, "s3.region": REGION}
    log = Log(s3_root, storage_options=s3_server.storage_options)
    check_engines(log, s3_root, s3_server.storage_options, polars_options)


def test_the_newest_snapshot_goes_on_at_its_offsets_and_new_partitions_at_0(log):
    log.create_topic(TOPIC, partitions=1)
    assert newest_snapshot(log.services, TOPIC).starting_offsets() == {0: 0}  # no table yet
    producer = log.producer()
    producer.send(TOPIC, b"v", partition=0).get()
    producer.close()
    synced = sync_table(log.services, TOPIC)
    log.create_partitions(TOPIC, 2)
    snapshot = newest_snapshot(log.services, TOPIC)
    assert snapshot.metadata_location == synced.metadata_location
    assert snapshot.starting_offsets() == {0: synced.offsets[0], 1: 0} and synced.offsets[0] > 0


def test_the_table_of_a_recreated_topic_is_refused_naming_both_ids(log):
    log.create_topic(TOPIC, partitions=1)
    old = sync_table(log.services, TOPIC).topic_id
    log.delete_topic(TOPIC)
    log.create_topic(TOPIC, partitions=1)
    new = log.describe_topic(TOPIC, refresh=True).topic_id
    with pytest.raises(InconsistentTopicIdError) as refused:
        newest_snapshot(Root(log.services.url, create=False), TOPIC)
    assert TOPIC in str(refused.value) and old in str(refused.value) and new in str(refused.value)
