"""``txlog.spark.read_table``: a topic's table read by Spark's Parquet reader, then the topic.

"Same answer everywhere" (issue 35): read_table, pyiceberg, Polars and DuckDB
return the records of a ``format("txlog")`` read_committed read pinned to the
same end offsets (read_table: the topic's ends, its tail past the snapshot
included; the others: the snapshot's offsets), with the same columns (headers,
and the typed columns the sync's parse gives that read's values), by count and
by a digest over every value of every column.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyiceberg", reason="needs the tables extra: pip install -e '.[tables]'")
pytest.importorskip("polars", reason="needs the test extra: pip install -e '.[test]'")
pytest.importorskip("duckdb", reason="needs the test extra: pip install -e '.[test]'")

from spark_io import read  # noqa: E402
from table_readers import (COLUMNS, TOPIC, build, checksum, engine_reads, keys,  # noqa: E402
                           typed)

from txlog import Log  # noqa: E402
from txlog.errors import InconsistentTopicIdError, InvalidConfigError  # noqa: E402
from txlog.root.root import Root  # noqa: E402
from txlog.spark import read_table, table_starting_offsets  # noqa: E402
from txlog.spark.options import ReadOptions  # noqa: E402
from txlog.spark.reader import arrow_schema, spark_schema  # noqa: E402
from txlog.spark.stream_reader import TxlogStreamReader  # noqa: E402
from txlog.tables.sync import sync_table  # noqa: E402


def pinned(spark, url: str, ends: dict[int, int], include_headers: bool = True):
    """format("txlog") read_committed from offset 0 to exactly ``ends``, as Arrow."""
    positions = {"startingOffsets": json.dumps({TOPIC: {str(p): 0 for p in ends}}),
                 "endingOffsets": json.dumps({TOPIC: {str(p): o for p, o in ends.items()}})}
    return read(spark, url, subscribe=TOPIC, includeHeaders=str(include_headers).lower(),
                **positions).toArrow()


def below(records, offsets: dict[int, int]):
    """The records of ``records`` below ``offsets`` in each partition."""
    import pyarrow.compute as pc

    ends = pc.take(pa.array([offsets[p] for p in range(len(offsets))], pa.int64()),
                   records["partition"])
    return records.filter(pc.less(records["offset"], ends))


def test_same_answer_everywhere(spark, tmp_path, monkeypatch):
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    url = str(tmp_path / "log")
    built = build(Log(url), Root(url, create=False))
    everything = typed(pinned(spark, url, built.ends))  # with the sync's typed columns
    assert keys(everything) == built.committed  # the writers' history, the tail included
    table = read_table(spark, url, TOPIC, includeHeaders="true")
    assert table.columns == COLUMNS.names  # format("txlog")'s in order, then the typed two
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "Asia/Kolkata")  # no timestamp may shift
    try:
        assert checksum(table.toArrow()) == checksum(everything)
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    # The pinned read's records below the snapshot's offsets: what a read pinned there gives.
    snapshot = below(everything, built.snapshot)
    assert 0 < snapshot.num_rows < everything.num_rows
    for engine, records in engine_reads(url, {}, {}).items():
        assert checksum(records) == checksum(snapshot), engine


def test_a_new_partition_is_read_from_0_and_a_recreated_topic_refused(spark, tmp_path):
    url = str(tmp_path / "log")
    log = Log(url)
    log.create_topic(TOPIC, partitions=1)
    producer = log.producer()
    producer.send(TOPIC, b"a", partition=0).get()
    assert read_table(spark, url, TOPIC).count() == 1  # no table yet: the topic
    synced = sync_table(log.services, TOPIC)
    log.create_partitions(TOPIC, 2)
    producer.send(TOPIC, b"b", partition=1).get()
    producer.send(TOPIC, b"c", partition=0).get()
    producer.close()
    start = table_starting_offsets(url, TOPIC)
    assert json.loads(start) == {TOPIC: {"0": synced.offsets[0], "1": 0}}
    options = ReadOptions.parse({"path": url, "subscribe": TOPIC, "startingOffsets": start},
                                streaming=True)
    stream = TxlogStreamReader(options, arrow_schema(options, spark_schema(False)))
    assert stream.initialOffset() == json.loads(start)  # a stream goes on where the table ends
    table = read_table(spark, url, TOPIC)
    assert table.columns == spark_schema(False).fieldNames()  # includeHeaders false: none
    got = table.select("partition", "offset", "value").collect()
    assert sorted((r.partition, r.offset, bytes(r.value)) for r in got) == \
        [(0, 0, b"a"), (0, 1, b"c"), (1, 0, b"b")]
    # Records removed past the snapshot before a sync read them: a loss, as format("txlog")
    # reports it; what the table holds stays (0-0 "a"), though the topic no longer has it.
    log.delete_records({(TOPIC, 0): log.end_offset(TOPIC, 0)})
    lost = f"starting offset {synced.offsets[0]} of {TOPIC}-0 is outside the readable offsets"
    with pytest.raises(Exception, match=lost):  # Spark's wrapper of the source's error
        read_table(spark, url, TOPIC).count()
    kept = read_table(spark, url, TOPIC, failOnDataLoss="false").select("offset", "value")
    assert sorted((r.offset, bytes(r.value)) for r in kept.collect()) == [(0, b"a"), (0, b"b")]
    with pytest.raises(InvalidConfigError, match="startingOffsets"):
        read_table(spark, url, TOPIC, startingOffsets="earliest")
    old = synced.topic_id
    held = read_table(spark, url, TOPIC, failOnDataLoss="false")  # planned at each action
    with pytest.raises(Exception, match="topicIds names 'other'"):
        spark.read.format("txlog").option("path", url).option("subscribe", TOPIC) \
            .option("topicIds", json.dumps({"other": old})).load().collect()
    log.delete_topic(TOPIC)
    log.create_topic(TOPIC, partitions=2)
    producer = log.producer()
    for p in (0, 1):
        producer.send(TOPIC, b"of the new topic", partition=p).get()
    producer.close()
    new = log.describe_topic(TOPIC, refresh=True).topic_id
    with pytest.raises(InconsistentTopicIdError) as refused:
        read_table(spark, url, TOPIC)
    assert TOPIC in str(refused.value) and old in str(refused.value) and new in str(refused.value)
    # A DataFrame made before the re-creation: its tail is refused, not read from the new
    # topic under the old table's offsets.
    with pytest.raises(Exception, match=f"InconsistentTopicIdError.*{new}"):
        held.collect()
