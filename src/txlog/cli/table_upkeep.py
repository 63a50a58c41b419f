"""``txlog tables compact|expire|purge``: a topic's table kept in shape (docs/tables.md, "Upkeep").

Beside ``cli/tables.py``, which adds these commands to ``txlog tables`` and
hands them here; pyiceberg is imported only when one of them runs.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .common import LeafParser, json_option, non_negative_int, positive_int, positive_seconds

ACTIONS = ("compact", "expire", "purge")


def add_upkeep(table_cmds: Any, leaf_parser: LeafParser) -> None:
    compact = leaf_parser(
        table_cmds, "compact", help="rewrite the table's small data files into larger ones",
        description="In each partition of the table's spec (Kafka partition and time "
                    "bucket) with at least --min-files files below three quarters of the "
                    "target size, rewrite runs of them into files of about the target size, "
                    "as one snapshot that carries the offsets the table covers unchanged. "
                    "Safe while syncs run: a compaction that loses its commit withdraws its "
                    "files and plans again. `txlog maintain` runs it after each sync.")
    compact.add_argument("topic", metavar="TOPIC", help="topic name")
    compact.add_argument("--min-files", metavar="N", type=positive_int,
                         help="small files a partition needs before it is rewritten "
                              "(default: the table's txlog.compact.min-files, else 5)")
    compact.add_argument("--target-file-bytes", metavar="N", type=positive_int,
                         help="size of the files written (default: the table's "
                              "write.target-file-size-bytes, else 128 MiB)")
    json_option(compact, help="print it as one JSON object instead")
    expire = leaf_parser(
        table_cmds, "expire", help="drop old snapshots and the files no snapshot needs",
        description="Expire every snapshot but the newest that was superseded more than "
                    "the age bound ago, then delete every file of the table (data files, "
                    "manifests, manifest lists, metadata files) that no retained snapshot "
                    "names and that is older than the bound, and the table pointer's "
                    "versions superseded that long ago. A reader may hold a snapshot, and a "
                    "writer its files before committing them, for up to the bound. "
                    "`txlog maintain` runs it after each sync.")
    expire.add_argument("topic", metavar="TOPIC", help="topic name")
    expire.add_argument("--age-s", metavar="SECONDS", type=positive_seconds,
                        help="the age bound (default: the table's "
                             "history.expire.max-snapshot-age-ms, else an hour); at least "
                             "the writers' 600 s commit window")
    json_option(expire, help="print it as one JSON object instead")
    purge = leaf_parser(
        table_cmds, "purge", help="remove records below an offset from the table",
        description="Remove from the table every record below --offset in each named "
                    "partition (default: all), by rewriting the data files that hold any "
                    "(the table never holds delete files, which readers of its file list "
                    "would ignore). The topic itself is unchanged (txlog delete-records "
                    "moves its log start); an offset above what the table covers is "
                    "refused, since the next sync would append those records again.")
    purge.add_argument("topic", metavar="TOPIC", help="topic name")
    purge.add_argument("--partition", metavar="N", type=non_negative_int, action="append",
                       help="only this partition (repeatable; default: all)")
    purge.add_argument("--offset", metavar="N", type=non_negative_int, required=True,
                       help="records below this offset go")
    json_option(purge, help="print it as one JSON object instead")


def run_upkeep(args: argparse.Namespace, root: Any) -> None:
    from ..tables.expiry import expire_table
    from ..tables.upkeep import compact_table, purge_table

    if args.action == "expire":  # an --age-s inside the commit window: expire_table refuses
        done = expire_table(root, args.topic, args.age_s)
        _print(args.json, {"topic": done.topic, "snapshots": list(done.snapshots),
                           "files": list(done.files), "pointer_versions":
                           list(done.pointer_versions)},
               f"{len(done.snapshots)} snapshots expired, {len(done.files)} files and "
               f"{len(done.pointer_versions)} pointer versions deleted")
        return
    if args.action == "compact":
        result = compact_table(root, args.topic, args.min_files, args.target_file_bytes)
    else:
        partitions = args.partition or range(root.describe_topic(args.topic).partitions)
        result = purge_table(root, args.topic, {p: args.offset for p in partitions})
    done_what = "nothing to rewrite" if result.snapshot_id is None else (
        f"snapshot {result.snapshot_id}: {len(result.removed)} files rewritten into "
        f"{len(result.added)}, {result.records} records read, {result.kept} kept "
        f"({result.conflicts} commits lost to other writers first)")
    _print(args.json, {"topic": result.topic, "snapshot_id": result.snapshot_id,
                       "removed": list(result.removed), "added": list(result.added),
                       "records": result.records, "kept": result.kept,
                       "conflicts": result.conflicts}, done_what)


def _print(as_json: bool, doc: dict[str, Any], line: str) -> None:
    print(json.dumps(doc) if as_json else line)
