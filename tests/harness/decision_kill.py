"""A consume-transform-produce committer that SIGKILLs itself between a decision and
its markers, for tests/transactions/test_decision_kill.py.

    python decision_kill.py ROOT RUN HISTORY SEED KILL_PROBABILITY

One run of the committer (transactional id ``c<RUN>``, a new one each run, so
that no InitProducerId of a later run finishes this run's transaction: only
readers and offset fetches meet it).  It takes its positions in topic ``in``
from group ``g`` (a group member taking the partitions over: the consumer's
offset fetch), then loops: one transaction per batch of ``BATCH`` records of
each input partition, each record copied to the same partition of ``out`` as
``<transaction>|<partition>|<input offset>``, the batch's end sent as the
group's offsets, and one transaction in five aborted (its positions are then
fetched again).

The fault hook wraps the coordinator's decision: once the EndTxn decision is
durable, and with probability KILL_PROBABILITY, the process SIGKILLs itself
before returning, so the transaction's markers, group offsets and Complete
version are never written by it.  Before each end the run appends
``<transaction> commit|abort`` to HISTORY (flushed), and ``<transaction>
returned`` once a commit returned.  It exits 0 when the group's offsets
reach the end of ``in``.
"""

from __future__ import annotations

import os
import random
import signal
import sys

from txlog import Log
from txlog.transactions.store import CoordinatorStore

BATCH = 15
PARTITIONS = 2


def install_kill_after_decision(rng: random.Random, probability: float) -> None:
    """The fault hook: maybe die right after an EndTxn decision is durable."""
    decide = CoordinatorStore.decide

    def deciding(self, decision_id, commit, members, reason):  # type: ignore[no-untyped-def]
        decision = decide(self, decision_id, commit, members, reason)
        if reason == "EndTxn" and rng.random() < probability:
            os.kill(os.getpid(), signal.SIGKILL)
        return decision

    CoordinatorStore.decide = deciding  # type: ignore[method-assign]


def main() -> int:
    root, run, history_path, seed, probability = sys.argv[1:6]
    rng = random.Random(int(seed))
    install_kill_after_decision(rng, float(probability))
    log = Log(root)
    tps = [("in", p) for p in range(PARTITIONS)]
    ends = {tp: log.last_stable_offset(*tp) for tp in tps}
    consumer = log.consumer(group_id="g", auto_offset_reset="earliest")
    consumer.assign(tps)
    positions = {tp: consumer.position(*tp) for tp in tps}
    producer = log.producer(transactional_id=f"c{run}")
    producer.init_transactions()
    history = open(history_path, "a")
    n = 0
    while any(positions[tp] < ends[tp] for tp in tps):
        txn = f"{run}.{n}"
        n += 1
        producer.begin_transaction()
        offsets = {}
        for tp in tps:
            start = positions[tp]
            end = min(start + BATCH, ends[tp])
            for offset in range(start, end):
                producer.send("out", f"{txn}|{tp[1]}|{offset}".encode(), partition=tp[1])
            offsets[tp] = end
        producer.send_offsets_to_transaction(offsets, "g")
        commit = rng.random() >= 0.2
        history.write(f"{txn} {'commit' if commit else 'abort'}\n")
        history.flush()
        if commit:
            producer.commit_transaction()
            history.write(f"{txn} returned\n")
            history.flush()
            positions = offsets
        else:
            producer.abort_transaction()
            fresh = log.consumer(group_id="g", auto_offset_reset="earliest")
            fresh.assign(tps)
            positions = {tp: fresh.position(*tp) for tp in tps}
    producer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
