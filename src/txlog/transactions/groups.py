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

A group may record an ``owner``: the one writer whose progress it holds (a
stream sink's query, txlog.exactly_once.stream_sink).  Every version carries
it forward; a delete drops it with the offsets.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import clock
from ..storage.chain import VersionChain
from ..errors import InvalidConfigError, UnknownGroupError
from ..storage.names import validate_name
from ..storage.backends import Storage
from ..storage.paths import GROUP_DIR


def _chain(storage: Storage, group_id: str) -> VersionChain:
    validate_name(group_id, "group id")
    return VersionChain(storage, f"{GROUP_DIR}/{group_id}")


def _check_offsets(offsets: dict[tuple[str, int], int]) -> None:
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
            owner: str | None = None) -> dict:
    value = {"offsets": [[t, p, o] for (t, p), o in sorted(offsets.items())],
             "txn_marks": marks, "time_ms": clock.now_ms()}
    if owner is not None:
        value["owner"] = owner
    return value


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
        return {**_encode({}, dict(value["txn_marks"])), "deleted": True}

    _chain(storage, group_id).update(step)


def committed_offsets(storage: Storage, group_id: str,
                      partitions: list[tuple[str, int]] | None = None
                      ) -> dict[tuple[str, int], int]:
    _, value = _chain(storage, group_id).latest()
    offsets = _as_map(value)
    if partitions is None:
        return offsets
    return {tp: offsets[tp] for tp in map(tuple, partitions) if tp in offsets}


def commit_offsets(storage: Storage, group_id: str, offsets: dict[tuple[str, int], int]) -> None:
    _check_offsets(offsets)

    def step(version: int, value: dict | None) -> dict:
        merged = _as_map(value)
        merged.update(offsets)
        return _encode(merged, dict(value["txn_marks"]) if value else {}, _owner(value))

    _chain(storage, group_id).update(step)


OffsetsStep = Callable[[dict[tuple[str, int], int]], dict[tuple[str, int], int]]


def reset_offsets(storage: Storage, group_id: str, step: OffsetsStep
                  ) -> dict[tuple[str, int], int]:
    """Replace some of an existing group's offsets (txlog groups reset-offsets) in one version.

    ``step`` gets the offsets of the version being replaced (so a shift is
    relative to what is committed at the moment of the publish, not to an
    earlier read) and returns the partitions to set; it may raise to refuse,
    and is called again if a concurrent commit wins the race.  The new
    version keeps ``txn_marks``: a late roll-forward of a transaction whose
    offsets were applied before the reset is skipped and cannot undo it.
    Returns what was set.  UnknownGroupError for a group with no version or
    a deleted one.
    """
    applied: dict[tuple[str, int], int] = {}

    def update(version: int, value: dict | None) -> dict:
        if not _live(value):
            raise UnknownGroupError(f"group {group_id!r} does not exist"
                                    + (" (it was deleted)" if value is not None else ""))
        assert value is not None
        current = _as_map(value)
        new = step(dict(current))
        _check_offsets(new)
        applied.clear()
        applied.update(new)
        return _encode({**current, **new}, dict(value["txn_marks"]), _owner(value))

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
                                generation: int, incarnation_ms: int = 0) -> None:
    """Apply a committed transaction's offsets once, and never after a newer one.

    The generation is (incarnation, version): a transactional id whose chain
    was deleted and started again at version 0 has a later incarnation, so
    its commits are never taken for ones already applied.
    """
    new = (incarnation_ms, generation)

    def step(version: int, value: dict | None) -> dict | None:
        marks = dict(value["txn_marks"]) if value else {}
        if _generation(marks.get(transactional_id, -1)) >= new:
            return None
        merged = _as_map(value)
        merged.update(offsets)
        marks[transactional_id] = [incarnation_ms, generation] if incarnation_ms else generation
        return _encode(merged, marks, _owner(value))

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
        return _encode(offsets, dict(value["txn_marks"]) if value else {}, owner)

    _chain(storage, group_id).update(update)
