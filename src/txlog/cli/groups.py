"""``txlog groups``: consumer groups' committed offsets, their lag, and deleting groups."""

from __future__ import annotations

import argparse
from typing import Any

from ..clients.positions import bounds
from ..errors import UnknownPartitionError, UnknownTopicError
from .common import CommandError, LeafParser, json_option, open_log, print_table


def add_groups(commands: Any, leaf_parser: LeafParser) -> None:
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
    json_option(gdesc)
    gdelete = leaf_parser(
        group_cmds, "delete", help="forget groups' committed offsets",
        description="Delete consumer groups (kafka-consumer-groups --delete): their committed "
                    "offsets are forgotten, so they are no longer listed or described, and "
                    "a later commit starts them afresh. Stop the group's consumers first: "
                    "nothing checks for them, and a streaming sink's <prefix>-sink group "
                    "also records which micro-batches it wrote.")
    gdelete.add_argument("group", metavar="GROUP", nargs="+", help="group id")


def run_groups(args: argparse.Namespace) -> None:
    log = open_log(args.root)
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
    print_table(("TOPIC", "PARTITION", "COMMITTED-OFFSET", "LOG-END-OFFSET",
                  "LAST-STABLE-OFFSET", "LAG"), rows, args.json)
