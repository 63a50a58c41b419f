"""``txlog transactions`` and ``txlog producers``: transactional ids and producer state."""

from __future__ import annotations

import argparse
from typing import Any

from .. import clock
from ..api.log import Log
from ..transactions.metadata import TxnState
from .common import (CommandError, LeafParser, json_option, non_negative_int, open_log,
                     print_table, utc)


def add_transactions(commands: Any, leaf_parser: LeafParser) -> None:
    txns = commands.add_parser("transactions", help="list, inspect or end transactions",
                               description="Inspect and clean up transactional ids.")
    txn_cmds = txns.add_subparsers(dest="action", metavar="ACTION", required=True)
    json_option(leaf_parser(
        txn_cmds, "list", help="show every transactional id",
        description="For every transactional id print its state, producer id, epoch and the "
                    "partitions of its open transaction."))
    describe_txn = leaf_parser(
        txn_cmds, "describe", help="show one transactional id in detail",
        description="Print a transactional id's state, producer id and epoch, timeout, "
                    "the start and duration of its open transaction, its decision id and "
                    "partitions.")
    describe_txn.add_argument("transactional_id", metavar="TRANSACTIONAL_ID")
    hanging = leaf_parser(
        txn_cmds, "find-hanging", help="list open transactions that hold an LSO back with "
                                       "no live owner",
        description="List the undecided transactions that hold a partition's last stable "
                    "offset back and that nobody will end: their coordinator state no "
                    "longer describes them, or they outlived their timeout (for a shared "
                    "transaction, its lease too), as a transaction of a killed producer "
                    "does. End one with 'txlog transactions abort'. Exits 0 either way.")
    hanging.add_argument("--topic", metavar="TOPIC", action="append",
                         help="only this topic (repeatable; default: every topic)")
    hanging.add_argument("--older-than-ms", metavar="MS", type=non_negative_int,
                         help="also list transactions open longer than MS, whatever their "
                              "timeout (kafka-transactions' --max-transaction-timeout)")
    json_option(hanging)
    abort = leaf_parser(
        txn_cmds, "abort", help="abort the open transaction of a transactional id",
        description="Abort the open transaction of TRANSACTIONAL_ID now and fence its "
                    "producer (a member of a shared transaction aborts the whole shared "
                    "transaction), then write its ABORT markers, so the LSO of its "
                    "partitions advances. Prints the partitions and their new LSO.")
    abort.add_argument("transactional_id", metavar="TRANSACTIONAL_ID")
    leaf_parser(
        txn_cmds, "abort-expired", help="abort transactions open longer than their timeout",
        description="Abort every Ongoing transaction older than its timeout (fencing its "
                    "producer), and finish every decided transaction whose markers are "
                    "missing. Prints the ids that were aborted.")
    expire = leaf_parser(
        txn_cmds, "expire", help="retire transactional ids idle for too long",
        description="Mark transactional ids that have no open transaction and were not used "
                    "for more than --max-idle-ms as Dead; such an id starts over with a new "
                    "producer id when it is next initialised. Prints the ids retired.")
    expire.add_argument("--max-idle-ms", metavar="N", type=non_negative_int, required=True,
                        help="idle time in milliseconds after which an id is retired")


def add_producers(commands: Any, leaf_parser: LeafParser) -> None:
    producers = commands.add_parser("producers", help="show the producers of a topic's "
                                                      "partitions",
                                    description="Inspect producer state.")
    producer_cmds = producers.add_subparsers(dest="action", metavar="ACTION", required=True)
    describe_producers = leaf_parser(
        producer_cmds, "describe", help="per partition, every producer the log remembers",
        description="For each partition of TOPIC, every producer id its producer state "
                    "holds (rebuilt from the log, as a Kafka partition leader keeps it): "
                    "epoch, last sequence, last timestamp, and the first offset of its "
                    "open transaction (- if none), with its transactional id.")
    describe_producers.add_argument("topic", metavar="TOPIC", help="topic name")
    describe_producers.add_argument("--partition", metavar="P", type=non_negative_int,
                                    help="only this partition")
    json_option(describe_producers)


