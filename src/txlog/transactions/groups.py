"""Committed offsets of consumer groups.

Each version of ``coordinator/groups/<group id>/`` holds the group's whole
committed map, so reading is one object.  Transactional offsets are applied
when their transaction completes; every application records, per
transactional id, the generation (metadata version) it came from, so a
process that rolls forward an old transaction late can never move offsets
back over a newer commit.

Deleting a group (kafka-consumer-groups --delete) publishes one more
version, a tombstone: no offsets and ``deleted: true``.  Only gc removes
versions, never the newest and only once its successor is old (the chain's
exclusive publish relies on the predecessor being there; docs/protocol.md,
section 8), and the tombstone keeps the ``txn_marks``, so a late
roll-forward of a transaction whose offsets were applied before the delete
cannot bring them back.  The next
commit starts the group afresh; that includes a transaction decided before
the delete whose offsets are only applied after it, exactly as if it had
committed after the delete.

A group with members (clients/membership.py) also records the newest
``generation`` a member has fenced it with and the transactional offset
sends still pending under a generation (``pending_txns``): a commit or a
transactional send from an older generation is refused here, in the same
exclusive publish that orders it against the fence (docs/protocol.md,
section 9.4).

A group may record an ``owner``: the one writer whose progress it holds (a
stream sink's query, txlog.exactly_once.stream_sink).  Every version carries
it forward; a delete drops it with the offsets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .. import clock
from ..storage.chain import VersionChain
from ..errors import CommitFailedError, InvalidConfigError, UnknownGroupError
from ..integers import is_int
from ..storage.names import validate_name
from ..storage.contract import Storage
from ..storage.paths import GROUP_DIR


def _chain(storage: Storage, group_id: str) -> VersionChain:
    validate_name(group_id, "group id")
    return VersionChain(storage, f"{GROUP_DIR}/{group_id}")


def check_offsets(offsets: dict[tuple[str, int], int]) -> None:
    for key, offset in offsets.items():
        if not (isinstance(key, tuple) and len(key) == 2):
            raise InvalidConfigError(f"offset keys must be (topic, partition) tuples, not {key!r}")
        validate_name(key[0], "topic")
        if not is_int(offset) or offset < 0:
            raise InvalidConfigError(
                f"offset for {key[0]}-{key[1]} must be a non-negative int, not {offset!r}")


TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, int]


@dataclass(frozen=True, order=True)
class TxnMark:
    """The generation a transactional id's offsets were last applied from: its
    chain's incarnation and the metadata version.  Stored as the bare version
    when the incarnation is 0 (chains written before incarnations were
    recorded), as a pair otherwise."""

    incarnation_ms: int
    version: int

    def to_value(self) -> int | list[int]:
        return [self.incarnation_ms, self.version] if self.incarnation_ms else self.version

    @classmethod
    def from_value(cls, mark: object) -> TxnMark:
        if isinstance(mark, list):
            return cls(mark[0], mark[1])
        return cls(0, mark if isinstance(mark, int) else -1)


NO_MARK = TxnMark(0, -1)  # an id whose offsets were never applied


@dataclass(frozen=True)
class PendingSend:
    """A transactional offset send registered under a group generation (KIP-447),
    stored as ``[producer id, epoch, generation, member id, [[topic, partition]...]]``."""

    producer_id: int
    epoch: int
    generation: int
    member_id: str
    partitions: tuple[TopicPartition, ...]  # sorted

    @property
    def writer(self) -> tuple[int, int]:
        return (self.producer_id, self.epoch)

    @property
    def key(self) -> tuple[int, int, int]:
        """What makes two registrations one: the same transaction, the same generation."""
        return (self.producer_id, self.epoch, self.generation)

    def to_value(self) -> list[Any]:
        return [self.producer_id, self.epoch, self.generation, self.member_id,
                [list(tp) for tp in self.partitions]]

    @classmethod
    def from_value(cls, entry: list[Any]) -> PendingSend:
        return cls(entry[0], entry[1], entry[2], entry[3], tuple((t, p) for t, p in entry[4]))


@dataclass(frozen=True)
class GroupOffsets:
    """One version of a group's chain: its committed offsets, the marks of the
    transactions applied to them, its owner, its generation fence (-1: none)
    and the sends pending under it; a tombstone is ``deleted``.

    Every transition is the next version, stamped now; a tombstone's next
    version starts the group afresh but keeps its marks and fence.
    """

    offsets: Offsets = field(default_factory=dict)
    txn_marks: dict[str, TxnMark] = field(default_factory=dict)
    time_ms: int = -1
    owner: str | None = None
    generation: int = -1
    pending: dict[str, PendingSend] = field(default_factory=dict)
    deleted: bool = False

    @property
    def live_owner(self) -> str | None:
        return None if self.deleted else self.owner

    def _next(self, **changes: Any) -> GroupOffsets:
        kept = {"owner": self.live_owner, "deleted": False, **changes}
        return replace(self, time_ms=clock.now_ms(), **kept)

    def committed(self, offsets: Offsets, generation: int | None) -> GroupOffsets:
        """``offsets`` merged in; a member's commit raises the fence to its generation."""
        fence = self.generation if generation is None else max(self.generation, generation)
        return self._next(offsets={**self.offsets, **offsets}, generation=fence)

    def tombstone(self) -> GroupOffsets:
        return self._next(offsets={}, owner=None, deleted=True)

    def reset(self, offsets: Offsets, fence_to: int | None,
              forget: tuple[tuple[str, int], ...] = ()) -> GroupOffsets:
        """``offsets`` set and those of ``forget`` dropped (Kafka's OffsetDelete)."""
        fence = self.generation if fence_to is None else max(self.generation, fence_to)
        kept = {tp: o for tp, o in {**self.offsets, **offsets}.items() if tp not in forget}
        return self._next(offsets=kept, generation=fence)

    def mark_of(self, transactional_id: str) -> TxnMark:
        return self.txn_marks.get(transactional_id, NO_MARK)

    def applied(self, transactional_id: str, offsets: Offsets, mark: TxnMark,
                writer: tuple[int, int] | None) -> GroupOffsets:
        """A transaction's offsets applied, marked, and its pending send (of ``writer``)
        cleared."""
        pending = self.pending
        sent = pending.get(transactional_id)
        if sent is not None and writer is not None and sent.writer == tuple(writer):
            pending = {t: s for t, s in pending.items() if t != transactional_id}
        return self._next(offsets={**self.offsets, **offsets},
                          txn_marks={**self.txn_marks, transactional_id: mark}, pending=pending)

    def owned_by(self, owner: str, offsets: Offsets) -> GroupOffsets:
        return self._next(owner=owner, offsets=offsets)

    def registered(self, transactional_id: str, send: PendingSend) -> GroupOffsets | None:
        """``send`` registered (its partitions joined to a registration of the same
        transaction and generation); None if registered already."""
        old = self.pending.get(transactional_id)
        if old is not None and old.key == send.key:
            merged = tuple(sorted(set(old.partitions) | set(send.partitions)))
            if len(merged) == len(old.partitions) and self.generation >= send.generation:
                return None
            send = replace(send, partitions=merged)
        return self._next(pending={**self.pending, transactional_id: send},
                          generation=max(self.generation, send.generation))

    def fenced_at(self, generation: int) -> GroupOffsets:
        return self._next(generation=generation)

    def without_pending(self, transactional_ids: list[str]) -> GroupOffsets:
        return self._next(pending={t: s for t, s in self.pending.items()
                                   if t not in transactional_ids})

    def to_value(self) -> dict[str, Any]:
        value: dict[str, Any] = {
            "offsets": [[t, p, o] for (t, p), o in sorted(self.offsets.items())],
            "txn_marks": {t: mark.to_value() for t, mark in self.txn_marks.items()},
            "time_ms": self.time_ms}
        if self.owner is not None:
            value["owner"] = self.owner
        if self.generation >= 0:
            value["generation"] = self.generation
        if self.pending:
            value["pending_txns"] = {t: send.to_value() for t, send in self.pending.items()}
        if self.deleted:
            value["deleted"] = True
        return value

    @classmethod
    def from_value(cls, value: dict[str, Any]) -> GroupOffsets:
        return cls({(t, p): o for t, p, o in value["offsets"]},
                   {t: TxnMark.from_value(m) for t, m in value["txn_marks"].items()},
                   value["time_ms"], value.get("owner"), value.get("generation", -1),
                   {t: PendingSend.from_value(e)
                    for t, e in value.get("pending_txns", {}).items()},
                   value.get("deleted", False))


