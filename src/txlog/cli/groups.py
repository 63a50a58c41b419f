"""``txlog groups``: consumer groups' committed offsets, their lag, resetting them, and
deleting groups."""

from __future__ import annotations

import argparse
import json
from typing import Any, TypedDict

from .. import clock
from ..transactions.group_members import (GroupMembership, group_state_name, is_expired,
                                          last_seen_ms)
from ..clients.positions import PartitionBounds, bounds
from ..errors import UnknownPartitionError, UnknownTopicError
from ..api.log import Log
from ..partition.isolation import READ_UNCOMMITTED
from .common import (CommandError, LeafParser, datetime_ms, json_option, non_negative_int,
                     open_log, print_table, scoped_partitions, topic_partitions)


def add_groups(commands: Any, leaf_parser: LeafParser) -> None:
    groups = commands.add_parser("groups", help="list groups, show their offsets and lag, "
                                                "reset them, delete them",
                                 description="Inspect consumer groups, reset their offsets, "
                                             "delete them.")
    group_cmds = groups.add_subparsers(dest="action", metavar="ACTION", required=True)
    leaf_parser(group_cmds, "list", help="print every group id, one per line",
                description="Print every consumer group that has committed offsets, one per "
                            "line, sorted (a streaming sink's <prefix>-sink group included).")
    gdesc = leaf_parser(
        group_cmds, "describe", help="show a group's members, assignment, offsets and lag",
        description="For each partition the group committed an offset for (or assigned to a "
                    "member), print the committed offset, the partition's log end offset, "
                    "its last stable offset and the lag between the committed offset and "
                    "the log end. A group whose consumers join it as members (consume "
                    "--group, GroupMember) also shows, before that table, its state, "
                    "generation, assignor and leader, then one line per member (member id, "
                    "instance id, client id, milliseconds since its last heartbeat, its "
                    "partitions), and the partition table gains the owning member; with "
                    "--json the group is the first line, its members a list in it.")
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
    _add_reset_offsets(group_cmds, leaf_parser)


def _add_reset_offsets(group_cmds: Any, leaf_parser: LeafParser) -> None:
    """``groups reset-offsets``, by far the largest action: its targets and scopes, in
    two argument groups whose combinations _check_reset_options checks."""
    reset = leaf_parser(
        group_cmds, "reset-offsets", help="move a group's committed offsets",
        description="Set a group's committed offsets (kafka-consumer-groups --reset-offsets) "
                    "for the partitions named by --topic or --all-topics. Without --execute "
                    "only prints the plan: topic, partition, current and new offset. Every "
                    "new offset is clamped into [log start, log end], as Kafka does. With "
                    "--execute the new offsets are published as one new version of the "
                    "group. Refused while the group has live members (as Kafka: the group "
                    "must be inactive); consumers that commit without joining the group are "
                    "not seen, so stop those first.")
    reset.add_argument("group", metavar="GROUP", help="group id (must have committed offsets)")
    # Exactly one target and one scope: checked in _check_reset_options, so that a wrong
    # combination is one error line with status 1 like every other bad value.
    target = reset.add_argument_group("target (exactly one)")
    target.add_argument("--to-earliest", action="store_true",
                        help="to each partition's log start offset")
    target.add_argument("--to-latest", action="store_true",
                        help="to each partition's log end offset (as Kafka: open "
                             "transactions' records included)")
    target.add_argument("--to-offset", metavar="N", type=non_negative_int,
                        help="to offset N in every partition")
    target.add_argument("--to-datetime", metavar="ISO8601",
                        help="to the first record whose timestamp is at least this date-time "
                             "(e.g. 2024-01-31T10:00:00.000; UTC unless it ends in Z or "
                             "+HH:MM, where Kafka's tool takes local time), or the log end "
                             "if there is none")
    target.add_argument("--shift-by", metavar="N", type=int,
                        help="move the committed offset by N (negative: back); partitions "
                             "without one are refused")
    scope = reset.add_argument_group("scope (one of)")
    scope.add_argument("--topic", metavar="TOPIC[:P[,P...]]", type=topic_partitions,
                       action="append",
                       help="all partitions of TOPIC, or those listed (repeatable)")
    scope.add_argument("--all-topics", action="store_true",
                       help="every partition the group has a committed offset for")
    reset.add_argument("--execute", action="store_true",
                       help="apply the plan (default: a dry run that changes nothing)")
    json_option(reset)


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
    if args.action == "reset-offsets":
        _reset_offsets(log, args)
        return
    _describe(log, args)


