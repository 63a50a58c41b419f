"""Kafka's partition assignors, and how a group chooses one.

Each assignor maps a generation's members (in a fixed order) and the
partitions of the topics they subscribe to onto an assignment.  The results
are deterministic, so whichever member publishes a generation computes the
same assignment that any other member would have (there is no leader round
trip: docs/protocol.md, section 9.1).

* ``range``: per topic, consecutive ranges, the first ``n % m`` members one
  partition more (Kafka's RangeAssignor);
* ``roundrobin``: every partition of every subscribed topic, sorted, dealt
  out in turn, skipping members not subscribed to its topic
  (RoundRobinAssignor);
* ``cooperative-sticky``: balanced like round robin, but every member keeps
  as many of the partitions it owned as balance allows, so a rebalance
  moves only what it must (CooperativeStickyAssignor; its revocation of
  only the moved partitions is done by the generation's ``waiting`` list).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from ..errors import InconsistentGroupProtocolError, InvalidConfigError
from ..transactions.group_members import MemberInfo

TopicPartition = tuple[str, int]
Assignment = dict[str, list[TopicPartition]]

ASSIGNORS = ("range", "roundrobin", "cooperative-sticky")
COOPERATIVE = frozenset({"cooperative-sticky"})


def check_assignors(assignors: Sequence[str]) -> tuple[str, ...]:
    if isinstance(assignors, str) or not assignors:
        raise InvalidConfigError(
            f"assignors (partition.assignment.strategy) must be a non-empty list of "
            f"{', '.join(ASSIGNORS)}, not {assignors!r}")
    for name in assignors:
        if name not in ASSIGNORS:
            raise InvalidConfigError(
                f"unknown partition assignor {name!r} in assignors; txlog has "
                f"{', '.join(ASSIGNORS)}")
    return tuple(dict.fromkeys(assignors))


def select_protocol(members: Sequence[MemberInfo]) -> str:
    """Kafka's GroupMetadata.selectProtocol: among the assignors every member supports,
    each member votes for the first in its own preference order and the most votes
    win; a tie goes to the leader's (the oldest member's) preference."""
    candidates = set(members[0].assignors)
    for m in members[1:]:
        candidates &= set(m.assignors)
    if not candidates:
        raise InconsistentGroupProtocolError(
            "the group's members have no partition assignor in common: "
            + "; ".join(f"{m.member_id} supports {', '.join(m.assignors)}" for m in members))
    votes = Counter(next(a for a in m.assignors if a in candidates) for m in members)
    best = max(votes.values())
    return next(a for a in members[0].assignors if a in candidates and votes[a] == best)


def _order(members: Sequence[MemberInfo]) -> list[MemberInfo]:
    """Kafka sorts members by group.instance.id when they have one, else by member id."""
    return sorted(members, key=lambda m: (m.group_instance_id is None,
                                          m.group_instance_id or "", m.member_id))


def _partitions(topics: Sequence[str], counts: Mapping[str, int]) -> list[TopicPartition]:
    return [(t, p) for t in sorted(set(topics)) for p in range(counts.get(t, 0))]


def range_assign(members: Sequence[MemberInfo], counts: Mapping[str, int]) -> Assignment:
    out: Assignment = {m.member_id: [] for m in members}
    for topic in sorted({t for m in members for t in m.topics}):
        subscribed = [m for m in _order(members) if topic in m.topics]
        n = counts.get(topic, 0)
        per, extra = divmod(n, len(subscribed))
        for i, m in enumerate(subscribed):
            start = per * i + min(i, extra)
            out[m.member_id].extend((topic, p) for p in range(start, start + per + (i < extra)))
    return out


def roundrobin_assign(members: Sequence[MemberInfo], counts: Mapping[str, int]) -> Assignment:
    ordered = _order(members)
    out: Assignment = {m.member_id: [] for m in members}
    i = 0
    for tp in _partitions([t for m in members for t in m.topics], counts):
        for _ in range(len(ordered)):
            m = ordered[i % len(ordered)]
            i += 1
            if tp[0] in m.topics:
                out[m.member_id].append(tp)
                break
    return out


def sticky_assign(members: Sequence[MemberInfo], counts: Mapping[str, int],
                  previous: Mapping[str, Sequence[TopicPartition]]) -> Assignment:
    """Balanced (counts differ by at most one among members that could take a partition)
    and sticky (a member keeps what it owned, up to its share)."""
    ordered = _order(members)
    everything = _partitions([t for m in members for t in m.topics], counts)
    if not ordered:
        return {}
    out: Assignment = {m.member_id: [] for m in ordered}
    subs = {m.member_id: set(m.topics) for m in ordered}
    valid = set(everything)
    low, slots = divmod(len(everything), len(ordered))  # slots: members allowed low + 1
    taken: set[TopicPartition] = set()
    extras: dict[str, list[TopicPartition]] = {}
    for m in ordered:
        owned = [tp for tp in sorted(previous.get(m.member_id, ()))
                 if tuple(tp) in valid and tp[0] in subs[m.member_id] and tuple(tp) not in taken]
        keep = owned[:low]
        out[m.member_id].extend(keep)
        taken.update(keep)
        extras[m.member_id] = owned[low:]
    for m in ordered:
        if slots and extras[m.member_id]:
            tp = extras[m.member_id][0]
            out[m.member_id].append(tp)
            taken.add(tp)
            slots -= 1
    for tp in everything:
        if tp in taken:
            continue
        eligible = [m for m in ordered if tp[0] in subs[m.member_id]]
        target = min(eligible, key=lambda m: len(out[m.member_id]))
        out[target.member_id].append(tp)
        taken.add(tp)
    # Members with different subscriptions: move single partitions from the most to
    # the least loaded member that can take them until no move narrows the spread.
    for _ in range(len(everything)):
        loads = [len(out[m.member_id]) for m in ordered]
        if max(loads) - min(loads) <= 1:
            break  # balanced already (always so when all subscribe to the same topics)
        moved = False
        for giver in sorted(ordered, key=lambda m: -len(out[m.member_id])):
            for tp in sorted(out[giver.member_id], reverse=True):
                takers = [m for m in ordered if tp[0] in subs[m.member_id]
                          and len(out[m.member_id]) + 1 < len(out[giver.member_id])]
                if takers:
                    taker = min(takers, key=lambda m: len(out[m.member_id]))
                    out[giver.member_id].remove(tp)
                    out[taker.member_id].append(tp)
                    moved = True
                    break
            if moved:
                break
        if not moved:
            break
    return {m: sorted(parts) for m, parts in out.items()}


def assign(protocol: str, members: Sequence[MemberInfo], counts: Mapping[str, int],
           previous: Mapping[str, Sequence[TopicPartition]]) -> Assignment:
    """The assignment ``protocol`` computes (``previous``: who owned what before)."""
    if not members:
        return {}
    if protocol == "range":
        return range_assign(members, counts)
    if protocol == "roundrobin":
        return roundrobin_assign(members, counts)
    if protocol == "cooperative-sticky":
        return sticky_assign(members, counts, previous)
    raise InvalidConfigError(f"unknown partition assignor {protocol!r}")