NO_GROUP = GroupOffsets()  # what a group with no version starts from


def _read(storage: Storage, group_id: str) -> tuple[int, GroupOffsets | None]:
    version, value = _chain(storage, group_id).latest()
    return version, None if value is None else GroupOffsets.from_value(value)


def _update(storage: Storage, group_id: str,
            step: Callable[[GroupOffsets | None], GroupOffsets | None]) -> None:
    """Publish the version ``step`` computes from the newest (None: no change)."""
    def chain_step(version: int, value: dict | None) -> dict | None:
        new = step(None if value is None else GroupOffsets.from_value(value))
        return None if new is None else new.to_value()

    _chain(storage, group_id).update(chain_step)


def _refuse_stale(group_id: str, group: GroupOffsets | None, generation: int,
                  what: str) -> None:
    fenced = -1 if group is None else group.generation
    if generation < fenced:
        raise CommitFailedError(
            f"{what} for group {group_id!r} refused: generation {generation} is stale, the "
            f"group has moved on to generation {fenced} (a rebalance happened or the member "
            "was removed); rejoin the group and retry")


def _existing(group_id: str, group: GroupOffsets | None) -> GroupOffsets:
    if group is None or group.deleted:
        raise UnknownGroupError(f"group {group_id!r} does not exist"
                                + (" (it was deleted)" if group is not None else ""))
    return group


