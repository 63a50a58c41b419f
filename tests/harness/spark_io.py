"""Reading and writing a txlog root through Spark with options as keyword arguments,
for the Spark test files (driver-side only: nothing here runs in a task)."""

from __future__ import annotations

from txlog.transactions.metadata import TxnState


def read(spark, root, **options):
    reader = spark.read.format("txlog").option("path", str(root))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def write(df, root, **options):
    writer = df.write.format("txlog").mode("append").option("path", str(root))
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def hanging(log):
    """Transactional ids whose transaction nobody decided (what `txlog transactions` flags).

    A job's commit returns at its decision and its roll-forward follows (it may still be
    running in the driver): a decided transaction is rolled forward first, as any reader
    or writer would, so that only an undecided one counts."""
    done = (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
    states = [(t, log.coordinator.complete(t)) for t in log.coordinator.transactional_ids()]
    return [t for t, meta in states if meta is not None and meta.state not in done]
