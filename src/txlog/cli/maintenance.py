"""``txlog compact``, ``txlog retention``, ``txlog gc`` and ``txlog delete-records``: keeping a
root small while it runs."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..admin.gc import (DEFAULT_CHAIN_AGE_S, DEFAULT_DATA_AGE_S, DEFAULT_DECISION_AGE_S,
                        DEFAULT_TEMP_AGE_S, DEFAULT_TXN_ID_EXPIRATION_MS)
from ..partition.compaction import DEFAULT_BUFFER_BYTES, DEFAULT_MIN_BATCHES
from ..integers import is_int
from ..storage.paths import TMP_PREFIX
from .common import (CommandError, LeafParser, Progress, json_option, maintained_partitions,
                     non_negative_int, open_log, partitions_option, positive_int, print_table)


def add_compact(commands: Any, leaf_parser: LeafParser) -> None:
    compact = leaf_parser(
        commands, "compact", help="merge each partition's oldest batch objects into segments",
        description="Copy each partition's oldest run of batch objects, byte for byte, into "
                    "segments of at most the topic's segment.bytes, then delete the batch "
                    "objects they replace; then merge runs of adjacent small segments into "
                    "one. Safe while producers and consumers run. Prints "
                    "per partition the segments made, the batches merged into them, their "
                    "bytes, and the partition's objects (segments and batch objects) before "
                    "and after.")
    partitions_option(compact)
    compact.add_argument("--min-batches", metavar="N", type=positive_int,
                         default=DEFAULT_MIN_BATCHES,
                         help="make no segment of fewer batches than this, unless the "
                              "next batch would not fit in segment.bytes "
                              f"(default {DEFAULT_MIN_BATCHES})")
    compact.add_argument("--lag", metavar="N", type=non_negative_int, default=0,
                         help="leave the newest N offsets of each partition as batch objects "
                              "(default 0)")
    compact.add_argument("--buffer-bytes", metavar="BYTES", type=positive_int,
                         default=DEFAULT_BUFFER_BYTES,
                         help="memory a compaction may use for the segment it streams into "
                              "storage, besides one batch (an S3 upload part: at least 5 MiB "
                              f"there); not segment.bytes (default {DEFAULT_BUFFER_BYTES})")
    json_option(compact)


def add_retention(commands: Any, leaf_parser: LeafParser) -> None:
    retention = leaf_parser(
        commands, "retention", help="delete the oldest segments that retention allows",
        description="Apply the topic's retention.ms and retention.bytes: delete whole "
                    "segments from each partition's log start while their newest record is "
                    "older than retention.ms or the partition without them still holds "
                    "retention.bytes (-1 disables a rule; the newest segment always stays; "
                    "batch objects are never deleted, so compact first). Prints per "
                    "partition the segments deleted, their bytes and the new log start "
                    "offset.")
    partitions_option(retention)
    json_option(retention)


def add_gc(commands: Any, leaf_parser: LeafParser) -> None:
    gc = leaf_parser(
        commands, "gc", help="remove coordinator state and leftovers nobody needs any more",
        description="Remove what no reader or writer will use again, while they run: "
                    "versions of transaction-metadata, group and lease chains superseded "
                    "longer ago than --chain-age (the newest always stays); decisions no "
                    "unfinished transaction follows (shared ones also older than "
                    "--decision-age); leases of decided transactions; producer-id blocks "
                    "but the newest; batch files and snapshots that segments cover; temp "
                    f"files ({TMP_PREFIX}*) of dead local publishes older than --temp-age; "
                    "data objects no claim points into, older than --data-age; "
                    "transactional ids idle longer than --transactional-id-expiration-ms "
                    "become Dead, and Dead ones are deleted whole. "
                    "docs/protocol.md section 8 says why each removal is safe.")
    add_gc_ages(gc)
    gc.add_argument("--verbose", action="store_true", help="also print every removed path")
    json_option(gc)


def add_gc_ages(parser: argparse.ArgumentParser) -> None:
    """gc's ages and expiration, shared by ``txlog gc`` and ``txlog maintain``'s gc step."""
    chain_age, decision_age = int(DEFAULT_CHAIN_AGE_S), int(DEFAULT_DECISION_AGE_S)
    temp_age = int(DEFAULT_TEMP_AGE_S)
    parser.add_argument("--chain-age", metavar="SECONDS", type=non_negative_int, default=chain_age,
                    help="only chain versions whose successor is older than this "
                         f"(default {chain_age})")
    parser.add_argument("--decision-age", metavar="SECONDS", type=non_negative_int,
                    default=decision_age,
                    help="only decisions of shared transactions older than this "
                         f"(default {decision_age}, {decision_age // 86400} days)")
    parser.add_argument("--temp-age", metavar="SECONDS", type=non_negative_int, default=temp_age,
                    help=f"only temp files older than this (default {temp_age})")
    data_age = int(DEFAULT_DATA_AGE_S)
    parser.add_argument("--data-age", metavar="SECONDS", type=non_negative_int, default=data_age,
                    help="only unreferenced data objects older than this (default "
                         f"{data_age}; less than 600 is safe only while nobody writes)")
    expiry = DEFAULT_TXN_ID_EXPIRATION_MS
    parser.add_argument("--transactional-id-expiration-ms", metavar="MS", type=non_negative_int,
                    default=expiry,
                    help="retire transactional ids idle (no open transaction) for longer "
                         f"than this, Kafka's transactional.id.expiration.ms (default "
                         f"{expiry}, {expiry // 86_400_000} days)")


def add_delete_records(commands: Any, leaf_parser: LeafParser) -> None:
    delete = leaf_parser(
        commands, "delete-records", help="move partitions' log start offsets forward",
        description="Move the log start offset of partitions forward, as Kafka's "
                    "kafka-delete-records.sh does: records below it are refused to every "
                    "reader from then on (OffsetOutOfRange; consumers reset by "
                    "auto_offset_reset), and retention deletes the segments that lie wholly "
                    "below it. Either --offset-json-file (Kafka's format: {\"partitions\": "
                    "[{\"topic\": \"t\", \"partition\": 0, \"offset\": 10}], \"version\": 1}) "
                    "or TOPIC with --offset. An offset of -1 means the log end; an offset past "
                    "the log end is refused, one at or below the log start changes nothing. "
                    "Every entry is checked before any log start moves. Prints each "
                    "partition's log start after the call (its low watermark).")
    delete.add_argument("topic", metavar="TOPIC", nargs="?",
                        help="topic name (with --offset; not with --offset-json-file)")
    delete.add_argument("--partition", metavar="N", type=non_negative_int, action="append",
                        help="with TOPIC: only this partition (repeatable; default: all)")
    delete.add_argument("--offset", metavar="N", type=int,
                        help="with TOPIC: the new log start offset (-1: the log end)")
    delete.add_argument("--offset-json-file", metavar="FILE",
                        help="a JSON file naming topic, partition and offset per partition")
    json_option(delete)


def _delete_records_plan(args: argparse.Namespace, log: Any) -> dict[tuple[str, int], int]:
    """The (topic, partition) -> offset map the arguments ask for, checked for shape."""
    if args.offset_json_file is not None:
        if args.topic is not None or args.offset is not None or args.partition:
            raise CommandError("delete-records takes either --offset-json-file or TOPIC with "
                               "--offset, not both")
        try:
            with open(args.offset_json_file, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            raise CommandError(f"--offset-json-file {args.offset_json_file}: {exc}") from None
        entries = doc.get("partitions") if isinstance(doc, dict) else None
        if not isinstance(entries, list) or not entries:
            raise CommandError(f"--offset-json-file {args.offset_json_file}: expected "
                               '{"partitions": [{"topic": ..., "partition": ..., "offset": '
                               "...}, ...]} with at least one entry")
        plan: dict[tuple[str, int], int] = {}
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("topic"), str) or \
                    not is_int(entry.get("partition")) or not is_int(entry.get("offset")):
                raise CommandError(f"--offset-json-file {args.offset_json_file}: entry {i} "
                                   f"({json.dumps(entry)}) needs a string topic and integer "
                                   "partition and offset")
            tp = (entry["topic"], entry["partition"])
            if tp in plan:
                raise CommandError(f"--offset-json-file {args.offset_json_file}: partition "
                                   f"{tp[0]}-{tp[1]} is named twice")
            plan[tp] = entry["offset"]
        return plan
    if args.topic is None or args.offset is None:
        raise CommandError("delete-records needs --offset-json-file, or TOPIC and --offset")
    return {(args.topic, p): args.offset
            for p in maintained_partitions(log, args.topic, args.partition)}


def run_delete_records(args: argparse.Namespace) -> None:
    log = open_log(args.root)
    low = log.delete_records(_delete_records_plan(args, log))
    print_table(("TOPIC", "PARTITION", "LOW-WATERMARK"),
                [(t, p, offset) for (t, p), offset in low.items()], args.json)


def run_compact(args: argparse.Namespace) -> None:
    log = open_log(args.root)
    rows = []
    partitions = maintained_partitions(log, args.topic, args.partition)
    with Progress("compacted", "partitions") as progress:
        for p in partitions:
            segments, _, batches, _ = log.partition(args.topic, p).stored()
            made = log.compact(args.topic, [p], args.min_batches, args.lag, args.buffer_bytes)[p]
            after = log.partition(args.topic, p).stored()
            rows.append((p, len(made), sum(c.batches for c in made),
                         sum(c.bytes for c in made), segments + batches, after[0] + after[2]))
            progress.update(len(rows), len(partitions))
    print_table(("PARTITION", "SEGMENTS-MADE", "BATCHES-MERGED", "BYTES", "OBJECTS-BEFORE",
                  "OBJECTS-AFTER"), rows, args.json)


def run_retention(args: argparse.Namespace) -> None:
    log = open_log(args.root)
    rows = []
    partitions = maintained_partitions(log, args.topic, args.partition)
    with Progress("retention applied to", "partitions") as progress:
        for p in partitions:
            done = log.apply_retention(args.topic, [p])[p]
            rows.append((p, done.segments_deleted, done.bytes_deleted, done.log_start))
            progress.update(len(rows), len(partitions))
    print_table(("PARTITION", "SEGMENTS-DELETED", "BYTES-DELETED", "LOG-START-OFFSET"), rows,
                 args.json)


def run_gc(args: argparse.Namespace) -> None:
    log = open_log(args.root)
    report = log.gc(chain_age_s=args.chain_age, decision_age_s=args.decision_age,
                    temp_age_s=args.temp_age, data_age_s=args.data_age,
                    txn_id_expiration_ms=args.transactional_id_expiration_ms)
    print_table(("REMOVED", "OBJECTS"), [(kind, len(paths)) for kind, paths
                                          in sorted(report.removed.items())], args.json)
    if args.json:
        return
    total = sum(len(paths) for paths in report.removed.values())
    print(f"removed {total} object{'s' if total != 1 else ''}")
    if args.verbose:
        for paths in report.removed.values():
            print("\n".join(paths))