def group_ids(storage: Storage) -> list[str]:
    """Every group that has committed offsets and is not deleted, sorted (reads the
    newest version of each group)."""
    return list(every_group_offsets(storage))


def every_group_offsets(storage: Storage) -> dict[str, dict[tuple[str, int], int]]:
    """Every group that is not deleted, sorted, with its committed offsets: one read of
    each group's newest version, where ``group_ids`` then ``committed_offsets`` would
    read it twice (an operator's scrape, txlog metrics)."""
    found = {}
    for group_id in sorted(storage.list(GROUP_DIR)):
        group = _read(storage, group_id)[1]
        if group is not None and not group.deleted:
            found[group_id] = dict(group.offsets)
    return found


def delete_group(storage: Storage, group_id: str) -> None:
    """Forget a group's committed offsets: publish a tombstone version of its chain.

    UnknownGroupError if it has no version, or its newest is a tombstone already.
    """
    _update(storage, group_id, lambda group: _existing(group_id, group).tombstone())


def read_group(storage: Storage, group_id: str) -> GroupOffsets | None:
    """The group's newest version (None if it has none)."""
    return _read(storage, group_id)[1]


def committed_offsets(storage: Storage, group_id: str,
                      partitions: list[tuple[str, int]] | None = None
                      ) -> dict[tuple[str, int], int]:
    group = _read(storage, group_id)[1]
    offsets = {} if group is None else dict(group.offsets)
    if partitions is None:
        return offsets
    return {tp: offsets[tp] for tp in map(tuple, partitions) if tp in offsets}