def run_transactions(args: argparse.Namespace) -> None:
    log = open_log(args.root)
    coordinator = log.coordinator
    if args.action == "list":
        rows: list[tuple[object, ...]] = []
        for txn_id in coordinator.transactional_ids():
            meta = coordinator.metadata(txn_id)
            if meta is None:
                continue
            parts = ",".join(f"{t}-{p}" for t, p in meta.partitions) or "-"
            rows.append((txn_id, meta.state.value, meta.producer_id, meta.epoch, parts))
        print_table(("TRANSACTIONAL-ID", "STATE", "PRODUCER-ID", "EPOCH", "PARTITIONS"), rows,
                     args.json)
    elif args.action == "describe":
        _describe(log, args)
    elif args.action == "find-hanging":
        topics = args.topic or log.topics()
        partitions = [(t, p) for t in topics for p in range(log.describe_topic(t).partitions)]
        now = clock.now_ms()
        rows = [(h.topic, h.partition, h.first_offset, h.producer_id, h.epoch,
                 h.transactional_id or "-", now - h.start_ms if h.start_ms >= 0 else "-",
                 h.reason)
                for h in coordinator.find_hanging(partitions, args.older_than_ms)]
        print_table(("TOPIC", "PARTITION", "START-OFFSET", "PRODUCER-ID", "EPOCH",
                      "TRANSACTIONAL-ID", "DURATION-MS", "REASON"), rows, args.json)
    elif args.action == "abort":
        _abort(log, args)
    elif args.action == "abort-expired":
        aborted = log.abort_expired_transactions()
        print(f"aborted {len(aborted)} expired transaction{'s' if len(aborted) != 1 else ''}"
              + (": " + ", ".join(aborted) if aborted else ""))
    elif args.action == "expire":
        dead = coordinator.expire_transactional_ids(args.max_idle_ms)
        print(f"expired {len(dead)} transactional id{'s' if len(dead) != 1 else ''}"
              + (": " + ", ".join(dead) if dead else ""))


def _describe(log: Log, args: argparse.Namespace) -> None:
    """One transactional id in detail, as ``name: value`` lines where the other actions
    print tables: besides what list shows, its timeout and an open transaction's start
    and age."""
    meta = log.coordinator.metadata(args.transactional_id)
    if meta is None:
        raise CommandError(f"transactional id {args.transactional_id!r} does not exist in "
                           f"{log.root}")
    now = clock.now_ms()
    open_txn = meta.state is TxnState.ONGOING
    fields = [("transactional id", meta.transactional_id), ("state", meta.state.value),
              ("producer id", meta.producer_id), ("epoch", meta.epoch),
              ("timeout ms", meta.timeout_ms),
              ("transaction start", utc(meta.txn_start_ms) if open_txn else "-"),
              ("duration ms", now - meta.txn_start_ms if open_txn else "-"),
              ("decision id", meta.decision_id or "-"),
              ("partitions", ",".join(f"{t}-{p}" for t, p in meta.partitions) or "-"),
              ("last update", utc(meta.update_ms))]
    for name, value in fields:
        print(f"{name}: {value}")


def _abort(log: Log, args: argparse.Namespace) -> None:
    """The one action that changes a transaction: refused unless it is open, and followed
    by each partition's last stable offset, which the abort lets move on."""
    coordinator = log.coordinator
    meta = coordinator.metadata(args.transactional_id)
    if meta is None or meta.state is not TxnState.ONGOING:
        state = "does not exist" if meta is None else f"is {meta.state.value}"
        raise CommandError(f"transactional id {args.transactional_id!r} has no open "
                           f"transaction to abort (it {state})")
    coordinator.abort_open(args.transactional_id,
                           "aborted by an operator (txlog transactions abort)")
    print(f"aborted the transaction of {args.transactional_id} (decision "
          f"{meta.decision_id})")
    for topic, partition in meta.partitions:
        print(f"{topic}-{partition}: last stable offset "
              f"{log.last_stable_offset(topic, partition)}")


def run_producers(args: argparse.Namespace) -> None:
    log = open_log(args.root)
    desc = log.describe_topic(args.topic)
    partitions = range(desc.partitions) if args.partition is None else [args.partition]
    rows = []
    for p in partitions:
        state = log.partition(args.topic, p).loaded_state()
        for pid, entry in sorted(state.producers.items()):
            rows.append((p, pid, entry.epoch, entry.last_seq, utc(entry.last_timestamp),
                         entry.txn_first_offset if entry.in_transaction else "-",
                         entry.transactional_id or "-"))
    print_table(("PARTITION", "PRODUCER-ID", "EPOCH", "LAST-SEQUENCE", "LAST-TIMESTAMP",
                  "TXN-START-OFFSET", "TRANSACTIONAL-ID"), rows, args.json)
