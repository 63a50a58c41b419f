"""``txlog dump`` and ``txlog verify``: a root as stored, and whether it holds together."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

from .common import (CommandError, LeafParser, Progress, non_negative_int, open_log, positive_int,
                     print_table, text)


def add_dump(commands: Any, leaf_parser: LeafParser) -> None:
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
    dump.add_argument("partition", metavar="PARTITION", nargs="?", type=non_negative_int,
                      help="partition number")
    dump.add_argument("--object", metavar="PATH",
                      help="dump this one object instead (a path under the root, e.g. "
                           "topics/t/0/00000000000000000000.batch or "
                           "topics/t/0/segments/00000000000000000000.segment)")
    dump.add_argument("--from", dest="start", metavar="OFFSET", type=non_negative_int,
                      default=0, help="start at the batch holding OFFSET")
    dump.add_argument("--max-batches", metavar="N", type=positive_int,
                      help="stop after N batches (those inside segments count)")
    dump.add_argument("--records", action="store_true",
                      help="also print each record (offset, timestamp, key, value, headers)")
    dump.add_argument("--json", action="store_true",
                      help="one JSON object per segment, batch or stray object, each with a "
                           "'kind'")


def add_verify(commands: Any, leaf_parser: LeafParser) -> None:
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


def run_dump(args: argparse.Namespace) -> None:
    from ..admin.dump import BatchDump, SegmentDump, StrayDump, dump_object, dump_partition

    log = open_log(args.root)
    if args.object is not None:
        if args.topic is not None:
            raise CommandError("give either TOPIC PARTITION or --object, not both")
        dumps: Iterator[BatchDump | SegmentDump | StrayDump]
        try:
            dumps = iter([dump_object(log.storage, args.object, with_records=args.records)])
        except FileNotFoundError:
            raise CommandError(f"no object {args.object!r} in {log.root}") from None
    elif args.topic is None or args.partition is None:
        raise CommandError("give TOPIC and PARTITION (or --object PATH)")
    else:
        log.partition(args.topic, args.partition)  # a clear error for an unknown partition
        dumps = dump_partition(log.services, args.topic, args.partition, args.start, args.max_batches,
                               args.records)
    damaged = {"segment": 0, "batch": 0}
    done = 0
    with Progress("dumped", "batches", streams_output=True) as progress:
        for item in dumps:
            inner = item.batches if isinstance(item, SegmentDump) else []
            for d in [item, *inner]:
                kind = str(d.as_dict()["kind"])
                if kind == "batch":
                    done += 1
                    progress.update(done)
                if not isinstance(d, StrayDump) and d.problem is not None:
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
    return [{"offset": base + i, "timestamp": r["timestamp"], "key": text(r["key"]),
             "value": text(r["value"]),
             "headers": [[h["key"], text(h["value"])] for h in r["headers"] or []]}
            for i, r in enumerate(rows)]


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "-" if value is None or value == "" else str(value)


def run_verify(args: argparse.Namespace) -> None:
    from ..admin.verify import verify

    log = open_log(args.root)
    with Progress("verified", "partitions") as progress:
        reports = verify(log.services, args.topic, progress.update)
    if args.json:
        for r in reports:
            print(json.dumps({"topic": r.topic, "partition": r.partition,
                              "segments": r.segments, "batches": r.batches,
                              "records": r.records, "strays": r.strays,
                              "problems": r.problems}))
    else:
        print_table(("TOPIC", "PARTITION", "SEGMENTS", "BATCHES", "RECORDS", "PROBLEMS"),
                     [(r.topic, r.partition, r.segments, r.batches, r.records,
                       len(r.problems)) for r in reports])
        for r in reports:
            for problem in r.problems:
                print(f"{r.topic}-{r.partition}: {problem}")
    failed = sum(len(r.problems) for r in reports)
    if failed:
        raise CommandError(f"{failed} problem{'s' if failed != 1 else ''} found")