def commit_offsets(storage: Storage, group_id: str, offsets: dict[tuple[str, int], int],
                   generation: int | None = None) -> None:
    """Merge ``offsets`` into the group's committed map.

    With a ``generation`` (a member's commit), refuse it with CommitFailedError
    if a member of a newer generation has fenced the group: the check and the
    publish are one exclusive publish, so a stale commit can never land after
    the new owner read the offsets (docs/protocol.md, section 9.4).  Without
    one it is a simple consumer's commit (Kafka's generation -1), as before.
    """
    check_offsets(offsets)

    def step(group: GroupOffsets | None) -> GroupOffsets:
        if generation is not None:
            _refuse_stale(group_id, group, generation, "offset commit")
        return (group or NO_GROUP).committed(offsets, generation)

    _update(storage, group_id, step)


class StaleGroupFence(Exception):
    """A member fenced the group between an inactivity check and a reset: check again."""


OffsetsStep = Callable[[dict[tuple[str, int], int]], dict[tuple[str, int], int]]


def reset_offsets(storage: Storage, group_id: str, step: OffsetsStep,
                  fenced_at: int | None = None, fence_to: int | None = None,
                  forget: tuple[tuple[str, int], ...] = ()) -> dict[tuple[str, int], int]:
    """Replace some of an existing group's offsets (txlog groups reset-offsets) in one version.

    ``step`` gets the offsets of the version being replaced (so a shift is
    relative to what is committed at the moment of the publish, not to an
    earlier read) and returns the partitions to set; it may raise to refuse,
    and is called again if a concurrent commit wins the race.  The new
    version keeps ``txn_marks``: a late roll-forward of a transaction whose
    offsets were applied before the reset is skipped and cannot undo it.
    Returns what was set.  UnknownGroupError for a group with no version or
    a deleted one.  With ``fenced_at``, StaleGroupFence if the group's
    generation fence is no longer that one (a member joined since the caller
    found the group inactive: section 9.5); ``fence_to`` raises the fence in
    the same version, so no member of an older generation can commit after.
    ``forget``: partitions whose offsets the version drops (an admin client's
    delete_group_offsets); their transactions' marks stay, as for a reset.
    """
    applied: dict[tuple[str, int], int] = {}

    def update(found: GroupOffsets | None) -> GroupOffsets:
        group = _existing(group_id, found)
        if fenced_at is not None and group.generation != fenced_at:
            raise StaleGroupFence(group_id)
        new = step(dict(group.offsets))
        check_offsets(new)
        applied.clear()
        applied.update(new)
        return group.reset(new, fence_to, forget)

    _update(storage, group_id, update)
    return applied


def apply_transactional_offsets(storage: Storage, group_id: str,
                                offsets: dict[tuple[str, int], int], transactional_id: str,
                                generation: int, writer: tuple[int, int] | None = None,
                                incarnation_ms: int = 0) -> None:
    """Apply a committed transaction's offsets once, and never after a newer one.

    ``generation`` is the transaction's metadata version (not a group
    generation), taken with the chain's incarnation: a transactional id whose
    chain was deleted and started again at version 0 has a later incarnation,
    so its commits are never taken for ones already applied.  The group
    generation is deliberately not checked here: the transaction is already
    decided COMMIT, its records are visible, and refusing its offsets now
    would deliver them twice.  A stale member's transaction is stopped before
    its decision instead (section 9.4).  ``writer``, the transaction's
    (producer id, epoch), clears its pending registration.
    """
    mark = TxnMark(incarnation_ms, generation)

    def step(found: GroupOffsets | None) -> GroupOffsets | None:
        group = found or NO_GROUP
        if group.mark_of(transactional_id) >= mark:
            return None
        return group.applied(transactional_id, offsets, mark, writer)

    _update(storage, group_id, step)


def group_owner(storage: Storage, group_id: str) -> str | None:
    """The group's recorded owner (a stream sink's query), None if it has none."""
    group = _read(storage, group_id)[1]
    return None if group is None else group.live_owner


