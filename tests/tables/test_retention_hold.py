"""txlog.table.hold-retention: retention's rules never delete what the table lacks."""

from __future__ import annotations

import pytest

from txlog import Log
from txlog.errors import InvalidConfigError
from txlog.root.root import Root

pytest.importorskip("pyiceberg", reason="needs the tables extra: pip install -e '.[tables]'")

from txlog.tables.sync import sync_table  # noqa: E402

TOPIC = "events"


def _write_segments(log: Log, values: range) -> None:
    producer = log.producer(compression="none")
    for i in values:
        producer.send(TOPIC, b"v%04d" % i + b"x" * 200, partition=0)
        producer.flush()  # a batch each: several segments of 1 KiB
    producer.close()
    log.compact(TOPIC)


@pytest.mark.parametrize("hold", [True, False])
def test_retention_keeps_the_segments_the_table_has_not_taken(tmp_path, hold):
    log = Log(tmp_path / "log", fsync=False)
    log.create_topic(TOPIC, 1, {"segment.bytes": 1024, "retention.ms": 0,
                                "txlog.table.hold-retention": str(hold).lower()})
    _write_segments(log, range(20))
    if hold:  # no table yet: nothing is taken, so nothing goes
        assert log.apply_retention(TOPIC)[0].segments_deleted == 0
    synced = sync_table(Root(tmp_path / "log"), TOPIC).offsets[0]
    _write_segments(log, range(20, 40))
    done = log.apply_retention(TOPIC)[0]
    assert done.segments_deleted > 0
    if hold:  # every record past the table's offsets is still there for the next sync
        assert done.log_start <= synced
        assert log.read(TOPIC, 0, start=synced).num_rows == log.end_offset(TOPIC, 0) - synced
        assert sync_table(Root(tmp_path / "log"), TOPIC).skipped == {}
    else:  # the rules alone delete past it: the next sync reports the loss
        assert done.log_start > synced
        assert sync_table(Root(tmp_path / "log"), TOPIC).skipped == {0: (synced, done.log_start)}


def test_a_hold_is_a_boolean(tmp_path):
    log = Log(tmp_path / "log")
    with pytest.raises(InvalidConfigError, match="txlog.table.hold-retention"):
        log.create_topic(TOPIC, 1, {"txlog.table.hold-retention": "yes"})
