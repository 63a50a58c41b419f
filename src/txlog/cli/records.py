"""``txlog produce`` and ``txlog consume``: records from standard input and to standard output."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..partition.isolation import READ_COMMITTED, READ_UNCOMMITTED
from .common import (CommandError, LeafParser, non_negative_int, open_log, positive_int, text,
                     write_bytes)

POLL_RECORDS = 10_000
IDLE_SLEEP_S = 0.1


def add_produce(commands: Any, leaf_parser: LeafParser) -> None:
    produce = leaf_parser(
        commands, "produce", help="write one record per line of standard input",
        description="Read standard input and write one record per line (the line without "
                    "its line ending is the value, as bytes; with --format json, a JSON "
                    "object per line) with an idempotent producer, or with "
                    "--transactional-id in one transaction. Prints how many records went "
                    "to which offsets.")
    produce.add_argument("topic", metavar="TOPIC",
                         help="topic to write to; a missing one is created first if the "
                              "root's auto.create.topics.enable allows it (txlog root-config)")
    keys = produce.add_mutually_exclusive_group()
    keys.add_argument("--key", metavar="K",
                      help="key of every record (UTF-8); records are then partitioned by "
                           "this key, as Kafka does")
    keys.add_argument("--key-separator", metavar="SEP",
                      help="split each line at the first SEP into key and value")
    produce.add_argument("--partition", metavar="P", type=non_negative_int,
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


def add_consume(commands: Any, leaf_parser: LeafParser) -> None:
    consume = leaf_parser(
        commands, "consume", help="print records of a topic",
        description="Print records of a topic. Without --from-beginning, --offset or "
                    "--from-timestamp only records written after the command starts are "
                    "printed (as Kafka's console consumer), so combine it with --timeout-ms "
                    "or --follow. The command stops at the end of the log (the last stable "
                    "offset under read_committed), after --max-records, with --timeout-ms "
                    "after that long without a new record, and with --follow only when "
                    "interrupted. With --group it joins the consumer group (as a Kafka "
                    "consumer that subscribes): the group's members share the topic's "
                    "partitions, and this one reads only those assigned to it, each from "
                    "the group's committed offset (--from-beginning, or the current end, "
                    "for partitions without one). It commits its positions after each batch "
                    "it prints and when it hands a partition over, and leaves the group when "
                    "it stops, so the next run continues where this one stopped.")
    consume.add_argument("topic", metavar="TOPIC", help="topic to read")
    consume.add_argument("--partition", metavar="P", type=non_negative_int,
                         help="read only this partition (default: all)")
    start = consume.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true",
                       help="start at each partition's log start instead of the current end")
    start.add_argument("--offset", metavar="OFFSET", type=non_negative_int,
                       help="start at OFFSET (needs --partition)")
    start.add_argument("--from-timestamp", metavar="MS", type=non_negative_int,
                       help="start in each partition at the first record whose timestamp is "
                            "at least MS (milliseconds since the epoch), or at its end")
    consume.add_argument("--group", metavar="GROUP",
                         help="join this consumer group: read the partitions it assigns "
                              "from its committed offsets and commit as it goes")
    consume.add_argument("--session-timeout-ms", metavar="MS", type=positive_int,
                         default=45000,
                         help="with --group: how long the group waits for this member's "
                              "heartbeat before giving its partitions to others (default "
                              "45000, Kafka's session.timeout.ms)")
    consume.add_argument("--isolation-level", choices=[READ_COMMITTED, READ_UNCOMMITTED],
                         default=READ_COMMITTED,
                         help="read_committed (default) shows committed records only; "
                              "read_uncommitted also shows open and aborted transactions")
    consume.add_argument("--max-records", metavar="N", type=positive_int,
                         help="stop after printing N records")
    waiting = consume.add_mutually_exclusive_group()
    waiting.add_argument("--timeout-ms", metavar="MS", type=non_negative_int, default=0,
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


def run_produce(args: argparse.Namespace) -> None:
    log = open_log(args.root)
    # Created now if missing and the root allows it (as kafka-console-producer's first send
    # has the broker create it), else refused before any input is read.
    log.services.ensure_topic(args.topic)
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
            fields = _line_record(line, number, args, key, separator, before)
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


def _line_record(line: bytes, number: int, args: argparse.Namespace, key: bytes | None,
                 separator: bytes | None, before: Callable[[int], str]) -> dict[str, Any]:
    """One input line as send() arguments: its line ending dropped, then read as JSON,
    split at --key-separator, or taken whole.  Apart from run_produce's producer handling
    (transaction, flushes, abort on failure), which is the same whatever a line holds;
    errors name the line and what became of those before it."""
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
    return fields


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


def run_consume(args: argparse.Namespace) -> None:
    log = open_log(args.root)
    desc = log.describe_topic(args.topic)
    partitions = [args.partition] if args.partition is not None else range(desc.partitions)
    if args.group is not None and (args.offset is not None or args.from_timestamp is not None):
        raise CommandError("--group starts from the group's committed offsets: it cannot be "
                           "combined with --offset or --from-timestamp (reset the group with "
                           "txlog groups reset-offsets instead)")
    if args.group is not None and args.partition is not None:
        raise CommandError("--group joins the group, which assigns the partitions: it cannot "
                           "be combined with --partition")
    consumer = log.consumer(isolation_level=args.isolation_level, group_id=args.group,
                            auto_offset_reset="earliest" if args.from_beginning else "latest")
    if args.group is not None:
        _consume_in_group(log, consumer, args)
        return
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
        _print_records(records, args.format)
        if remaining is not None:
            remaining -= len(records)
        if records:
            last_record = time.monotonic()
            continue
        if not args.follow and (time.monotonic() - last_record) * 1000 >= args.timeout_ms:
            break
        time.sleep(IDLE_SLEEP_S)
    consumer.close()


def _print_records(records: list[Any], fmt: str) -> None:
    for r in records:
        if fmt == "json":
            print(json.dumps({
                "partition": r.partition, "offset": r.offset, "timestamp": r.timestamp,
                "timestamp_type": "LogAppendTime" if r.timestamp_type else "CreateTime",
                "key": text(r.key), "value": text(r.value),
                "headers": [[k, text(v)] for k, v in r.headers]}))
        else:
            write_bytes((r.value or b"") + b"\n")


def _consume_in_group(log: Any, consumer: Any, args: argparse.Namespace) -> None:
    """Consume as a member of ``args.group``: the group decides the partitions, every
    hand-over commits first (at least once: what is committed was printed)."""
    from ..clients.membership import GroupMember
    from ..errors import CommitFailedError

    def commit(parts: list[tuple[str, int]]) -> None:
        sys.stdout.flush()
        offsets = {tp: consumer.position(*tp) for tp in parts if tp in consumer.assignment()}
        if offsets:
            try:
                member.commit(offsets)
            except CommitFailedError as exc:  # the group moved on: the next poll catches up
                print(f"txlog: warning: {exc}", file=sys.stderr)

    class Listener:
        def on_partitions_revoked(self, revoked: list[tuple[str, int]]) -> None:
            commit(revoked)
            consumer.assign(sorted(member.assignment()))

        def on_partitions_assigned(self, assigned: list[tuple[str, int]]) -> None:
            consumer.assign(sorted(member.assignment()))
            for tp in assigned:
                consumer.position(*tp)  # from the committed offset, read after the fence

    session = args.session_timeout_ms
    member = GroupMember(log, args.group, [args.topic], session_timeout_ms=session,
                         heartbeat_interval_ms=max(1, min(3000, session // 3)),
                         client_id="txlog-consume", listener=Listener())
    remaining = args.max_records
    last_record = time.monotonic()

    def terminate(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)  # through the finally below: leave the group

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, terminate)
    try:
        while remaining is None or remaining > 0:
            member.poll()
            records = consumer.poll(min(remaining or POLL_RECORDS, POLL_RECORDS))
            _print_records(records, args.format)
            if remaining is not None:
                remaining -= len(records)
            if records:
                commit(sorted(consumer.assignment()))
                last_record = time.monotonic()
                continue
            if member.waiting():
                last_record = time.monotonic()  # partitions still being handed over to us
            elif not args.follow and \
                    (time.monotonic() - last_record) * 1000 >= args.timeout_ms:
                break
            time.sleep(IDLE_SLEEP_S)
    finally:
        member.close()  # commits what it hands back (revoked) and leaves the group
        consumer.close()
