"""``txlog topics`` and ``txlog offsets``: a topic's life and its partitions' offsets."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..clients.positions import bounds, read_limit
from ..api.log import Log
from ..root.topics import MAX_PARTITIONS, MIN_SEGMENT_BYTES, effective_config
from ..partition.isolation import READ_COMMITTED, READ_UNCOMMITTED
from ..storage.names import MAX_NAME_LENGTH
from .common import (CommandError, LeafParser, config_item, json_option, open_log, positive_int,
                     print_table, scoped_partitions, time_spec, topic_partitions, utc)


def add_topics(commands: Any, leaf_parser: LeafParser) -> None:
    topics = commands.add_parser("topics", help="list, create, describe, alter or delete topics",
                                 description="Manage topics.")
    topic_cmds = topics.add_subparsers(dest="action", metavar="ACTION", required=True)
    leaf_parser(topic_cmds, "list", help="print the name of every topic, one per line",
                description="Print the name of every topic, one per line, sorted.")
    create = leaf_parser(
        topic_cmds, "create", help="create a topic",
        description="Create a topic. The root is created as well if it holds no log yet.")
    create.add_argument("name", metavar="NAME",
                        help="topic name: ASCII letters, digits, '.', '_', '-' "
                             f"(1 to {MAX_NAME_LENGTH})")
    create.add_argument("--partitions", metavar="N", type=positive_int, required=True,
                        help=f"number of partitions (1 to {MAX_PARTITIONS})")
    create.add_argument("--config", metavar="KEY=VALUE", type=config_item, default=[],
                        action="append", help="topic setting, repeatable: message.timestamp.type="
                             "CreateTime|LogAppendTime, max.message.bytes=N, and those "
                             "'topics alter --config' sets")
    describe = leaf_parser(
        topic_cmds, "describe", help="show a topic's settings and per-partition offsets",
        description="Show a topic's partition count, its effective settings (Kafka's "
                    "default marked where the topic sets none), and for each partition its "
                    "log start, log end and last stable offset, and how many segments and "
                    "batch objects (from the compacted end) it holds, with their bytes.")
    describe.add_argument("name", metavar="NAME", help="topic name")
    json_option(describe)
    alter = leaf_parser(
        topic_cmds, "alter", help="add partitions to a topic or change its settings",
        description="Add partitions to a topic (partitions are never removed): existing "
                    "records stay where they are; keyed records sent from now on may hash "
                    "to a new partition, as in Kafka, and readers subscribed to the topic, "
                    "a streaming query included, pick the new partitions up. And/or set or "
                    "remove retention.ms, retention.bytes and segment.bytes (kafka-configs "
                    "--alter --add-config/--delete-config); 'txlog compact' and 'txlog "
                    "retention' read them. And txlog's own txlog.table.sync: true has "
                    "'txlog maintain' sync the topic's Iceberg table before each retention "
                    "run; txlog.table.time-bucket (hour, day or none; default day) is its "
                    "partition spec's time bucket; txlog.table.hold-retention=true keeps "
                    "retention from deleting a segment the table has not taken; txlog.value."
                    "format=json with txlog.value.schema (a JSON object of field name -> "
                    "type) has the sync parse values into typed columns (docs/tables.md).")
    alter.add_argument("name", metavar="NAME", help="topic name")
    alter.add_argument("--partitions", metavar="N", type=positive_int,
                       help="the new total number of partitions (more than now, at most "
                            f"{MAX_PARTITIONS})")
    alter.add_argument("--config", metavar="KEY=VALUE", type=config_item, action="append",
                       default=[],
                       help="set a setting, repeatable: retention.ms=MS, retention.bytes=N "
                            f"(-1: no limit), segment.bytes=N (at least {MIN_SEGMENT_BYTES}), "
                            "txlog.table.sync=true|false, txlog.table.time-bucket=hour|day|"
                            "none, txlog.table.hold-retention=true|false, txlog.value.format"
                            "=none|json, txlog.value.schema=JSON")
    alter.add_argument("--delete-config", metavar="KEY", action="append", default=[],
                       help="remove a setting, back to Kafka's default (repeatable)")
    delete = leaf_parser(
        topic_cmds, "delete", help="delete a topic and all of its data",
        description="Delete a topic: its description first (so no new writer starts), "
                    "then every partition's batches. This cannot be undone.")
    delete.add_argument("name", metavar="NAME", help="topic name")


def add_offsets(commands: Any, leaf_parser: LeafParser) -> None:
    offsets = leaf_parser(
        commands, "offsets", help="show each partition's log end and last stable offset, or "
                                 "with --time the offset for a time",
        description="For each partition of TOPIC print the log end offset (one past the last "
                    "batch written) and the last stable offset (the first offset of the "
                    "earliest undecided transaction, or the log end). With --time, print "
                    "instead the offset Kafka's ListOffsets gives for that time "
                    "(kafka-get-offsets --time): earliest is the log start, latest the "
                    "last stable offset under read_committed and the log end under "
                    "read_uncommitted, and a timestamp the first record at or after it "
                    "below that limit, with its timestamp, or none (-) if there is none.")
    offsets.add_argument("topic", metavar="TOPIC[:P[,P...]]", type=topic_partitions,
                         help="topic name, optionally with the partitions to show")
    offsets.add_argument("--time", metavar="T",
                         help="earliest, latest, epoch milliseconds, or an ISO 8601 "
                              "date-time such as 2024-01-31T10:00:00.000 (UTC unless it ends "
                              "in Z or +HH:MM)")
    offsets.add_argument("--isolation-level", choices=[READ_COMMITTED, READ_UNCOMMITTED],
                         default=READ_COMMITTED,
                         help="for --time: read_committed (default) or read_uncommitted")
    json_option(offsets)


def run_topics(args: argparse.Namespace) -> None:
    if args.action == "create":
        log = open_log(args.root, create=True)
        desc = log.create_topic(args.name, args.partitions, dict(args.config))
        print(f"created topic {desc.name} with {desc.partitions} partition"
              f"{'s' if desc.partitions != 1 else ''}")
        return
    log = open_log(args.root)
    if args.action == "list":
        for name in log.topics():
            print(name)
    elif args.action == "describe":
        desc = log.describe_topic(args.name, refresh=True)
        header, rows = _offset_rows(log, desc.name, list(range(desc.partitions)),
                                   sizes=True)
        config = effective_config(desc)
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
        print(f"created: {utc(desc.created_ms)}")
        print("config: " + ", ".join(f"{k}={v}" + (" (default)" if k in defaults else "")
                                     for k, v in sorted(config.items())))
        print_table(header, rows)
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


def _offset_rows(log: Log, topic: str, partitions: list[int], sizes: bool = False
                 ) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """Per partition its offsets; with ``sizes`` also its log start and what it stores
    (see ``_stored``)."""
    rows: list[tuple[Any, ...]] = []
    for p in partitions:
        b = bounds(log.services, topic, p)
        if not sizes:
            rows.append((p, b.end, b.stable))
            continue
        rows.append((p, b.log_start, b.end, b.stable, *log.partition(topic, p).stored()))
    if sizes:
        return ("PARTITION", "LOG-START-OFFSET", "LOG-END-OFFSET", "LAST-STABLE-OFFSET",
                "SEGMENTS", "SEGMENT-BYTES", "BATCHES", "BATCH-BYTES"), rows
    return ("PARTITION", "LOG-END-OFFSET", "LAST-STABLE-OFFSET"), rows


def run_offsets(args: argparse.Namespace) -> None:
    log = open_log(args.root)
    topic, chosen = args.topic
    if args.time is not None:
        try:
            args.time = time_spec(args.time)
        except argparse.ArgumentTypeError as exc:
            raise CommandError(f"--time: {exc}") from None
    if args.time is None:
        parts = [p for _, p in scoped_partitions(log, topic, chosen)]
        print_table(*_offset_rows(log, topic, parts), args.json)
        return
    rows: list[tuple[Any, ...]] = []
    for _, p in scoped_partitions(log, topic, chosen):
        if args.time == "earliest":
            rows.append((p, log.partition(topic, p).log_start(), "-"))
        elif args.time == "latest":
            rows.append((p, read_limit(log.services, topic, p, args.isolation_level), "-"))
        else:
            hit = log.offsets_for_times(topic, p, args.time, args.isolation_level)
            rows.append((p, *(hit if hit is not None else ("-", "-"))))
    print_table(("PARTITION", "OFFSET", "TIMESTAMP"), rows, args.json)
