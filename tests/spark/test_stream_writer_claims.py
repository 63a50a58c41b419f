"""How often the stream writer claims its prefix per micro-batch, without a JVM.

Spark builds the writer for a micro-batch's commit and calls its commit in
the same call of one Python process (python_streaming_sink_runner): the
build's claim is the commit's ownership check (docs/protocol.md 5.1).
"""

from __future__ import annotations

import json
import pickle
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, StructField, StructType

from txlog import Log
from txlog.errors import SinkOwnerError
from txlog.exactly_once.stream_sink import StreamSink
from txlog.spark.options import WriteOptions
from txlog.spark.writer import TxlogCommitMessage, TxlogStreamWriter

SCHEMA = StructType([StructField("value", BinaryType())])


@pytest.fixture
def options(tmp_path: Path) -> WriteOptions:
    root = str(tmp_path / "log")
    Log(root).create_topic("out", 1)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")
    return WriteOptions.parse({"path": root, "topic": "out",
                               "checkpointLocation": str(checkpoint)}, streaming=True)


def task(writer: TxlogStreamWriter, log: Log, values: list[bytes]) -> TxlogCommitMessage:
    """What one task attempt of the micro-batch returns (its write, without Spark's context)."""
    assert writer.job is not None
    producer = writer.job.join(log, "0-0")
    producer.send_table("out", pa.table({"value": values}))
    member = producer.prepare_transaction()
    producer.close()
    return TxlogCommitMessage(member, len(values))


def counting_claims(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    claims: list[str] = []
    claim = StreamSink.claim

    def counted(self: StreamSink, log: Log) -> None:
        claims.append(self.query_id)
        claim(self, log)

    monkeypatch.setattr(StreamSink, "claim", counted)
    return claims


def test_the_commits_writer_claims_once_and_its_commit_does_not_again(
        options: WriteOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    log = Log(options.path)
    claims = counting_claims(monkeypatch)
    for batch in range(3):
        for_tasks = pickle.loads(pickle.dumps(TxlogStreamWriter.create(options, SCHEMA, False)))
        message = task(for_tasks, log, [b"b%d-%d" % (batch, i) for i in range(4)])
        for_commit = TxlogStreamWriter.create(options, SCHEMA, False)
        del claims[:]
        for_commit.commit([message], batch)
        assert claims == []  # before: the commit claimed again, a read (2 requests on S3)
    assert sorted(log.read("out", 0).column("value").to_pylist()) == sorted(
        b"b%d-%d" % (b, i) for b in range(3) for i in range(4))


def test_a_copy_of_the_writer_claims_in_its_commit(
        options: WriteOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy unpickled elsewhere has not claimed: its commit checks for itself."""
    log = Log(options.path)
    writer = TxlogStreamWriter.create(options, SCHEMA, False)
    message = task(writer, log, [b"x"])
    claims = counting_claims(monkeypatch)
    pickle.loads(pickle.dumps(writer)).commit([message], 0)
    assert len(claims) == 1
    assert log.read("out", 0).column("value").to_pylist() == [b"x"]


def test_an_owner_changed_after_the_commits_writer_was_built_is_still_refused(
        options: WriteOptions) -> None:
    """The commit's sink member fences whoever it meets; a take-over between the build
    and the commit is refused by the build's claim only if it came first, as before by
    the commit's own claim: here a copy that has not claimed meets the new owner."""
    log = Log(options.path)
    writer = TxlogStreamWriter.create(options, SCHEMA, False)
    message = task(writer, log, [b"x"])
    assert writer.sink is not None
    StreamSink(writer.sink.prefix, writer.sink.timeout_ms, str(uuid.uuid4()),
               take_over_from=writer.sink.query_id).claim(log)
    with pytest.raises(SinkOwnerError):
        pickle.loads(pickle.dumps(writer)).commit([message], 0)
    assert log.read("out", 0).num_rows == 0
