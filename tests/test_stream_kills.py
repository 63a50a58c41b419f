"""The exactly-once test of the streaming pipeline: SIGKILL its driver at least 10 times.

See stream_kill_harness.py; run it directly with ``--kills`` and ``--records``
for longer runs.  The at-least-once run shows that the check catches
duplicates, so a pass of the exactly-once run means something; it needs
showing once, not in every CI run, so it runs with TXLOG_LARGE=1.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

import stream_kill_harness as harness  # noqa: E402
from conftest import LARGE  # noqa: E402
from txlog.examples.stream_pipeline import exactly_once  # noqa: E402


def test_exactly_once_survives_repeated_driver_kills(tmp_path):
    # 10,000 readings (about 100 transactions, a fifth aborted, spread over the
    # kills) give every restart input to read and leave the check thousands of
    # committed readings to match; more only lengthens the run (the JVM starts
    # dominate it).  The harness's command line runs larger ones.
    report = harness.run(str(tmp_path / "log"), kills=10, records=10_000,
                         delivery="exactly_once", seed=20261123,
                         log_path=str(tmp_path / "spark.log"))
    assert report["kills"] == 10
    assert report["final run exit code"] == 0, (tmp_path / "spark.log").read_text()[-5000:]
    assert report["committed readings"] > 5_000
    assert exactly_once(report), report


@LARGE
def test_the_same_kills_duplicate_records_at_least_once(tmp_path):
    report = harness.run(str(tmp_path / "log"), kills=5, records=5_000,
                         delivery="at_least_once", seed=7, stop_at_first_duplicate=True,
                         log_path=str(tmp_path / "spark.log"), every_kill_after_a_write=True)
    assert report["duplicated"] > 0, report
    assert report["missing"] == 0  # at least once: nothing lost either
    assert not exactly_once(report)
