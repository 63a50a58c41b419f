"""The stream sink never skips silently, and failed jobs end cleanly: what users run, as
subprocesses (spark-submit applications in tests/harness/spark_jobs.py)."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

pytest.importorskip("pyspark")

from conftest import HARNESS_DIR, spark_submit  # noqa: E402

JOBS = HARNESS_DIR / "spark_jobs.py"
FAULTS = HARNESS_DIR / "faults"


def results(stdout: str) -> dict[str, dict]:
    """The ``name: {json}`` lines an application printed."""
    found = {}
    for line in stdout.splitlines():
        name, sep, rest = line.partition(": ")
        if sep and rest.startswith("{"):
            found[name] = json.loads(rest)
    return found


@pytest.fixture(scope="module")
def sink_safety(tmp_path_factory) -> dict[str, dict]:
    scratch = tmp_path_factory.mktemp("sink-safety")
    faults = scratch / "faults"
    faults.mkdir()
    done = spark_submit(JOBS, "sink-safety", str(scratch / "log"), str(scratch), timeout=600,
                        env={"TXLOG_TEST_MARKER_FAULTS": str(faults),
                             "PYTHONPATH": os.pathsep.join(
                                 [str(FAULTS), os.environ.get("PYTHONPATH", "")])})
    found = results(done.stdout)
    assert set(found) == {"two-queries", "reset-latest", "reset-earliest", "failing-batch",
                          "once", "always"}, done.stdout[-3000:] + done.stderr[-3000:]
    return found


def test_a_second_query_with_the_prefix_fails_and_the_first_loses_nothing(sink_safety):
    r = sink_safety["two-queries"]
    error = r["b_error"]
    assert error is not None, "the second query ran on (and skipped its batches)"
    assert "SinkOwnerError" in error and r["a_query"] in error and r["b_query"] in error
    assert "takeOverFrom" in error
    assert r["a_error"] is None
    # Every record query A was fed, exactly once; nothing of B's.
    assert r["out"] == sorted(f"a{i}" for i in range(400))


@pytest.mark.parametrize("starting", ["latest", "earliest"])
def test_a_reset_checkpoint_loses_no_new_record(sink_safety, starting):
    r = sink_safety[f"reset-{starting}"]
    refused = r["refused"]
    assert refused is not None, "the restarted query ran on under the old query's batch ids"
    assert r["first_query"] in refused and r["new_query"] in refused
    assert f"takeOverFrom={r['first_query']}" in refused
    assert r["written_while_refused"] == 0
    assert r["take_over_error"] is None
    out = Counter(r["out"])
    new = r["new"]
    assert new and all(out[v] == 1 for v in new), \
        f"new records lost or repeated: {sorted(v for v in new if out[v] != 1)}"
    # What the take-over means for records the old query wrote (docs/spark.md):
    # read again from the earliest offset, they are written again.
    again = 2 if starting == "earliest" else 1
    assert all(out[v] == again for v in r["old"])
    assert sum(out.values()) == len(new) + again * len(r["old"])


def test_a_micro_batch_failing_in_every_attempt_holds_no_partition(sink_safety):
    r = sink_safety["failing-batch"]
    assert r["error"] is not None and "99" in r["error"]
    assert r["written"] > 0  # the attempts did write before they failed
    for lso, end in r["lso_and_end"]:
        assert lso == end, r["lso_and_end"]
    # Another producer's commit is visible at once; nothing of the failed batch is.
    assert r["visible"] == sorted(f"other{i}" for i in range(10))


def test_a_batch_commit_whose_markers_fail_is_committed_and_rolled_forward(sink_safety):
    once, always = sink_safety["once"], sink_safety["always"]
    # The job returns at its COMMIT decision: marker writes failing behind it, once or
    # on every retry until they work again, do not fail it (its records are committed
    # from the decision on, and a job reported failed would be run again: duplicates).
    assert once["marker_failures"] == 1 and once["error"] is None
    assert always["marker_failures"] >= 2 and always["error"] is None
    # Every record is read once, and once rolled forward nothing holds a partition.
    assert once["read"] == always["read"] == 1_000
    for lso, end in once["lso_and_end"] + always["lso_and_end"]:
        assert lso == end