"""The streaming example's exactly-once check and generator, without Spark.

The kill harness and the README's main job trust ``check``: it must count a
duplicate, a loss, a stray record and a reordering, and a second run of the
generator on the same log must not make alerts look duplicated.
"""

from __future__ import annotations

import pyarrow as pa

from txlog import Log
from txlog.examples import stream_pipeline as pipeline


def copy_alerts(log: Log, transform=lambda values: values) -> None:
    """Write the sink as a perfect query would (``transform`` spoils it on purpose)."""
    with log.producer() as producer:
        for p in range(pipeline.PARTITIONS):
            values = pipeline.alert_of(log.read(pipeline.SOURCE, p).column("value")).to_pylist()
            values = transform(values)
            if values:
                producer.send_table(pipeline.SINK, pa.table({"value": pa.array(
                    [v.encode() for v in values], pa.binary())}), partition=p)


def test_generator_runs_twice_without_repeating_a_reading(tmp_path):
    root = str(tmp_path / "log")
    pipeline.generate(root, 500, seed=3, pace_s=0)
    pipeline.generate(root, 500, seed=3, pace_s=0)
    log = Log(root)
    readings = [v for p in range(pipeline.PARTITIONS)
                for v in log.read(pipeline.SOURCE, p).column("value").to_pylist()]
    assert len(readings) == len(set(readings)) > 500  # committed ones of both runs
    copy_alerts(log)
    assert pipeline.exactly_once(pipeline.check(root))


def test_check_counts_every_kind_of_violation(tmp_path):
    root = str(tmp_path / "log")
    pipeline.generate(root, 300, seed=4, pace_s=0)
    log = Log(root)

    def spoil(values):
        if len(values) < 4:
            return values
        # lose the first, repeat the second, add a stray one, swap the last two
        return values[1:2] + values[1:-2] + ["ALERT NOT-A-READING"] + values[-1:] + values[-2:-1]

    copy_alerts(log, spoil)
    report = pipeline.check(root)
    spoiled = sum(1 for p in range(pipeline.PARTITIONS)
                  if log.read(pipeline.SOURCE, p).num_rows >= 4)
    assert spoiled >= 2
    assert report["missing"] == report["duplicated"] == report["unexpected"] == spoiled
    assert report["partitions out of order"] == spoiled
    assert not pipeline.exactly_once(report)
