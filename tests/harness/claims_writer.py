"""One writer process of test_claims.py's kill test (run as a script).

``python claims_writer.py ROOT WRITER MODE ACK_FILE GO_FILE SECONDS``: creates
ACK_FILE.ready, waits for GO_FILE, then writes to partitions 0 and 1 of topic ``t`` for SECONDS:

* MODE ``txn``: transactions of RECORDS records (every third one aborted),
  each record's value ``w<writer>.t<txn>.r<i>.<c|a>|`` plus padding; after a
  commit returns, its values are appended to ACK_FILE;
* MODE ``table``: the same transactions sent as the Spark writer sends them,
  ``send_table(..., wait=False)``, so a full data object is written behind
  while the next is staged (protocol.md 1.1);
* MODE ``idem``: an idempotent producer, RECORDS records per flush, values
  ``w<writer>.s<n>.i|``; each flush's values are acknowledged after it returns.

Every batch is above the inline threshold and the data objects are small,
so every flush writes data objects and claims.  The parent SIGKILLs some
writers at random moments.

With CLAIMS_BREAK=claim-before-data in the environment, the writer breaks
the rule under test on purpose: it publishes its claims first and writes the
data object afterwards (a claim naming bytes that are not there yet), to show
that the test catches it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

RECORDS = 24
PAD = b"." * 1400  # 24 records a flush, about 17 KiB per partition: claims, not inline


def _break_claim_before_data() -> None:
    import txlog.clients.sender as sender_module
    from txlog.format.batch import encode_data_object
    from txlog.storage.paths import data_object_path

    real_claim_run = sender_module._claim_run
    later: list[tuple[str, bytes]] = []

    def names_only(storage, payloads):  # type: ignore[no-untyped-def]
        pieces, _, offsets = encode_data_object(payloads)
        blob = b"".join(pieces)
        path = data_object_path(os.urandom(16).hex())
        later.append((path, blob))
        now = time.monotonic()
        return [(path, offset, now) for offset in offsets]

    lock = threading.Lock()

    def claims_then_data(run):  # type: ignore[no-untyped-def]
        real_claim_run(run)  # partitions' runs go on threads: the list is shared
        time.sleep(1.0)  # a slow upload of a large object: the window a kill can land in
        while True:
            with lock:
                if not later:
                    return
                path, blob = later.pop()
            run[0].part.storage.publish_if_absent(path, blob)

    sender_module.write_data_object = names_only
    sender_module._claim_run = claims_then_data


def main(root: str, writer: str, mode: str, ack_file: str, go_file: str, seconds: str) -> None:
    if os.environ.get("CLAIMS_BREAK") == "claim-before-data":
        _break_claim_before_data()
    from txlog import Log

    log = Log(root)
    # Uncompressed, so that the sizes are what a data object holds (the values repeat).
    sizes = {"batch_size": 8 << 10, "data_object_bytes": 24 << 10, "compression": "none"}
    acks = open(ack_file, "a")
    with open(ack_file + ".ready", "w"):
        pass
    while not os.path.exists(go_file):  # a start barrier, so the writers overlap
        time.sleep(0.005)
    deadline = time.monotonic() + float(seconds)
    if mode in ("txn", "table"):
        producer = log.producer(transactional_id=f"w{writer}", **sizes)
        producer.init_transactions()
        txn = 0
        while time.monotonic() < deadline:
            commit = txn % 3 != 2
            values = [f"w{writer}.t{txn}.r{i}.{'c' if commit else 'a'}|".encode()
                      for i in range(RECORDS)]
            producer.begin_transaction()
            if mode == "table":
                import pyarrow as pa

                half = RECORDS // 2  # two sends: the first fills a data object, the
                for lo in (0, half):  # second stages while it is written behind
                    producer.send_table("t", pa.table({
                        "value": [v + PAD for v in values[lo:lo + half]],
                        "partition": [i % 2 for i in range(lo, lo + half)]}), wait=False)
            else:
                for i, value in enumerate(values):
                    producer.send("t", value + PAD, partition=i % 2)
            if commit:
                producer.commit_transaction()
                acks.write(json.dumps([v.decode() for v in values]) + "\n")
                acks.flush()
            else:
                producer.abort_transaction()
            txn += 1
    else:
        producer = log.producer(**sizes)
        n = 0
        while time.monotonic() < deadline:
            values = [f"w{writer}.s{n + i}.i|".encode() for i in range(RECORDS)]
            futures = [producer.send("t", v + PAD, partition=i % 2)
                       for i, v in enumerate(values)]
            producer.flush()
            assert all(f.succeeded() for f in futures)
            acks.write(json.dumps([v.decode() for v in values]) + "\n")
            acks.flush()
            n += RECORDS
        producer.close()


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src"))
    main(*sys.argv[1:])