def _describe(log: Log, args: argparse.Namespace) -> None:
    membership = GroupMembership(log.storage, args.group)
    state = membership.latest()
    committed = log.committed(args.group)
    if not committed and state.generation == 0:
        raise CommandError(f"group {args.group!r} has no committed offsets in {log.root}")
    owners = {tp: m for m, parts in state.assignment.items() for tp in parts}
    rows = []
    for topic, partition in sorted(set(committed) | set(owners)):
        offset = committed.get((topic, partition))
        shown = "-" if offset is None else offset
        try:
            b = bounds(log.services, topic, partition)
        except (UnknownTopicError, UnknownPartitionError):  # e.g. a stream sink's batch key
            row: tuple = (topic, partition, shown, "-", "-", "-")
        else:
            lag = "-" if offset is None else b.lag(offset)
            row = (topic, partition, shown, b.end, b.stable, lag)
        rows.append(row + ((owners.get((topic, partition), "-"),) if state.generation else ()))
    header = ("TOPIC", "PARTITION", "COMMITTED-OFFSET", "LOG-END-OFFSET", "LAST-STABLE-OFFSET",
              "LAG")
    if state.generation == 0:  # no member ever joined: offsets only
        print_table(header, rows, args.json)
        return
    beats = membership.heartbeats()
    now = clock.now_ms()
    members: list[_MemberRow] = [{"member_id": m.member_id, "instance_id": m.group_instance_id,
                "client_id": m.client_id, "heartbeat_age_ms": now - last_seen_ms(m, beats),
                "expired": is_expired(m, beats, now),
                "assignment": [list(tp) for tp in state.assignment.get(m.member_id, ())]}
               for m in state.members]
    group_state = group_state_name(state, beats, now)
    if args.json:
        print(json.dumps({"group": args.group, "state": group_state,
                          "generation": state.generation, "protocol": state.protocol,
                          "leader": state.leader, "members": members}))
    else:
        print_table(("GROUP", "STATE", "GENERATION", "PROTOCOL", "LEADER", "MEMBERS"),
                    [(args.group, group_state, state.generation, state.protocol or "-",
                      state.leader or "-", len(members))])
        print()
        print_table(("MEMBER-ID", "INSTANCE-ID", "CLIENT-ID", "HEARTBEAT-AGE-MS", "PARTITIONS"),
                    [(m["member_id"], m["instance_id"] or "-", m["client_id"],
                      f"{m['heartbeat_age_ms']}{' (expired)' if m['expired'] else ''}",
                      ",".join(f"{t}-{p}" for t, p in m["assignment"]) or "-")
                     for m in members])
        print()
    print_table((*header, "CONSUMER-ID"), rows, args.json)


class _MemberRow(TypedDict):
    """A member as ``describe`` prints it (one JSON object with --json)."""

    member_id: str
    instance_id: str | None
    client_id: str
    heartbeat_age_ms: int
    expired: bool
    assignment: list[list[object]]


TARGETS = ("to_earliest", "to_latest", "to_offset", "to_datetime", "shift_by")


def _reset_offsets(log: Log, args: argparse.Namespace) -> None:
    _check_reset_options(args)
    committed = log.committed(args.group)
    if not committed:
        raise CommandError(f"group {args.group!r} has no committed offsets in {log.root}")
    found = {tp: bounds(log.services, *tp) for tp in _reset_scope(log, args, committed)}
    targets = {tp: _target(log, args, b) for tp, b in found.items()}

    def plan(current: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """New offsets from the offsets being replaced (a shift moves what is committed
        at the moment of the publish), clamped into [log start, log end]."""
        new = {}
        for tp, b in found.items():
            if args.shift_by is not None:
                if tp not in current:
                    raise CommandError(f"cannot shift {tp[0]}-{tp[1]}: group {args.group!r} "
                                       "has no committed offset for it")
                wanted = current[tp] + args.shift_by
            else:
                wanted = targets[tp]
            new[tp] = max(b.log_start, min(b.end, wanted))
        return new

    if args.execute:
        before: dict[tuple[str, int], int] = {}

        def step(current: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
            before.clear()
            before.update(current)
            return plan(current)
        new = log.reset_offsets(args.group, step)
    else:
        before, new = committed, plan(committed)
    print_table(("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"),
                [(args.group, t, p, before.get((t, p), "-"), o)
                 for (t, p), o in sorted(new.items())], args.json)


def _check_reset_options(args: argparse.Namespace) -> None:
    """The option combinations argparse's groups cannot express (exactly one target, one
    scope), checked before the log is read so that a wrong one is one error line with
    status 1 like every other bad value; --to-datetime becomes milliseconds here."""
    # Not "in (None, False)": --to-offset 0 and --shift-by 0 are given (0 == False).
    given = [t for t in TARGETS if getattr(args, t) is not None and getattr(args, t) is not False]
    if len(given) != 1:
        names = ", ".join("--" + t.replace("_", "-") for t in TARGETS)
        raise CommandError(f"reset-offsets needs exactly one of {names}"
                           + (f" (got {', '.join('--' + t.replace('_', '-') for t in given)})"
                              if given else ""))
    if bool(args.topic) == args.all_topics:
        raise CommandError("reset-offsets needs --topic TOPIC[:P,...] (repeatable) or "
                           "--all-topics" + (", not both" if args.all_topics else ""))
    if args.to_datetime is not None:
        try:
            args.to_datetime = datetime_ms(args.to_datetime)
        except argparse.ArgumentTypeError as exc:
            raise CommandError(f"--to-datetime: {exc}") from None


def _reset_scope(log: Log, args: argparse.Namespace,
                 committed: dict[tuple[str, int], int]) -> list[tuple[str, int]]:
    """The partitions reset-offsets moves, each once: under --all-topics the group's own
    that are still partitions, else those --topic names (the group may have no offset
    for them yet: a fixed target sets one)."""
    if not args.all_topics:
        return list(dict.fromkeys(tp for topic, parts in args.topic
                                  for tp in scoped_partitions(log, topic, parts)))
    scope = []
    for tp in sorted(committed):
        try:
            log.partition(*tp)
        except (UnknownTopicError, UnknownPartitionError):
            continue  # not a partition (a stream sink's batch key), or deleted since
        scope.append(tp)
    return scope


def _target(log: Log, args: argparse.Namespace, b: PartitionBounds) -> int:
    """The unclamped offset a fixed target names (a shift is computed later)."""
    if args.to_earliest:
        return b.log_start
    if args.to_latest:
        return b.end
    if args.to_offset is not None:
        return args.to_offset
    if args.to_datetime is not None:
        # As Kafka's tool: ListOffsets by time without an isolation level, log end if none.
        hit = log.offsets_for_times(b.topic, b.partition, args.to_datetime, READ_UNCOMMITTED)
        return b.end if hit is None else hit[0]
    return 0  # --shift-by: unused
