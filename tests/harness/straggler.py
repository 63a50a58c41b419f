"""A task attempt that outlives Spark's kill: started by a Spark task (through
tests/harness/faults/sitecustomize.py) in a session of its own, it goes on after
the task has failed, as a killed task's Python worker does for up to
``spark.python.task.killTimeout`` or a late speculative loser would.

``straggler.py JOB_PICKLE ROOT STORAGE_OPTIONS_JSON KEY TOPIC OUT``: waits until the
job (the pickled SharedTransaction the task held) is decided, rolls its transactions
forward (so that the markers behind the decision are in place before it counts),
then joins the job as participant KEY and sends one record to partition 0 of
TOPIC.  It leaves OUT, a JSON object: the decision, the partitions' end offsets and
read_uncommitted row counts before and after the send, and the send's error.  The
same steps as test_an_attempt_joining_a_decided_job_leaves_nothing_open
(tests/exactly_once/test_shared_transaction.py), in a process Spark started.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time

from txlog import READ_UNCOMMITTED, Log
from txlog.errors import TxlogError

DECISION_TIMEOUT_S = 120.0


def _partitions(log: Log, topic: str) -> list[list[int]]:
    count = log.describe_topic(topic).partitions
    return [[log.end_offset(topic, p), log.read(topic, p, 0, None, READ_UNCOMMITTED).num_rows]
            for p in range(count)]


def main(job_pickle: str, root: str, options_json: str, key: str, topic: str, out: str) -> None:
    with open(job_pickle, "rb") as f:
        job = pickle.load(f)
    log = Log(root, storage_options=json.loads(options_json) or None)
    deadline = time.monotonic() + DECISION_TIMEOUT_S
    while (decision := log.coordinator.decision(job.decision_id)) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job.decision_id} was not decided in {DECISION_TIMEOUT_S}s")
        time.sleep(0.05)
    for txn_id in log.coordinator.transactional_ids():  # the decided job's roll-forward
        if txn_id.startswith(f"{job.prefix}-"):
            log.coordinator.complete(txn_id)
    before = _partitions(log, topic)
    error = None
    producer = job.join(log, key)
    try:
        producer.send(topic, b"straggler", partition=0)
        producer.flush()
    except TxlogError as exc:
        error = f"{type(exc).__name__}: {exc}"
    try:
        producer.close()
    except TxlogError:
        pass  # the send's failure again
    result = {"prefix": job.prefix, "transactional_id": job.transactional_id(key),
              "commit": decision.commit, "before": before, "after": _partitions(log, topic),
              "error": error}
    with open(f"{out}.tmp", "w") as f:
        json.dump(result, f)
    os.replace(f"{out}.tmp", out)  # whole, or not there: the driver waits for it


if __name__ == "__main__":
    main(*sys.argv[1:])
