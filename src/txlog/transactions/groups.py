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

from .. import clock
from ..storage.chain import VersionChain
from ..errors import CommitFailedError, InvalidConfigError, UnknownGroupError
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
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise InvalidConfigError(
                f"offset for {key[0]}-{key[1]} must be a non-negative int, not {offset!r}")


def _as_map(value: dict | None) -> dict[tuple[str, int], int]:
    if value is None:
        return {}
    return {(t, p): o for t, p, o in value["offsets"]}


def _encode(offsets: dict[tuple[str, int], int], marks: dict[str, int],
            owner: str | None = None, fence: dict | None = None) -> dict:
    value = {"offsets": [[t, p, o] for (t, p), o in sorted(offsets.items())],
             "txn_marks": marks, "time_ms": clock.now_ms()}
    if owner is not None:
        value["owner"] = owner
    if fence:
        if fence.get("generation", -1) >= 0:
            value["generation"] = fence["generation"]
        if fence.get("pending_txns"):
            value["pending_txns"] = fence["pending_txns"]
    return value


def _fence(value: dict | None) -> dict:
    """The generation fence a version carries forward (a tombstone keeps it too: a
    deleted group's old members must stay refused)."""
    if value is None:
        return {"generation": -1, "pending_txns": {}}
    return {"generation": value.get("generation", -1),
            "pending_txns": dict(value.get("pending_txns", {}))}


def fenced_generation(value: dict | None) -> int:
    """The newest generation a member has fenced the group with, -1 if none."""
    return -1 if value is None else value.get("generation", -1)


def _refuse_stale(group_id: str, value: dict | None, generation: int, what: str) -> None:
    fenced = fenced_generation(value)
    if generation < fenced:
        raise CommitFailedError(
            f"{what} for group {group_id!r} refused: generation {generation} is stale, the "
            f"group has moved on to generation {fenced} (a rebalance happened or the member "
            "was removed); rejoin the group and retry")


def _owner(value: dict | None) -> str | None:
    return value.get("owner") if _live(value) else None  # type: ignore[union-attr]


def _live(value: dict | None) -> bool:
    return value is not None and not value.get("deleted", False)


def group_ids(storage: Storage) -> list[str]:
    """Every group that has committed offsets and is not deleted, sorted (reads the
    newest version of each group)."""
    return sorted(g for g in storage.list(GROUP_DIR) if _live(_chain(storage, g).latest()[1]))


def delete_group(storage: Storage, group_id: str) -> None:
    """Forget a group's committed offsets: publish a tombstone version of its chain.

    UnknownGroupError if it has no version, or its newest is a tombstone already.
    """
    def step(version: int, value: dict | None) -> dict:
        if not _live(value):
            raise UnknownGroupError(f"group {group_id!r} does not exist"
                                    + (" (it was deleted)" if value is not None else ""))
        assert value is not None
        return {**_encode({}, dict(value["txn_marks"]), fence=_fence(value)), "deleted": True}

    _chain(storage, group_id).update(step)


def committed_offsets(storage: Storage, group_id: str,
                      partitions: list[tuple[str, int]] | None = None
                      ) -> dict[tuple[str, int], int]:
    _, value = _chain(storage, group_id).latest()
    offsets = _as_map(value)
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

    def step(version: int, value: dict | None) -> dict:
        fence = _fence(value)
        if generation is not None:
            _refuse_stale(group_id, value, generation, "offset commit")
            fence["generation"] = max(fence.get("generation", -1), generation)
        merged = _as_map(value)
        merged.update(offsets)
        return _encode(merged, dict(value["txn_marks"]) if value else {}, _owner(value), fence)

    _chain(storage, group_id).update(step)


class StaleGroupFence(Exception):
    """A member fenced the group between an inactivity check and a reset: check again."""


OffsetsStep = Callable[[dict[tuple[str, int], int]], dict[tuple[str, int], int]]


