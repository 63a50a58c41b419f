"""DeleteRecords: a recorded log start offset, in the core and through ``txlog delete-records``.

Expected offsets come from what the test wrote with the library, never from
what the command prints.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers_core import fill_one_record_per_batch, segment_files
from txlog import Log
from txlog.errors import OffsetOutOfRangeError, UnknownTopicError
from txlog.partition import reader as reader_module
from txlog.partition.isolation import READ_UNCOMMITTED


def _offsets(log: Log, topic: str, start: int, partition: int = 0,
             isolation_level: str = READ_UNCOMMITTED) -> list[int]:
    return log.read(topic, partition, start, isolation_level=isolation_level) \
        .column("offset").to_pylist()


def _start_records(root: Path, topic: str = "t", partition: int = 0) -> list[str]:
    return sorted(p.name for p in (root / "topics" / topic / str(partition) / "segments")
                  .glob("*.start"))


def test_readers_below_the_log_start_get_offset_out_of_range(tmp_path: Path) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1)
    fill_one_record_per_batch(log, "t", 20)
    assert log.delete_records({("t", 0): 7}) == {("t", 0): 7}
    for reader in (log, Log(tmp_path)):  # this process, and one that never listed before
        assert reader.partition("t", 0).log_start() == 7
        with pytest.raises(OffsetOutOfRangeError, match=r"offset 3 .*t-0 \(valid: 7 to 20\)"):
            reader.read("t", 0, 3)
        assert _offsets(reader, "t", 7) == list(range(7, 20))
        # Kafka's ListOffsets by time answers at or after the log start
        assert reader.offsets_for_times("t", 0, 0) == (7, 7_000)
        assert reader.offsets_for_times("t", 0, 9_000) == (9, 9_000)
    earliest = log.consumer(auto_offset_reset="earliest")
    earliest.assign([("t", 0)])
    assert earliest.beginning_offsets() == {("t", 0): 7}
    earliest.seek("t", 0, 2)
    assert [r.offset for r in earliest.poll(3)] == [7, 8, 9]
    strict = log.consumer(auto_offset_reset="none")
    strict.assign([("t", 0)])
    strict.seek("t", 0, 2)
    with pytest.raises(OffsetOutOfRangeError, match="offset 2"):
        strict.poll()
    # the log start never moves back; -1 is the log end
    assert log.delete_records({("t", 0): 4}) == {("t", 0): 7}
    assert log.delete_records({("t", 0): -1}) == {("t", 0): 20}
    assert log.read("t", 0, 20).num_rows == 0


def test_a_reader_that_listed_before_sees_the_new_log_start_after_its_refresh(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = Log(tmp_path, fsync=False)
    writer.create_topic("t", 1)
    fill_one_record_per_batch(writer, "t", 10)
    reader = Log(tmp_path)
    assert _offsets(reader, "t", 2) == list(range(2, 10))  # lists the log start: 0
    writer.delete_records({("t", 0): 5})
    monkeypatch.setattr(reader_module, "LOG_START_REFRESH_S", 0.0)
    with pytest.raises(OffsetOutOfRangeError, match="valid: 5 to 10"):
        reader.read("t", 0, 2)
    # an empty read lists nothing, and is refused once the log start is known
    with pytest.raises(OffsetOutOfRangeError):
        reader.read("t", 0, 2, end=2)


def test_bad_offsets_are_refused_and_move_nothing(tmp_path: Path) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 2)
    fill_one_record_per_batch(log, "t", 5)
    with pytest.raises(OffsetOutOfRangeError, match=r"offset 6 for t-0 .*log end offset 5"):
        log.delete_records({("t", 1): 0, ("t", 0): 6})
    with pytest.raises(OffsetOutOfRangeError, match=r"offset -2 for t-0"):
        log.delete_records({("t", 0): -2})
    with pytest.raises(OffsetOutOfRangeError, match=r"offset 3 for t-1 .*log end offset 0"):
        log.delete_records({("t", 0): 3, ("t", 1): 3})
    with pytest.raises(UnknownTopicError):
        log.delete_records({("t", 0): 3, ("nope", 0): 0})
    assert log.partition("t", 0).log_start() == 0 and _start_records(tmp_path) == []
    assert _offsets(log, "t", 0) == list(range(5))


def test_retention_deletes_the_segments_wholly_below_the_log_start(tmp_path: Path) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1, {"segment.bytes": 5000})
    txn = log.producer(transactional_id="tx")
    txn.init_transactions()
    for j in range(30):  # every third transaction aborted: 3 batches each
        txn.begin_transaction()
        for i in range(3):
            txn.send("t", value=f"{j}.{i}".encode(), partition=0)
            txn.flush()
        (txn.abort_transaction if j % 3 == 1 else txn.commit_transaction)()
    committed = log.read("t", 0, 0).column("value").to_pylist()
    log.compact("t")
    heads = [log.partition("t", 0)._cache.segment_head(int(p.name[:20]))
             for p in segment_files(tmp_path, "t", 0)]
    assert len(heads) > 4
    middle = heads[len(heads) // 2]
    cut = middle.base_offset + 1  # inside the middle segment
    log.delete_records({("t", 0): middle.base_offset - 2})
    log.delete_records({("t", 0): cut})
    assert len(_start_records(tmp_path)) == 2
    done = log.apply_retention("t")[0]  # 7 days and no byte limit: only the log start acts
    assert done.segments_deleted == len(heads) // 2 and done.log_start == cut
    assert [int(p.name[:20]) for p in segment_files(tmp_path, "t", 0)] == \
        [h.base_offset for h in heads[len(heads) // 2:]]
    # the records below the largest say nothing any more; the largest stays
    assert _start_records(tmp_path) == [f"{cut:020d}.start"]
    fresh = Log(tmp_path)
    assert fresh.partition("t", 0).log_start() == cut
    values = fresh.read("t", 0, cut).column("value").to_pylist()
    assert values == [v for v in committed if v in set(values)] and values == \
        committed[len(committed) - len(values):]  # no aborted record, none lost after the cut
    # a log start past every segment leaves the newest one (its state carries the log)
    log.delete_records({("t", 0): -1})
    log.apply_retention("t")
    assert [int(p.name[:20]) for p in segment_files(tmp_path, "t", 0)] == [heads[-1].base_offset]
    assert Log(tmp_path).partition("t", 0).end_offset() == 120


def txlog(root: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "txlog.cli", "--root", root, *argv],
                          capture_output=True, text=True, timeout=120)


def test_cli_delete_records(tmp_path: Path) -> None:
    root = str(tmp_path / "log")
    log = Log(root)
    log.create_topic("events", 2)
    fill_one_record_per_batch(log, "events", 10, partition=0)
    fill_one_record_per_batch(log, "events", 4, partition=1)
    plan = tmp_path / "offsets.json"
    plan.write_text(json.dumps({"partitions": [
        {"topic": "events", "partition": 0, "offset": 6},
        {"topic": "events", "partition": 1, "offset": -1}], "version": 1}))
    proc = txlog(root, "delete-records", "--offset-json-file", str(plan), "--json")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line) for line in proc.stdout.splitlines()] == [
        {"topic": "events", "partition": 0, "low_watermark": 6},
        {"topic": "events", "partition": 1, "low_watermark": 4}]
    fresh = Log(root)
    with pytest.raises(OffsetOutOfRangeError):
        fresh.read("events", 0, 5)
    assert _offsets(fresh, "events", 6) == [6, 7, 8, 9]
    described = txlog(root, "topics", "describe", "events", "--json")
    assert [(r["partition"], r["log_start_offset"]) for r in
            json.loads(described.stdout)["partition_offsets"]] == [(0, 6), (1, 4)]
    # TOPIC --offset: all partitions, or --partition; an offset past the end moves nothing
    bad = txlog(root, "delete-records", "events", "--offset", "8")
    assert bad.returncode == 1 and "offset 8 for events-1" in bad.stderr \
        and "log end offset 4" in bad.stderr and bad.stdout == ""
    assert Log(root).partition("events", 0).log_start() == 6
    ok = txlog(root, "delete-records", "events", "--partition", "0", "--offset", "8")
    assert ok.returncode == 0 and ok.stdout.split() == \
        ["TOPIC", "PARTITION", "LOW-WATERMARK", "events", "0", "8"]
    plan.write_text(json.dumps({"partitions": [{"topic": "events", "partition": "0",
                                                "offset": 9}]}))
    bad = txlog(root, "delete-records", "--offset-json-file", str(plan))
    assert bad.returncode == 1 and "entry 0" in bad.stderr and str(plan) in bad.stderr
    missing = txlog(root, "delete-records", "events")
    assert missing.returncode == 1 and "--offset" in missing.stderr
    assert Log(root).partition("events", 0).log_start() == 8


def test_spark_planning_applies_fail_on_data_loss_below_the_log_start(tmp_path: Path) -> None:
    """The Spark source plans against the core's positions: a starting offset below a log
    start delete-records moved fails, or with failOnDataLoss false starts at the log start."""
    from txlog.spark.planning import PositionSpec, plan

    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1)
    fill_one_record_per_batch(log, "t", 10)
    log.delete_records({("t", 0): 4})
    start = PositionSpec("offsets", offsets={("t", 0): 1})
    latest = PositionSpec("latest")
    with pytest.raises(OffsetOutOfRangeError, match=r"starting offset 1 of t-0 .*4 to 10"):
        plan(log.services, [("t", 0)], start, latest)
    [rng] = plan(log.services, [("t", 0)], start, latest, fail_on_data_loss=False)
    assert (rng.start, rng.end) == (4, 10)
    [rng] = plan(log.services, [("t", 0)], PositionSpec("earliest"), latest)
    assert (rng.start, rng.end) == (4, 10)
