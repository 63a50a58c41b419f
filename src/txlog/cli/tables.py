"""``txlog tables``: a topic's Iceberg table, kept by syncs (docs/tables.md).

pyiceberg is an optional extra: it is imported only when a ``tables`` command
runs, so every other command works without it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .common import CommandError, LeafParser, json_option, open_log
from .table_upkeep import ACTIONS as UPKEEP_ACTIONS
from .table_upkeep import add_upkeep, run_upkeep


def add_tables(commands: Any, leaf_parser: LeafParser) -> None:
    tables = commands.add_parser(
        "tables", help="keep a topic's committed records as an Iceberg table",
        description="A topic's committed history as an Iceberg table under the root "
                    "(tables/TOPIC), which pyiceberg, Polars, DuckDB and Spark's Parquet "
                    "reader can read. Needs the tables extra (pyiceberg).")
    table_cmds = tables.add_subparsers(dest="action", metavar="ACTION", required=True)
    sync = leaf_parser(
        table_cmds, "sync", help="append the records committed since the table's last snapshot",
        description="Read every partition read_committed from the offsets the table's newest "
                    "snapshot covers up to cuts that never split a transaction, append the "
                    "records as one snapshot (creating the table on first use) and print per "
                    "partition the offsets it covered before and after, and any range "
                    "retention or delete-records removed before a sync read it. Safe while "
                    "producers run and while other syncs run: a sync that loses the commit "
                    "withdraws its file and starts again from the new offsets. Refuses a "
                    "table built from an earlier incarnation of the topic.")
    sync.add_argument("topic", metavar="TOPIC", help="topic name")
    json_option(sync, help="print it as one JSON object instead")
    describe = leaf_parser(
        table_cmds, "describe", help="print the table's newest metadata file and data files",
        description="Print the newest metadata file of TOPIC's table (what pyiceberg or "
                    "Polars load), its snapshot, topic id and the offsets it covers per "
                    "partition, then every data file (what DuckDB or spark.read.parquet "
                    "read).")
    describe.add_argument("topic", metavar="TOPIC", help="topic name")
    json_option(describe, help="print it as one JSON object instead")
    add_upkeep(table_cmds, leaf_parser)


def run_tables(args: argparse.Namespace) -> None:
    try:
        from pyiceberg.exceptions import NoSuchTableError

        from ..tables import sync
    except ImportError as exc:
        raise CommandError(f"txlog tables needs pyiceberg: pip install 'txlog[tables]' "
                           f"({exc})") from None
    root = open_log(args.root).services
    if args.action == "sync":
        _print_sync(sync.sync_table(root, args.topic), args.json)
        return
    try:
        if args.action in UPKEEP_ACTIONS:
            run_upkeep(args, root)
            return
        described = sync.describe_table(root, args.topic)
    except NoSuchTableError as exc:
        raise CommandError(f"{exc}: 'txlog tables sync {args.topic}' creates it") from None
    _print_description(described, args.json)


def _print_sync(result: Any, as_json: bool) -> None:
    skipped = {str(p): list(r) for p, r in result.skipped.items()}
    if as_json:
        print(json.dumps({"topic": result.topic, "topic_id": result.topic_id,
                          "snapshot_id": result.snapshot_id, "records": result.records,
                          "previous": {str(p): o for p, o in sorted(result.previous.items())},
                          "offsets": {str(p): o for p, o in sorted(result.offsets.items())},
                          "skipped": skipped, "conflicts": result.conflicts,
                          "metadata": result.metadata_location, "files": list(result.files),
                          "value_errors": result.value_errors}))
        return
    for p, end in sorted(result.offsets.items()):
        lost = result.skipped.get(p)
        print(f"partition {p}: offsets {result.previous.get(p, 0)} to {end}" +
              (f"; offsets {lost[0]} to {lost[1]} ({lost[1] - lost[0]}) were gone before "
               "any sync read them" if lost else ""))
    if result.snapshot_id is None:
        print(f"nothing new: the table stays at {result.metadata_location}")
    else:
        print(f"snapshot {result.snapshot_id}: {result.records} records appended "
              f"({result.conflicts} commits lost to other syncs first); metadata "
              f"{result.metadata_location}" + (
                  f"; {result.value_errors} values did not parse (their value_error says why)"
                  if result.value_errors else ""))


def _print_description(desc: Any, as_json: bool) -> None:
    offsets = {str(p): o for p, o in sorted(desc.covered.offsets.items())}
    if as_json:
        print(json.dumps({"topic": desc.topic, "metadata": desc.metadata_location,
                          "snapshot_id": desc.snapshot_id, "topic_id": desc.covered.topic_id,
                          "offsets": offsets, "records": desc.records,
                          "files": list(desc.files)}))
        return
    print(f"metadata {desc.metadata_location}")
    print(f"snapshot {desc.snapshot_id if desc.snapshot_id is not None else '-'}: "
          f"{desc.records} records, topic id {desc.covered.topic_id}, offsets "
          + (", ".join(f"{p}:{o}" for p, o in offsets.items()) or "-"))
    for f in desc.files:
        print(f)