def reset_offsets(storage: Storage, group_id: str, step: OffsetsStep,
                  fenced_at: int | None = None, fence_to: int | None = None
                  ) -> dict[tuple[str, int], int]:
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
    """
    applied: dict[tuple[str, int], int] = {}

    def update(version: int, value: dict | None) -> dict:
        if not _live(value):
            raise UnknownGroupError(f"group {group_id!r} does not exist"
                                    + (" (it was deleted)" if value is not None else ""))
        assert value is not None
        if fenced_at is not None and fenced_generation(value) != fenced_at:
            raise StaleGroupFence(group_id)
        current = _as_map(value)
        new = step(dict(current))
        check_offsets(new)
        applied.clear()
        applied.update(new)
        fence = _fence(value)
        if fence_to is not None:
            fence["generation"] = max(fence["generation"], fence_to)
        return _encode({**current, **new}, dict(value["txn_marks"]), _owner(value), fence)

    _chain(storage, group_id).update(update)
    return applied


def _generation(mark: object) -> tuple[int, int]:
    """A mark as (incarnation, version); a plain int is a version of a chain written
    before incarnations were recorded (incarnation 0)."""
    if isinstance(mark, list):
        return (mark[0], mark[1])
    return (0, mark if isinstance(mark, int) else -1)


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
    new = (incarnation_ms, generation)

    def step(version: int, value: dict | None) -> dict | None:
        marks = dict(value["txn_marks"]) if value else {}
        if _generation(marks.get(transactional_id, -1)) >= new:
            return None
        merged = _as_map(value)
        merged.update(offsets)
        marks[transactional_id] = [incarnation_ms, generation] if incarnation_ms else generation
        fence = _fence(value)
        entry = fence.get("pending_txns", {}).get(transactional_id)
        if entry is not None and writer is not None and tuple(entry[:2]) == tuple(writer):
            del fence["pending_txns"][transactional_id]
        return _encode(merged, marks, _owner(value), fence)

    _chain(storage, group_id).update(step)


def group_owner(storage: Storage, group_id: str) -> str | None:
    """The group's recorded owner (a stream sink's query), None if it has none."""
    return _owner(_chain(storage, group_id).latest()[1])


OwnerStep = Callable[[str | None, dict[tuple[str, int], int]],
                     tuple[str, dict[tuple[str, int], int]] | None]


def set_owner(storage: Storage, group_id: str, step: OwnerStep) -> None:
    """Change a group's owner (and its offsets with it) in one version, or keep both.

    ``step`` gets the current owner and offsets and returns the new pair, or
    None to leave the group as it is; it may raise to refuse.  The chain's
    exclusive publish serialises it with every commit and every other
    claim, so two claimants can never both believe they own the group.
    """
    def update(version: int, value: dict | None) -> dict | None:
        changed = step(_owner(value), _as_map(value) if _live(value) else {})
        if changed is None:
            return None
        owner, offsets = changed
        return _encode(offsets, dict(value["txn_marks"]) if value else {}, owner, _fence(value))

    _chain(storage, group_id).update(update)


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
    """
    entry = [writer[0], writer[1], generation, member_id,
             sorted([t, p] for t, p in partitions)]

    def step(version: int, value: dict | None) -> dict | None:
        _refuse_stale(group_id, value, generation, "transactional offset commit")
        fence = _fence(value)
        old = fence["pending_txns"].get(transactional_id)
        if old is not None and old[:3] == entry[:3]:
            merged = sorted({tuple(tp) for tp in old[4]} | {tuple(tp) for tp in entry[4]})
            if len(merged) == len(old[4]) and fence["generation"] >= generation:
                return None  # already registered
            entry[4] = [list(tp) for tp in merged]
        fence["pending_txns"][transactional_id] = entry
        fence["generation"] = max(fence["generation"], generation)
        return _encode(_as_map(value) if _live(value) else {},
                       dict(value["txn_marks"]) if value else {}, _owner(value), fence)

    _chain(storage, group_id).update(step)


PendingTxn = tuple[str, int, int, int]  # transactional id, producer id, epoch, generation


def fence_generation(storage: Storage, group_id: str, generation: int,
                     partitions: list[tuple[str, int]]) -> list[PendingTxn]:
    """Raise the group's fence to ``generation`` (no-op if it is there already) and
    return the pending transactional sends of older generations that name any of
    ``partitions``: the caller must resolve them before reading those offsets."""
    found: list[PendingTxn] = []
    wanted = {tuple(tp) for tp in partitions}

    def step(version: int, value: dict | None) -> dict | None:
        fence = _fence(value)
        found.clear()
        for tid, (pid, epoch, gen, _member, parts) in fence.get("pending_txns", {}).items():
            if gen < generation and wanted & {tuple(tp) for tp in parts}:
                found.append((tid, pid, epoch, gen))
        if fence.get("generation", -1) >= generation:
            return None
        fence["generation"] = generation
        return _encode(_as_map(value) if _live(value) else {},
                       dict(value["txn_marks"]) if value else {}, _owner(value), fence)

    _chain(storage, group_id).update(step)
    return found


def drop_pending(storage: Storage, group_id: str, resolved: list[PendingTxn]) -> None:
    """Forget pending sends that have been resolved (if still registered as they were)."""
    def step(version: int, value: dict | None) -> dict | None:
        fence = _fence(value)
        pending = fence.get("pending_txns", {})
        gone = [tid for tid, pid, epoch, gen in resolved
                if tid in pending and tuple(pending[tid][:3]) == (pid, epoch, gen)]
        if not gone:
            return None
        for tid in gone:
            del pending[tid]
        return _encode(_as_map(value) if _live(value) else {},
                       dict(value["txn_marks"]) if value else {}, _owner(value), fence)

    if resolved:
        _chain(storage, group_id).update(step)


def fence_state(storage: Storage, group_id: str) -> tuple[int, int]:
    """(chain version, fenced generation) of the group's offsets, (-1, -1) if none."""
    version, value = _chain(storage, group_id).latest()
    return version, fenced_generation(value)
