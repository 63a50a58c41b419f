"""The ``txlog`` command: inspect and operate a log root from a shell.

It runs the same library code as every other process (there is no server to
talk to), so anything it does is exactly what a producer, consumer or
coordinator in another process would do.  Errors that txlog raises on purpose
(``TxlogError``) are reported as one line on stderr with exit status 1: an
operator needs the message, not a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

from .. import clock
from ..partition.compaction import DEFAULT_MIN_BATCHES
from ..errors import TxlogError, UnknownPartitionError, UnknownTopicError
from ..log import TOPIC_DEFAULTS, Log
from ..clients.positions import bounds
from ..partition.isolation import READ_COMMITTED, READ_UNCOMMITTED

PROG = "txlog"
ROOT_ENV = "TXLOG_ROOT"
POLL_RECORDS = 10_000
IDLE_SLEEP_S = 0.1


class CommandError(Exception):
    """A usage problem found after parsing (reported like a TxlogError)."""


# --- argument parsing ---------------------------------------------------------------


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _config_item(text: str) -> tuple[str, Any]:
    """``key=value``; a value made of digits becomes an int (as max.message.bytes needs)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not of the form key=value")
    if value.lstrip("-").isdigit():
        return key, int(value)
    return key, value


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per row instead of a table")


def _partitions_option(parser: argparse.ArgumentParser) -> None:
    """TOPIC and --partition of a maintenance command (see ``_maintained_partitions``)."""
    parser.add_argument("topic", metavar="TOPIC", help="topic name")
    parser.add_argument("--partition", metavar="N", type=_non_negative_int, action="append",
                        help="only this partition (repeatable; default: all)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Operate a txlog root: a Kafka-style transactional log kept directly "
                    "in a directory or object store, with no broker.",
        epilog=f"The root can also be given in the {ROOT_ENV} environment variable. "
               "Errors are reported on one line and exit with status 1.")
    root_help = ("the log root: a local directory, or a URL such as s3://bucket/path "
                 f"(default: ${ROOT_ENV})")
    parser.add_argument("--root", metavar="DIR", default=os.environ.get(ROOT_ENV),
                        help=root_help)
    # Every command also takes --root after its own name (txlog topics list --root DIR).
    leaf = argparse.ArgumentParser(add_help=False)
    leaf.add_argument("--root", metavar="DIR", default=argparse.SUPPRESS, help=root_help)

    def leaf_parser(group: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return group.add_parser(name, parents=[leaf], **kwargs)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    # topics
    topics = commands.add_parser("topics", help="list, create, describe, alter or delete topics",
                                 description="Manage topics.")
    topic_cmds = topics.add_subparsers(dest="action", metavar="ACTION", required=True)
    leaf_parser(topic_cmds, "list", help="print the name of every topic, one per line",
                description="Print the name of every topic, one per line, sorted.")
    create = leaf_parser(
        topic_cmds, "create", help="create a topic",
        description="Create a topic. The root is created as well if it holds no log yet.")
    create.add_argument("name", metavar="NAME",
                        help="topic name: ASCII letters, digits, '.', '_', '-' (1 to 249)")
    create.add_argument("--partitions", metavar="N", type=_positive_int, required=True,
                        help="number of partitions (1 to 10000)")
    create.add_argument("--config", metavar="KEY=VALUE", type=_config_item, action="append",
                        default=[],
                        help="topic setting, repeatable: message.timestamp.type="
                             "CreateTime|LogAppendTime, max.message.bytes=N")
    describe = leaf_parser(
        topic_cmds, "describe", help="show a topic's settings and per-partition offsets",
        description="Show a topic's partition count, its effective settings (Kafka's "
                    "default marked where the topic sets none), and for each partition its "
                    "log start, log end and last stable offset, and how many segments and "
                    "batch objects (from the compacted end) it holds, with their bytes.")
    describe.add_argument("name", metavar="NAME", help="topic name")
    _json_option(describe)
    alter = leaf_parser(
        topic_cmds, "alter", help="add partitions to a topic or change its retention and "
                                  "segment settings",
        description="Add partitions to a topic (partitions are never removed): existing "
                    "records stay where they are; keyed records sent from now on may hash "
                    "to a new partition, as in Kafka, and readers subscribed to the topic, "
                    "a streaming query included, pick the new partitions up. And/or set or "
                    "remove retention.ms, retention.bytes and segment.bytes (kafka-configs "
                    "--alter --add-config/--delete-config); 'txlog compact' and 'txlog "
                    "retention' read them.")
    alter.add_argument("name", metavar="NAME", help="topic name")
    alter.add_argument("--partitions", metavar="N", type=_positive_int,
                       help="the new total number of partitions (more than now, at most 10000)")
    alter.add_argument("--config", metavar="KEY=VALUE", type=_config_item, action="append",
                       default=[],
                       help="set a setting, repeatable: retention.ms=MS, retention.bytes=N "
                            "(-1: no limit), segment.bytes=N (at least 1024)")
    alter.add_argument("--delete-config", metavar="KEY", action="append", default=[],
                       help="remove a setting, back to Kafka's default (repeatable)")
    delete = leaf_parser(
        topic_cmds, "delete", help="delete a topic and all of its data",
        description="Delete a topic: its description first (so no new writer starts), "
                    "then every partition's batches. This cannot be undone.")
    delete.add_argument("name", metavar="NAME", help="topic name")

    # produce
    produce = leaf_parser(
        commands, "produce", help="write one record per line of standard input",
        description="Read standard input and write one record per line (the line without "
                    "its line ending is the value, as bytes; with --format json, a JSON "
                    "object per line) with an idempotent producer, or with "
                    "--transactional-id in one transaction. Prints how many records went "
                    "to which offsets.")
    produce.add_argument("topic", metavar="TOPIC", help="topic to write to")
    keys = produce.add_mutually_exclusive_group()
    keys.add_argument("--key", metavar="K",
                      help="key of every record (UTF-8); records are then partitioned by "
                           "this key, as Kafka does")
    keys.add_argument("--key-separator", metavar="SEP",
                      help="split each line at the first SEP into key and value")
    produce.add_argument("--partition", metavar="P", type=_non_negative_int,
                         help="write every record to this partition (default: Kafka's "
                              "partitioner: murmur2 of the key, sticky for null keys)")
    produce.add_argument("--format", choices=["lines", "json"], default="lines",
                         help="lines (default): each line is a value; json: each line is an "
                              "object with 'value' and optional 'key', 'headers' "
                              "([[key, value], ...]), 'partition' and 'timestamp' (ms), "
                              "strings written as UTF-8")
    produce.add_argument("--transactional-id", metavar="ID",
                         help="write all records in one transaction of this transactional id, "
                              "committed at the end of the input (aborted, with nothing "
                              "visible, if any line fails)")

    # consume
    consume = leaf_parser(
        commands, "consume", help="print records of a topic",
        description="Print records of a topic. Without --from-beginning, --offset or "
                    "--from-timestamp only records written after the command starts are "
                    "printed (as Kafka's console consumer), so combine it with --timeout-ms "
                    "or --follow. The command stops at the end of the log (the last stable "
                    "offset under read_committed), after --max-records, with --timeout-ms "
                    "after that long without a new record, and with --follow only when "
                    "interrupted.")
    consume.add_argument("topic", metavar="TOPIC", help="topic to read")
    consume.add_argument("--partition", metavar="P", type=_non_negative_int,
                         help="read only this partition (default: all)")
    start = consume.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true",
                       help="start at offset 0 instead of the current end")
    start.add_argument("--offset", metavar="OFFSET", type=_non_negative_int,
                       help="start at OFFSET (needs --partition)")
    start.add_argument("--from-timestamp", metavar="MS", type=_non_negative_int,
                       help="start in each partition at the first record whose timestamp is "
                            "at least MS (milliseconds since the epoch), or at its end")
    consume.add_argument("--isolation-level", choices=[READ_COMMITTED, READ_UNCOMMITTED],
                         default=READ_COMMITTED,
                         help="read_committed (default) shows committed records only; "
                              "read_uncommitted also shows open and aborted transactions")
    consume.add_argument("--max-records", metavar="N", type=_positive_int,
                         help="stop after printing N records")
    waiting = consume.add_mutually_exclusive_group()
    waiting.add_argument("--timeout-ms", metavar="MS", type=_non_negative_int, default=0,
                         help="keep waiting for new records until none arrived for MS "
                              "milliseconds (default 0: stop at the end of the log)")
    waiting.add_argument("--follow", action="store_true",
                         help="keep waiting for new records until interrupted (or "
                              "--max-records)")
    consume.add_argument("--format", choices=["value", "json"], default="value",
                         help="value (default): each record's value as raw bytes, one per "
                              "line; json: one JSON object per record with partition, offset, "
                              "timestamp, timestamp type, key, value and headers (bytes "
                              "decoded as UTF-8, invalid bytes as backslash escapes)")

    # offsets
    offsets = leaf_parser(
        commands, "offsets", help="show each partition's log end offset and last stable offset",
        description="For each partition of TOPIC print the log end offset (one past the last "
                    "batch written) and the last stable offset (the first offset of the "
                    "earliest undecided transaction, or the log end).")
    offsets.add_argument("topic", metavar="TOPIC", help="topic name")
    _json_option(offsets)

    # transactions
    txns = commands.add_parser("transactions", help="list, inspect or end transactions",
                               description="Inspect and clean up transactional ids.")
    txn_cmds = txns.add_subparsers(dest="action", metavar="ACTION", required=True)
    _json_option(leaf_parser(
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
    hanging.add_argument("--older-than-ms", metavar="MS", type=_non_negative_int,
                         help="also list transactions open longer than MS, whatever their "
                              "timeout (kafka-transactions' --max-transaction-timeout)")
    _json_option(hanging)
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
    expire.add_argument("--max-idle-ms", metavar="N", type=_non_negative_int, required=True,
                        help="idle time in milliseconds after which an id is retired")

    # compact
    compact = leaf_parser(
        commands, "compact", help="merge each partition's oldest batch objects into segments",
        description="Copy each partition's oldest run of batch objects, byte for byte, into "
                    "segments of at most the topic's segment.bytes, then delete the batch "
                    "objects they replace. Safe while producers and consumers run. Prints "
                    "per partition the segments made, the batches merged into them, their "
                    "bytes, and the partition's objects (segments and batch objects) before "
                    "and after.")
    _partitions_option(compact)
    compact.add_argument("--min-batches", metavar="N", type=_positive_int,
                         default=DEFAULT_MIN_BATCHES,
                         help="make no segment of fewer batches than this, unless the "
                              "next batch would not fit in segment.bytes "
                              f"(default {DEFAULT_MIN_BATCHES})")
    compact.add_argument("--lag", metavar="N", type=_non_negative_int, default=0,
                         help="leave the newest N offsets of each partition as batch objects "
                              "(default 0)")
    _json_option(compact)

    # retention
    retention = leaf_parser(
        commands, "retention", help="delete the oldest segments that retention allows",
        description="Apply the topic's retention.ms and retention.bytes: delete whole "
                    "segments from each partition's log start while their newest record is "
                    "older than retention.ms or the partition without them still holds "
                    "retention.bytes (-1 disables a rule; the newest segment always stays; "
                    "batch objects are never deleted, so compact first). Prints per "
                    "partition the segments deleted, their bytes and the new log start "
                    "offset.")
    _partitions_option(retention)
    _json_option(retention)

    # dump
    dump = leaf_parser(
        commands, "dump", help="print batch headers (and records) as stored, like "
                               "kafka-dump-log",
        description="Print a partition's log as stored, from its log start: each segment "
                    "(base and end offset, batch counts, section sizes, whether each of its "
                    "checksums holds) followed by its batches, then the batch objects from "
                    "the compacted end; and last, marked 'stray', any batch objects below "
                    "the compacted end, which are not part of the log (leftovers compaction "
                    "is deleting). Or one object, a batch or a segment. For every batch: base "
                    "and last offset, record count, producer id and epoch, sequences, "
                    "transactional and control flags, marker type, timestamps, and whether "
                    "its checksums hold. Works on a damaged log: a batch or segment that "
                    "fails a check is reported, not skipped, and the command exits 1 if any "
                    "did.")
    dump.add_argument("topic", metavar="TOPIC", nargs="?", help="topic name")
    dump.add_argument("partition", metavar="PARTITION", nargs="?", type=_non_negative_int,
                      help="partition number")
    dump.add_argument("--object", metavar="PATH",
                      help="dump this one object instead (a path under the root, e.g. "
                           "topics/t/0/00000000000000000000.batch or "
                           "topics/t/0/segments/00000000000000000000.segment)")
    dump.add_argument("--from", dest="start", metavar="OFFSET", type=_non_negative_int,
                      default=0, help="start at the batch holding OFFSET")
    dump.add_argument("--max-batches", metavar="N", type=_positive_int,
                      help="stop after N batches (those inside segments count)")
    dump.add_argument("--records", action="store_true",
                      help="also print each record (offset, timestamp, key, value, headers)")
    dump.add_argument("--json", action="store_true",
                      help="one JSON object per segment, batch or stray object, each with a "
                           "'kind'")

    # gc
    gc = leaf_parser(
        commands, "gc", help="remove coordinator state and leftovers nobody needs any more",
        description="Remove what no reader or writer will use again, while they run: "
                    "versions of transaction-metadata, group and lease chains superseded "
                    "longer ago than --chain-age (the newest always stays); decisions no "
                    "unfinished transaction follows (shared ones also older than "
                    "--decision-age); leases of decided transactions; producer-id blocks "
                    "but the newest; batch files and snapshots that segments cover; temp "
                    "files (.tmp-*) of dead local publishes older than --temp-age. "
                    "docs/protocol.md section 8 says why each removal is safe.")
    gc.add_argument("--chain-age", metavar="SECONDS", type=_non_negative_int, default=3600,
                    help="only chain versions whose successor is older than this "
                         "(default 3600)")
    gc.add_argument("--decision-age", metavar="SECONDS", type=_non_negative_int,
                    default=7 * 24 * 3600,
                    help="only decisions of shared transactions older than this "
                         "(default 604800, 7 days)")
    gc.add_argument("--temp-age", metavar="SECONDS", type=_non_negative_int, default=3600,
                    help="only temp files older than this (default 3600)")
    gc.add_argument("--verbose", action="store_true", help="also print every removed path")
    _json_option(gc)

    # verify
    verify = leaf_parser(
        commands, "verify", help="check every checksum and the log's invariants",
        description="Replay every partition from its log start and check what writers "
                    "were held to: both checksums and the records of every batch, offsets "
                    "contiguous, no duplicate or out-of-sequence batch of an idempotent "
                    "producer, every COMMIT marker backed by a decision that commits it. "
                    "Each segment is read once and must agree with itself: its header, "
                    "snapshot, aborted-list and index checksums; each offset-index entry "
                    "names a batch of that base, position and exact size; the time index is "
                    "the running maximum of its data batches' timestamps; the aborted list "
                    "is the transactions its ABORT markers end; its snapshot ends where it "
                    "ends. Segments must be contiguous and the batch objects start at the "
                    "compacted end. Changes nothing. Exits 1 if any check fails.")
    verify.add_argument("--topic", metavar="TOPIC", action="append",
                        help="only this topic (repeatable; default: every topic)")
    verify.add_argument("--json", action="store_true",
                        help="one JSON object per partition (with 'strays': batch objects "
                             "below the compacted end, not part of the log)")

    # producers
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
    describe_producers.add_argument("--partition", metavar="P", type=_non_negative_int,
                                    help="only this partition")
    _json_option(describe_producers)

    # groups
    groups = commands.add_parser("groups", help="list groups, show their offsets and lag, "
                                                "delete them",
                                 description="Inspect consumer groups.")
    group_cmds = groups.add_subparsers(dest="action", metavar="ACTION", required=True)
    leaf_parser(group_cmds, "list", help="print every group id, one per line",
                description="Print every consumer group that has committed offsets, one per "
                            "line, sorted (a streaming sink's <prefix>-sink group included).")
    gdesc = leaf_parser(
        group_cmds, "describe", help="show a group's committed offsets and lag",
        description="For each partition the group committed an offset for, print the "
                    "committed offset, the partition's log end offset, its last stable "
                    "offset and the lag between the committed offset and the log end.")
    gdesc.add_argument("group", metavar="GROUP", help="group id")
    _json_option(gdesc)
    gdelete = leaf_parser(
        group_cmds, "delete", help="forget groups' committed offsets",
        description="Delete consumer groups (kafka-consumer-groups --delete): their committed "
                    "offsets are forgotten, so they are no longer listed or described, and "
                    "a later commit starts them afresh. Stop the group's consumers first: "
                    "nothing checks for them, and a streaming sink's <prefix>-sink group "
                    "also records which micro-batches it wrote.")
    gdelete.add_argument("group", metavar="GROUP", nargs="+", help="group id")
    return parser


# --- output helpers ------------------------------------------------------------------


def _print_table(header: Sequence[str], rows: Iterable[Sequence[Any]],
                 as_json: bool = False) -> None:
    """Aligned columns, or with ``as_json`` one JSON object per row (keys as the header's,
    lower case with '_'; numbers stay numbers, "-" becomes null)."""
    if as_json:
        keys = [h.lower().replace("-", "_") for h in header]
        for row in rows:
            print(json.dumps({k: None if c == "-" else c  # "-" is the table's "none"
                              for k, c in zip(keys, row, strict=True)}))
        return
    rows = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    for row in [list(header), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


class _Progress:
    """A one-line counter on standard error while a long command runs on a terminal;
    nothing at all in a pipe or a file, so output stays machine-readable."""

    def __init__(self, verb: str, unit: str, streams_output: bool = False) -> None:
        self.verb, self.unit = verb, unit
        # A command that prints as it goes shows a counter only when its output goes
        # elsewhere (txlog dump ... > file): on one terminal the two would interleave.
        self.shown = sys.stderr.isatty() and not (streams_output and sys.stdout.isatty())
        self.last = 0.0

    def __enter__(self) -> _Progress:
        return self

    def update(self, done: int, total: int | None = None) -> None:
        now = time.monotonic()
        if not self.shown or (now - self.last < 0.1 and done != total):
            return
        self.last = now
        of = f"/{total}" if total is not None else ""
        sys.stderr.write(f"\r{self.verb} {done}{of} {self.unit}")
        sys.stderr.flush()

    def __exit__(self, *exc: Any) -> None:
        if self.shown and self.last:
            sys.stderr.write("\r\x1b[K")  # clear the line before results or errors
            sys.stderr.flush()


def _write_bytes(data: bytes) -> None:
    """Raw bytes to stdout (values are bytes; decoding them would change them)."""
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(data.decode("utf-8", "backslashreplace"))
    else:
        buffer.write(data)
        buffer.flush()


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "backslashreplace")


def _open(root: str | None, create: bool = False) -> Log:
    if not root:
        raise CommandError(f"no log root: pass --root DIR or set {ROOT_ENV}")
    if not create and "://" not in root and not os.path.isdir(root):
        # Opening would create the directory; a mistyped path should not do that.
        raise CommandError(f"{root}: no such directory")
    return Log(root, create=create)


# --- commands ---------------------------------------------------------------------------


def _topics(args: argparse.Namespace) -> None:
    if args.action == "create":
        log = _open(args.root, create=True)
        desc = log.create_topic(args.name, args.partitions, dict(args.config))
        print(f"created topic {desc.name} with {desc.partitions} partition"
              f"{'s' if desc.partitions != 1 else ''}")
        return
    log = _open(args.root)
    if args.action == "list":
        for name in log.topics():
            print(name)
    elif args.action == "describe":
        desc = log.describe_topic(args.name, refresh=True)
        header, rows = _offset_rows(log, desc.name, desc.partitions, sizes=True)
        config = {**TOPIC_DEFAULTS, **desc.config}
        defaults = sorted(k for k in config if k not in desc.config)
        if args.json:
            keys = [h.lower().replace("-", "_") for h in header]
            print(json.dumps({"topic": desc.name, "topic_id": desc.topic_id,
                              "partitions": desc.partitions, "created_ms": desc.created_ms,
                              "config": dict(sorted(config.items())),
                              "default_config_keys": defaults,
                              "partition_offsets": [dict(zip(keys, r, strict=True))
                                                    for r in rows]}))
            return
        print(f"topic: {desc.name}")
        print(f"topic id: {desc.topic_id}")
        print(f"partitions: {desc.partitions}")
        print(f"created: {_utc(desc.created_ms)}")
        print("config: " + ", ".join(f"{k}={v}" + (" (default)" if k in defaults else "")
                                     for k, v in sorted(config.items())))
        _print_table(header, rows)
    elif args.action == "alter":
        if args.partitions is None and not args.config and not args.delete_config:
            raise CommandError("give --partitions, --config or --delete-config")
        if args.partitions is not None:
            desc = log.create_partitions(args.name, args.partitions)
            print(f"topic {desc.name} now has {desc.partitions} partitions")
        if args.config or args.delete_config:
            desc = log.alter_topic_config(args.name, dict(args.config), args.delete_config)
            shown = ", ".join(f"{k}={v}" for k, v in sorted(desc.config.items()))
            print(f"topic {desc.name} config: {shown or '(defaults)'}")
    elif args.action == "delete":
        log.delete_topic(args.name)
        print(f"deleted topic {args.name}")


def _offset_rows(log: Log, topic: str, partitions: int, sizes: bool = False
                 ) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """Per partition its offsets; with ``sizes`` also its log start and what it stores
    (see ``_stored``)."""
    rows: list[tuple[Any, ...]] = []
    for p in range(partitions):
        b = bounds(log, topic, p)
        if not sizes:
            rows.append((p, b.end, b.stable))
            continue
        rows.append((p, b.log_start, b.end, b.stable, *log.partition(topic, p).stored()))
    if sizes:
        return ("PARTITION", "LOG-START-OFFSET", "LOG-END-OFFSET", "LAST-STABLE-OFFSET",
                "SEGMENTS", "SEGMENT-BYTES", "BATCHES", "BATCH-BYTES"), rows
    return ("PARTITION", "LOG-END-OFFSET", "LAST-STABLE-OFFSET"), rows


def _produce(args: argparse.Namespace) -> None:
    log = _open(args.root)
    log.describe_topic(args.topic)  # fail before reading any input
    if args.partition is not None:
        log.partition(args.topic, args.partition)
    key = None if args.key is None else args.key.encode("utf-8")
    separator = None if args.key_separator is None else args.key_separator.encode("utf-8")
    if separator == b"":
        raise CommandError("--key-separator must not be empty")
    ranges: dict[int, list[int]] = {}  # partition -> [first offset, last offset, count]

    def written(meta: Any) -> None:
        r = ranges.setdefault(meta.partition, [meta.offset, meta.offset, 0])
        r[0], r[1], r[2] = min(r[0], meta.offset), max(r[1], meta.offset), r[2] + 1

    stdin = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else None
    lines: Iterable[bytes] = stdin if stdin is not None else (
        line.encode("utf-8") for line in sys.stdin)
    interactive = sys.stdin.isatty() and args.transactional_id is None
    txn = args.transactional_id
    producer = log.producer(transactional_id=txn) if txn else log.producer()

    def before(number: int) -> str:
        """What happened to the lines before a bad one, for its error message."""
        return "nothing was produced (the transaction is aborted)" if txn else \
            f"the {number - 1} line(s) before it were produced"

    open_txn = False
    try:
        if txn:
            producer.init_transactions()
            producer.begin_transaction()
            open_txn = True
        for number, line in enumerate(lines, 1):
            value = line[:-1] if line.endswith(b"\n") else line
            if value.endswith(b"\r"):
                value = value[:-1]
            fields: dict[str, Any] = {"key": key, "partition": args.partition}
            if args.format == "json":
                fields.update(_json_record(value, number, before(number)))
            elif separator is not None:
                if separator not in value:
                    raise CommandError(
                        f"line {number} has no key separator {args.key_separator!r}; "
                        f"{before(number)}")
                fields["key"], fields["value"] = value.split(separator, 1)
            else:
                fields["value"] = value
            producer.send(args.topic, **fields).add_callback(written)
            if interactive:
                producer.flush()  # a person typing expects each line to land now
        if txn:
            producer.commit_transaction()
            open_txn = False
        producer.flush()
    except BaseException:
        if open_txn:
            producer.abort_transaction()
        raise
    finally:
        producer.close()
    total = sum(r[2] for r in ranges.values())
    detail = "; ".join(f"partition {p}: offsets {r[0]}-{r[1]}" for p, r in sorted(ranges.items()))
    print(f"produced {total} record{'s' if total != 1 else ''} to {args.topic}"
          + (f" ({detail})" if detail else ""))


def _json_record(line: bytes, number: int, before: str) -> dict[str, Any]:
    """One --format json input line as send() arguments; errors name the line."""
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise CommandError(f"line {number} is not JSON ({exc}); {before}") from None
    if not isinstance(obj, dict) or "value" not in obj:
        raise CommandError(f"line {number} must be a JSON object with a 'value'; {before}")
    unknown = set(obj) - {"key", "value", "headers", "partition", "timestamp"}
    if unknown:
        raise CommandError(f"line {number} has unknown field(s) {', '.join(sorted(unknown))} "
                           f"(known: key, value, headers, partition, timestamp); {before}")

    def raw(v: Any) -> bytes | None:
        return v.encode("utf-8") if isinstance(v, str) else v

    out: dict[str, Any] = {"value": raw(obj["value"])}
    if obj.get("key") is not None:
        out["key"] = raw(obj["key"])
    if "headers" in obj:
        try:
            out["headers"] = [(k, raw(v)) for k, v in obj["headers"]]
        except (TypeError, ValueError):
            raise CommandError(f"line {number}: 'headers' must be a list of [key, value] "
                               f"pairs; {before}") from None
    if "partition" in obj:
        out["partition"] = obj["partition"]
    if "timestamp" in obj:
        out["timestamp_ms"] = obj["timestamp"]
    return out


def _consume(args: argparse.Namespace) -> None:
    log = _open(args.root)
    desc = log.describe_topic(args.topic)
    partitions = [args.partition] if args.partition is not None else range(desc.partitions)
    consumer = log.consumer(isolation_level=args.isolation_level,
                            auto_offset_reset="earliest" if args.from_beginning else "latest")
    consumer.assign([(args.topic, p) for p in partitions])
    if args.offset is not None:
        if args.partition is None:
            raise CommandError("--offset needs --partition (offsets are per partition)")
        end = consumer.end_offsets()[(args.topic, args.partition)]
        if args.offset > end:
            raise CommandError(f"offset {args.offset} is past the end of {args.topic}-"
                               f"{args.partition} ({end})")
        consumer.seek(args.topic, args.partition, args.offset)
    elif args.from_timestamp is not None:
        found = consumer.offsets_for_times({tp: args.from_timestamp
                                            for tp in consumer.assignment()})
        for tp, hit in found.items():
            if hit is None:
                consumer.seek_to_end(tp)
            else:
                consumer.seek(*tp, hit.offset)
    for tp in consumer.assignment():
        consumer.position(*tp)  # fix the starting point now, before waiting
    remaining = args.max_records
    last_record = time.monotonic()
    while remaining is None or remaining > 0:
        records = consumer.poll(min(remaining or POLL_RECORDS, POLL_RECORDS))
        for r in records:
            if args.format == "json":
                print(json.dumps({
                    "partition": r.partition, "offset": r.offset, "timestamp": r.timestamp,
                    "timestamp_type": "LogAppendTime" if r.timestamp_type else "CreateTime",
                    "key": _text(r.key), "value": _text(r.value),
                    "headers": [[k, _text(v)] for k, v in r.headers]}))
            else:
                _write_bytes((r.value or b"") + b"\n")
        if remaining is not None:
            remaining -= len(records)
        if records:
            last_record = time.monotonic()
            continue
        if not args.follow and (time.monotonic() - last_record) * 1000 >= args.timeout_ms:
            break
        time.sleep(IDLE_SLEEP_S)
    consumer.close()


def _offsets(args: argparse.Namespace) -> None:
    log = _open(args.root)
    desc = log.describe_topic(args.topic)
    _print_table(*_offset_rows(log, desc.name, desc.partitions), args.json)


def _transactions(args: argparse.Namespace) -> None:
    log = _open(args.root)
    coordinator = log.coordinator
    if args.action == "list":
        rows = []
        for txn_id in coordinator.transactional_ids():
            meta = coordinator.metadata(txn_id)
            if meta is None:
                continue
            parts = ",".join(f"{t}-{p}" for t, p in meta.partitions) or "-"
            rows.append((txn_id, meta.state.value, meta.producer_id, meta.epoch, parts))
        _print_table(("TRANSACTIONAL-ID", "STATE", "PRODUCER-ID", "EPOCH", "PARTITIONS"), rows,
                     args.json)
    elif args.action == "describe":
        meta = coordinator.metadata(args.transactional_id)
        if meta is None:
            raise CommandError(f"transactional id {args.transactional_id!r} does not exist in "
                               f"{log.root}")
        now = clock.now_ms()
        open_txn = meta.state.value == "Ongoing"
        fields = [("transactional id", meta.transactional_id), ("state", meta.state.value),
                  ("producer id", meta.producer_id), ("epoch", meta.epoch),
                  ("timeout ms", meta.timeout_ms),
                  ("transaction start", _utc(meta.txn_start_ms) if open_txn else "-"),
                  ("duration ms", now - meta.txn_start_ms if open_txn else "-"),
                  ("decision id", meta.decision_id or "-"),
                  ("partitions", ",".join(f"{t}-{p}" for t, p in meta.partitions) or "-"),
                  ("last update", _utc(meta.update_ms))]
        for name, value in fields:
            print(f"{name}: {value}")
    elif args.action == "find-hanging":
        topics = args.topic or log.topics()
        partitions = [(t, p) for t in topics for p in range(log.describe_topic(t).partitions)]
        now = clock.now_ms()
        rows = [(h.topic, h.partition, h.first_offset, h.producer_id, h.epoch,
                 h.transactional_id or "-", now - h.start_ms if h.start_ms >= 0 else "-",
                 h.reason)
                for h in coordinator.find_hanging(partitions, args.older_than_ms)]
        _print_table(("TOPIC", "PARTITION", "START-OFFSET", "PRODUCER-ID", "EPOCH",
                      "TRANSACTIONAL-ID", "DURATION-MS", "REASON"), rows, args.json)
    elif args.action == "abort":
        meta = coordinator.metadata(args.transactional_id)
        if meta is None or meta.state.value != "Ongoing":
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
    elif args.action == "abort-expired":
        aborted = log.abort_expired_transactions()
        print(f"aborted {len(aborted)} expired transaction{'s' if len(aborted) != 1 else ''}"
              + (": " + ", ".join(aborted) if aborted else ""))
    elif args.action == "expire":
        dead = coordinator.expire_transactional_ids(args.max_idle_ms)
        print(f"expired {len(dead)} transactional id{'s' if len(dead) != 1 else ''}"
              + (": " + ", ".join(dead) if dead else ""))


def _maintained_partitions(log: Log, topic: str, chosen: list[int] | None) -> list[int]:
    """The partitions a maintenance command works on, each checked to exist."""
    desc = log.describe_topic(topic, refresh=True)
    partitions = list(dict.fromkeys(chosen)) if chosen else list(range(desc.partitions))
    for p in partitions:
        log.partition(topic, p)  # an unknown partition fails here, named
    return partitions


def _compact(args: argparse.Namespace) -> None:
    log = _open(args.root)
    rows = []
    partitions = _maintained_partitions(log, args.topic, args.partition)
    with _Progress("compacted", "partitions") as progress:
        for p in partitions:
            segments, _, batches, _ = log.partition(args.topic, p).stored()
            made = log.compact(args.topic, [p], args.min_batches, args.lag)[p]
            after = log.partition(args.topic, p).stored()
            rows.append((p, len(made), sum(c.batches for c in made),
                         sum(c.bytes for c in made), segments + batches, after[0] + after[2]))
            progress.update(len(rows), len(partitions))
    _print_table(("PARTITION", "SEGMENTS-MADE", "BATCHES-MERGED", "BYTES", "OBJECTS-BEFORE",
                  "OBJECTS-AFTER"), rows, args.json)


def _retention(args: argparse.Namespace) -> None:
    log = _open(args.root)
    rows = []
    partitions = _maintained_partitions(log, args.topic, args.partition)
    with _Progress("retention applied to", "partitions") as progress:
        for p in partitions:
            done = log.apply_retention(args.topic, [p])[p]
            rows.append((p, done.segments_deleted, done.bytes_deleted, done.log_start))
            progress.update(len(rows), len(partitions))
    _print_table(("PARTITION", "SEGMENTS-DELETED", "BYTES-DELETED", "LOG-START-OFFSET"), rows,
                 args.json)


def _dump(args: argparse.Namespace) -> None:
    from ..admin.dump import SegmentDump, dump_object, dump_partition

    log = _open(args.root)
    if args.object is not None:
        if args.topic is not None:
            raise CommandError("give either TOPIC PARTITION or --object, not both")
        try:
            dumps = iter([dump_object(log.storage, args.object, with_records=args.records)])
        except FileNotFoundError:
            raise CommandError(f"no object {args.object!r} in {log.root}") from None
    elif args.topic is None or args.partition is None:
        raise CommandError("give TOPIC and PARTITION (or --object PATH)")
    else:
        log.partition(args.topic, args.partition)  # a clear error for an unknown partition
        dumps = dump_partition(log, args.topic, args.partition, args.start, args.max_batches,
                               args.records)
    damaged = {"segment": 0, "batch": 0}
    done = 0
    with _Progress("dumped", "batches", streams_output=True) as progress:
        for item in dumps:
            inner = item.batches if isinstance(item, SegmentDump) else []
            for d in [item, *inner]:
                kind = d.as_dict()["kind"]
                if kind == "batch":
                    done += 1
                    progress.update(done)
                if kind != "stray" and d.problem is not None:
                    damaged[kind] += 1
                _print_dump(d, args.json, indent="  " if d is not item else "")
    failed = [f"{n} {kind}{'es' if kind == 'batch' and n != 1 else 's' if n != 1 else ''}"
              for kind, n in damaged.items() if n]
    if failed:
        raise CommandError(f"{' and '.join(failed)} failed a check")


def _print_dump(d: Any, as_json: bool, indent: str = "") -> None:
    """One segment, batch or stray object: a JSON line, or ``kind key: value ...`` with a
    segment's batches indented under it and each record on a ``|`` line."""
    fields = d.as_dict()
    records = getattr(d, "records", None)
    if as_json:
        if records is not None:
            fields["records"] = _record_dicts(d)
        print(json.dumps(fields))
        return
    print(indent + fields["kind"] + " "
          + " ".join(f"{k}: {'; '.join(v) if k == 'problems' else _shown(v)}"
                     for k, v in fields.items() if k not in ("kind", "path"))
          + f" file: {d.path}")
    if records is not None:
        for record in _record_dicts(d):
            print(indent + "| " + " ".join(f"{k}: {_shown(v)}" for k, v in record.items()))


def _record_dicts(d: Any) -> list[dict[str, object]]:
    base = d.header.base_offset
    rows = d.records.to_pylist()  # printing is per record anyway
    return [{"offset": base + i, "timestamp": r["timestamp"], "key": _text(r["key"]),
             "value": _text(r["value"]),
             "headers": [[h["key"], _text(h["value"])] for h in r["headers"] or []]}
            for i, r in enumerate(rows)]


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "-" if value is None or value == "" else str(value)


def _gc(args: argparse.Namespace) -> None:
    log = _open(args.root)
    report = log.gc(chain_age_s=args.chain_age, decision_age_s=args.decision_age,
                    temp_age_s=args.temp_age)
    _print_table(("REMOVED", "OBJECTS"), [(kind, len(paths)) for kind, paths
                                          in sorted(report.removed.items())], args.json)
    if args.json:
        return
    total = sum(len(paths) for paths in report.removed.values())
    print(f"removed {total} object{'s' if total != 1 else ''}")
    if args.verbose:
        for paths in report.removed.values():
            print("\n".join(paths))


def _verify(args: argparse.Namespace) -> None:
    from ..admin.verify import verify

    log = _open(args.root)
    with _Progress("verified", "partitions") as progress:
        reports = verify(log, args.topic, progress.update)
    if args.json:
        for r in reports:
            print(json.dumps({"topic": r.topic, "partition": r.partition,
                              "segments": r.segments, "batches": r.batches,
                              "records": r.records, "strays": r.strays,
                              "problems": r.problems}))
    else:
        _print_table(("TOPIC", "PARTITION", "SEGMENTS", "BATCHES", "RECORDS", "PROBLEMS"),
                     [(r.topic, r.partition, r.segments, r.batches, r.records,
                       len(r.problems)) for r in reports])
        for r in reports:
            for problem in r.problems:
                print(f"{r.topic}-{r.partition}: {problem}")
    failed = sum(len(r.problems) for r in reports)
    if failed:
        raise CommandError(f"{failed} problem{'s' if failed != 1 else ''} found")


def _producers(args: argparse.Namespace) -> None:
    log = _open(args.root)
    desc = log.describe_topic(args.topic)
    partitions = range(desc.partitions) if args.partition is None else [args.partition]
    rows = []
    for p in partitions:
        state = log.partition(args.topic, p).state()
        for pid, entry in sorted(state.producers.items()):
            rows.append((p, pid, entry.epoch, entry.last_seq, _utc(entry.last_timestamp),
                         entry.txn_first_offset if entry.in_transaction else "-",
                         entry.transactional_id or "-"))
    _print_table(("PARTITION", "PRODUCER-ID", "EPOCH", "LAST-SEQUENCE", "LAST-TIMESTAMP",
                  "TXN-START-OFFSET", "TRANSACTIONAL-ID"), rows, args.json)


def _utc(ms: int) -> str:
    if ms < 0:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def _groups(args: argparse.Namespace) -> None:
    log = _open(args.root)
    if args.action == "list":
        for group in log.groups():
            print(group)
        return
    if args.action == "delete":
        for group in dict.fromkeys(args.group):
            log.delete_group(group)
            print(f"deleted group {group}")
        return
    committed = log.committed(args.group)
    if not committed:
        raise CommandError(f"group {args.group!r} has no committed offsets in {log.root}")
    rows = []
    for (topic, partition), offset in sorted(committed.items()):
        try:
            b = bounds(log, topic, partition)
        except (UnknownTopicError, UnknownPartitionError):  # e.g. a stream sink's batch key
            rows.append((topic, partition, offset, "-", "-", "-"))
            continue
        rows.append((topic, partition, offset, b.end, b.stable, max(b.end - offset, 0)))
    _print_table(("TOPIC", "PARTITION", "COMMITTED-OFFSET", "LOG-END-OFFSET",
                  "LAST-STABLE-OFFSET", "LAG"), rows, args.json)


_COMMANDS = {"topics": _topics, "produce": _produce, "consume": _consume,
             "offsets": _offsets, "transactions": _transactions, "producers": _producers,
             "dump": _dump, "verify": _verify, "gc": _gc, "groups": _groups,
             "compact": _compact, "retention": _retention}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (0 ok, 1 error, 2 usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _COMMANDS[args.command](args)
    except (TxlogError, CommandError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (``txlog consume ... | head``): not an error.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except OSError as exc:
        # Storage trouble (permissions, a full disk, an unreachable bucket) is
        # just as much an operator's problem to read about in one line.
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