OwnerStep = Callable[[str | None, dict[tuple[str, int], int]],
                     tuple[str, dict[tuple[str, int], int]] | None]


def set_owner(storage: Storage, group_id: str, step: OwnerStep) -> None:
    """Change a group's owner (and its offsets with it) in one version, or keep both.

    ``step`` gets the current owner and offsets and returns the new pair, or
    None to leave the group as it is; it may raise to refuse.  The chain's
    exclusive publish serialises it with every commit and every other
    claim, so two claimants can never both believe they own the group.
    """
    def update(found: GroupOffsets | None) -> GroupOffsets | None:
        group = found or NO_GROUP
        changed = step(group.live_owner, {} if group.deleted else dict(group.offsets))
        if changed is None:
            return None
        return group.owned_by(*changed)

    _update(storage, group_id, update)


# --- generation fencing of members' commits (docs/protocol.md, section 9.4) ---------------------

def register_transactional_offsets(storage: Storage, group_id: str, transactional_id: str,
                                   writer: tuple[int, int], generation: int, member_id: str,
                                   partitions: list[tuple[str, int]]) -> None:
    """Record that ``transactional_id``'s open transaction will commit offsets of
    ``partitions`` for ``generation`` (KIP-447's TxnOffsetCommit with a generation).

    Refused with CommitFailedError if the group is fenced at a newer
    generation.  Recorded before the offsets join the transaction, so a new
    owner that fences the group afterwards finds the transaction here and
    resolves it (aborts it if undecided) before it reads the offsets.
    Generation -1 is a send without one (a simple producer's): never refused,
    recorded so that an offset fetch finds its transaction (stable_offsets.py).
    """
    send = PendingSend(writer[0], writer[1], generation, member_id,
                       tuple(sorted((t, p) for t, p in partitions)))

    def step(group: GroupOffsets | None) -> GroupOffsets | None:
        if generation >= 0:
            _refuse_stale(group_id, group, generation, "transactional offset commit")
        return (group or NO_GROUP).registered(transactional_id, send)

    _update(storage, group_id, step)


PendingTxn = tuple[str, int, int, int]  # transactional id, producer id, epoch, generation


def fence_generation(storage: Storage, group_id: str, generation: int,
                     partitions: list[tuple[str, int]]) -> list[PendingTxn]:
    """Raise the group's fence to ``generation`` (no-op if it is there already) and
    return the pending transactional sends of older generations that name any of
    ``partitions``: the caller must resolve them before reading those offsets."""
    found: list[PendingTxn] = []
    wanted = {tuple(tp) for tp in partitions}

    def step(current: GroupOffsets | None) -> GroupOffsets | None:
        group = current or NO_GROUP
        found.clear()
        for tid, send in group.pending.items():
            # A send without a generation (-1) is a simple producer's: no member's, so
            # no take-over fences it; an offset fetch rolls it forward (stable_offsets.py).
            if 0 <= send.generation < generation and wanted & set(send.partitions):
                found.append((tid, send.producer_id, send.epoch, send.generation))
        if group.generation >= generation:
            return None
        return group.fenced_at(generation)

    _update(storage, group_id, step)
    return found


def drop_pending(storage: Storage, group_id: str, resolved: list[PendingTxn]) -> None:
    """Forget pending sends that have been resolved (if still registered as they were)."""
    def step(current: GroupOffsets | None) -> GroupOffsets | None:
        group = current or NO_GROUP
        gone = [tid for tid, pid, epoch, gen in resolved
                if tid in group.pending and group.pending[tid].key == (pid, epoch, gen)]
        if not gone:
            return None
        return group.without_pending(gone)

    if resolved:
        _update(storage, group_id, step)


def fence_state(storage: Storage, group_id: str) -> tuple[int, int]:
    """(chain version, fenced generation) of the group's offsets, (-1, -1) if none."""
    version, group = _read(storage, group_id)
    return version, -1 if group is None else group.generation
