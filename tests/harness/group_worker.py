"""One consumer-group member process for tests/clients/test_group_membership.py.

    python group_worker.py consume ROOT GROUP NAME OUT_DIR [options as JSON]
    python group_worker.py ctp     ROOT GROUP NAME OUT_DIR [options as JSON]

``consume``: join GROUP on topic ``in``, read what is assigned, append every
record delivered to ``OUT_DIR/NAME.records`` (``partition offset`` lines,
flushed) before committing it, and log each commit that succeeded to
``OUT_DIR/NAME.commits``.  ``ctp``: a consume-transform-produce loop, one
transaction per batch (output to topic ``out``, offsets sent with the
member's generation); if ``OUT_DIR/NAME.stall`` exists when a batch's output
is written, it stops itself (SIGSTOP) before sending the offsets.

With option ``churn`` ([min s, max s]) a member leaves (or, one time in three,
stops heartbeating as if it had crashed) after a random time and joins again as
a new member, until ``OUT_DIR/settle`` exists.

Both print ``MEMBER <id>``, ``OWNED <json>`` on every change of assignment,
and write the owned set to ``OUT_DIR/NAME.owned`` (replaced atomically), so
the test can follow them.  SIGTERM ends the loop and leaves the group.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time

from txlog import CommitFailedError, Log
from txlog.clients.membership import GroupMember


ASSIGNORS = [["range"], ["roundrobin", "range"], ["range", "cooperative-sticky"]]


def main() -> None:
    mode, root, group, name, out_dir = sys.argv[1:6]
    opts = json.loads(sys.argv[6]) if len(sys.argv) > 6 else {}
    log = Log(root)
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    consumer = log.consumer(group_id=group, auto_offset_reset="earliest")

    def write_owned() -> None:
        owned = sorted(member.assignment())
        tmp = os.path.join(out_dir, f".{name}.owned.tmp")
        with open(tmp, "w") as f:
            json.dump({"member_id": member.member_id, "generation": member.generation,
                       "owned": owned}, f)
        os.replace(tmp, os.path.join(out_dir, f"{name}.owned"))
        print("OWNED", json.dumps(owned), flush=True)

    class Listener:
        def on_partitions_revoked(self, revoked):
            if mode == "consume":
                commit([tp for tp in revoked if tp in consumer.assignment()])
            consumer.assign(sorted(member.assignment()))
            write_owned()

        def on_partitions_assigned(self, assigned):
            consumer.assign(sorted(member.assignment()))
            write_owned()

    rng = random.Random()

    def new_member(assignors) -> GroupMember:
        return GroupMember(log, group, ["in"], assignors=assignors,
                           session_timeout_ms=opts.get("session_timeout_ms", 1500),
                           heartbeat_interval_ms=opts.get("heartbeat_interval_ms", 300),
                           max_poll_interval_ms=opts.get("max_poll_interval_ms", 3000),
                           client_id=name, listener=Listener())

    member = new_member(opts.get("assignors", ["range"]))
    churn = opts.get("churn")  # [min s, max s]: leave and join again after that long
    leave_at = time.monotonic() + rng.uniform(*churn) if churn else None
    records_file = open(os.path.join(out_dir, f"{name}.records"), "a")
    commits_file = open(os.path.join(out_dir, f"{name}.commits"), "a")

    def commit(parts):
        offsets = {tp: consumer.position(*tp) for tp in parts}
        if not offsets:
            return
        try:
            member.commit(offsets)
        except CommitFailedError as exc:
            print("COMMIT-REFUSED", exc, flush=True)
            return
        commits_file.write(json.dumps([[t, p, o] for (t, p), o in offsets.items()]) + "\n")
        commits_file.flush()

    producer = None
    if mode == "ctp":
        producer = log.producer(transactional_id=f"ctp-{name}", transaction_timeout_ms=60000)
        producer.init_transactions()
    batch = opts.get("batch", 10)
    pause = opts.get("pause_s", 0.05)
    announced = None
    while not stop:
        if leave_at is not None and time.monotonic() > leave_at and \
                not os.path.exists(os.path.join(out_dir, "settle")):
            if rng.random() < 0.3:
                member._stop.set()  # as if it crashed: no leave, the others expire it
                print("ABANDONED", member.member_id, flush=True)
            else:
                member.close()  # revokes (commits) and leaves
            consumer.assign([])
            member = new_member(rng.choice(ASSIGNORS))
            leave_at = time.monotonic() + rng.uniform(*churn)
        member.poll()
        if member.member_id != announced:
            announced = member.member_id
            print("MEMBER", announced, flush=True)
        records = consumer.poll(batch)
        if not records:
            time.sleep(pause)
            continue
        if mode == "consume":
            records_file.write("".join(f"{r.partition} {r.offset}\n" for r in records))
            records_file.flush()
            commit(sorted(consumer.assignment()))
        else:
            generation = member.generation  # what this member believes, as Kafka's groupMetadata()
            producer.begin_transaction()
            for r in records:
                producer.send("out", f"{r.partition}:{r.offset}".encode(), partition=r.partition)
            producer.flush()
            if os.path.exists(os.path.join(out_dir, f"{name}.stall")):
                os.remove(os.path.join(out_dir, f"{name}.stall"))
                print("STALLING", json.dumps(sorted({(r.partition, r.offset) for r in records})),
                      flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
                print("WOKE", flush=True)
                woke = True
            else:
                woke = False
            offsets = {tp: consumer.position(*tp) for tp in consumer.assignment()}
            try:
                producer.send_offsets_to_transaction(offsets, group, member_id=member.member_id,
                                                     generation=generation)
                producer.commit_transaction()
                if woke:
                    print("COMMITTED-AFTER-STALL", flush=True)
            except CommitFailedError as exc:
                print("REFUSED", exc, flush=True)
                producer.abort_transaction()
                # Its positions are past the aborted batch: start again from the group.
                consumer.assign([])
                consumer.assign(sorted(member.assignment()))
                continue
        time.sleep(pause)
    member.close()
    if producer is not None:
        producer.close()
    print("EXIT", flush=True)


if __name__ == "__main__":
    main()
