"""Garbage collection: what the log no longer needs, removed without changing what anyone reads.

Every removal here is of an object no reader or writer will use again, and
each kind has its own reason why that holds while writers run
(docs/protocol.md, section 8):

* the chains of finished participants of shared transactions (a job's task
  attempts), at once (docs/protocol.md 5.3, exactly_once/shared_transaction.py),
  but for the ids the batch writer re-uses from job to job (5.4), which
  expire as idle ids do;
* transactional ids idle longer than ``txn_id_expiration_ms`` (Kafka's
  transactional.id.expiration.ms) are moved to Dead, and the chains of ids
  Dead for longer than ``chain_age_s`` (at least ``MIN_DEAD_AGE_S``) are
  deleted whole (docs/protocol.md, 4.10, says why a stale process can
  neither revive nor fork them);
* old versions of version chains (transaction metadata, group offsets,
  leases, the slots of prefix pools): a chain is read at its newest version, which always stays, and
  a version goes only once its successor is older than ``chain_age_s``, so
  a process that read a version and is about to publish the next still
  finds its predecessor unless it stalled that long (storage/chain.py checks after
  publishing, and withdraws a version whose predecessor is gone);
* decisions: a decision is read while a transaction that follows it is not
  complete; plain transactions' decisions go once no transaction metadata
  refers to them outside a complete state, shared transactions' also only
  after ``decision_age_s``, because a job's late end call would otherwise
  decide again;
* leases of decided shared transactions;
* heartbeat objects older than ``chain_age_s`` of members the group's newest
  generation does not list (a member that crashed is removed by the others,
  who delete its heartbeats; these are the strays of a removal that died);
* producer-id blocks but the newest (claimers only look at the newest);
* batch objects and producer-state snapshots that segments cover (leftovers
  of a compaction that stopped half-way, or strays, partition/compaction.py);
* temp files of local publishes that died (storage/local.py);
* data objects no claim points into, older than ``data_age_s``: a writer
  never publishes a claim into a data object whose write began more than
  ``appender.CLAIM_WINDOW_S`` ago, so once an object is older than that
  (plus a margin for clocks) and no claim names it, none ever will.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
import msgpack

from .. import clock
from ..errors import CorruptBatchError
from ..format.batch import HEADER_READ_SIZE, decode_header, is_data_object_path
from ..partition.appender import CLAIM_WINDOW_S
from ..storage.paths import (BATCH_SUFFIX, BLOCK_DIR, DATA_DIR, DECISION_DIR, GROUP_DIR,
                             LEASE_DIR, MEMBERS_DIR, POOL_DIR, TOPICS_DIR, TXN_DIR, VERSION_DIGITS,
                             batch_path, generations_dir, heartbeats_dir, named_offsets,
                             partition_dir, topic_dir)
from ..exactly_once.shared_transaction import delete_finished_attempt
from ..root.root import Root
from ..transactions.metadata import COMPLETE, TxnState

DEFAULT_CHAIN_AGE_S = 3600.0
DEFAULT_DECISION_AGE_S = 7 * 24 * 3600.0  # Kafka's transactional.id.expiration.ms
DEFAULT_TEMP_AGE_S = 3600.0
# A of docs/protocol.md, section 8: an hour, against the claim window's ten
# minutes, leaves fifty minutes for the writer's and the store's clocks to differ.
DEFAULT_DATA_AGE_S = 3600.0
assert DEFAULT_DATA_AGE_S > CLAIM_WINDOW_S
logger = logging.getLogger(__name__)
DEFAULT_TXN_ID_EXPIRATION_MS = 7 * 24 * 3600 * 1000  # Kafka's transactional.id.expiration.ms
# A Dead chain is deleted only this long after it died, whatever chain_age_s says: longer
# than a process trusts its cached chain version unchecked (storage/chain.py).
MIN_DEAD_AGE_S = 5.0
_PLAIN_DECISION = re.compile(r"^\d+-\d+$")  # <producer id>-<epoch>: one producer's transaction
_FINISHED = COMPLETE | {TxnState.EMPTY, TxnState.DEAD}


@dataclass
class GcReport:
    """What one collection removed, by kind (paths relative to the root)."""

    removed: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, path: str) -> None:
        self.removed.setdefault(kind, []).append(path)

    def count(self, kind: str) -> int:
        return len(self.removed.get(kind, []))


def collect(root: Root, chain_age_s: float = DEFAULT_CHAIN_AGE_S,
            decision_age_s: float = DEFAULT_DECISION_AGE_S,
            temp_age_s: float = DEFAULT_TEMP_AGE_S, now_ms: int | None = None,
            data_age_s: float = DEFAULT_DATA_AGE_S,
            txn_id_expiration_ms: int = DEFAULT_TXN_ID_EXPIRATION_MS) -> GcReport:
    """Remove everything listed in the module docstring; returns what went.

    ``data_age_s`` below ``appender.CLAIM_WINDOW_S`` is only safe when no
    writer runs (tests, or a log at rest).
    """
    now_ms = clock.now_ms() if now_ms is None else now_ms
    report = GcReport()
    storage = root.storage
    # Decisions are listed before the chains are read: a decision published after this
    # listing is not deleted by this collection, and one published before it belongs to a
    # transaction whose chain, read below, still names it outside a finished state unless
    # its markers are all written (docs/protocol.md, section 8).
    decision_ids = storage.list(DECISION_DIR)
    needed = _collect_transactional_ids(root, chain_age_s, now_ms, txn_id_expiration_ms, report)
    for group in storage.list(GROUP_DIR):
        _trim_chain(root, f"{GROUP_DIR}/{group}", "time_ms", chain_age_s, now_ms, report,
                    "group offset versions")
    for base in storage.list(POOL_DIR):
        for slot in storage.list(f"{POOL_DIR}/{base}"):
            _trim_chain(root, f"{POOL_DIR}/{base}/{slot}", "time_ms", chain_age_s, now_ms,
                        report, "prefix pool versions")
    for group in storage.list(MEMBERS_DIR):
        _trim_chain(root, generations_dir(group), "time_ms", chain_age_s, now_ms, report,
                    "group generation versions")
        _remove_stray_heartbeats(root, group, now_ms - chain_age_s * 1000, report)
    decided = _delete_decisions(root, decision_ids, needed, decision_age_s, now_ms, report)
    _collect_leases(root, decided, needed, chain_age_s, decision_age_s, now_ms, report)
    blocks = sorted(n for n in storage.list(BLOCK_DIR) if n.isdigit())
    for name in blocks[:-1]:
        storage.delete(f"{BLOCK_DIR}/{name}")
        report.add("producer-id blocks", f"{BLOCK_DIR}/{name}")
    for topic in root.topics():
        for p in range(root.describe_topic(topic, refresh=True).partitions):
            for path in root.partition(topic, p).remove_leftovers():
                report.add("batch and snapshot objects segments hold", path)
    for path in storage.remove_temp_files(temp_age_s):
        report.add("temp files", path)
    for path in unreferenced_data_objects(root, data_age_s):
        storage.delete(path)
        report.add("unreferenced data objects", path)
    return report


def _collect_transactional_ids(root: Root, chain_age_s: float, now_ms: int,
                               txn_id_expiration_ms: int, report: GcReport) -> set[str]:
    """Finished job attempts deleted, chains trimmed, idle ids expired and long-Dead ones
    deleted; returns the decisions that transactions not yet finished still need."""
    needed: set[str] = set()
    coordinator = root.coordinator
    dead_before = now_ms - max(chain_age_s, MIN_DEAD_AGE_S) * 1000
    for tid in root.storage.list(TXN_DIR):
        finished = delete_finished_attempt(root, tid)
        if finished:
            for path in finished:
                report.add("transactional id chains (finished job attempts)", path)
            continue
        latest = _trim_chain(root, f"{TXN_DIR}/{tid}", "update_ms", chain_age_s, now_ms, report,
                             "transaction metadata versions")
        if latest is None:
            continue
        state = TxnState(latest["state"])
        if state not in _FINISHED:
            needed.add(latest["decision_id"])
        elif state == TxnState.DEAD:
            for path in coordinator.delete_dead(tid, int(dead_before)):
                report.add("transactional id chains (expired)", path)
        elif now_ms - latest["update_ms"] > txn_id_expiration_ms and \
                coordinator.expire_idle(tid, txn_id_expiration_ms):
            report.add("transactional ids expired (Dead)", f"{TXN_DIR}/{tid}")
    return needed


def _delete_decisions(root: Root, decision_ids: list[str], needed: set[str],
                      decision_age_s: float, now_ms: int, report: GcReport) -> set[str]:
    """Decisions no unfinished transaction needs deleted (a shared one's only once older
    than ``decision_age_s``); returns every decision that was there to read."""
    decided = set()
    for decision_id in decision_ids:
        path = f"{DECISION_DIR}/{decision_id}"
        try:
            raw = msgpack.unpackb(root.storage.read(path))
        except FileNotFoundError:
            continue
        decided.add(decision_id)
        if decision_id in needed:
            continue
        old_enough = _PLAIN_DECISION.match(decision_id) or \
            raw["time_ms"] < now_ms - decision_age_s * 1000
        if old_enough:
            root.storage.delete(path)
            report.add("decisions", path)
    return decided


def _collect_leases(root: Root, decided: set[str], needed: set[str], chain_age_s: float,
                    decision_age_s: float, now_ms: int, report: GcReport) -> None:
    """Leases of decided shared transactions (or of ones nobody renewed for
    ``decision_age_s``) deleted whole, the others' chains trimmed."""
    storage = root.storage
    for decision_id in storage.list(LEASE_DIR):
        if decision_id in decided or (decision_id not in needed and _chain_older_than(
                root, f"{LEASE_DIR}/{decision_id}", "time_ms", now_ms - decision_age_s * 1000)):
            for path in _versions(root, f"{LEASE_DIR}/{decision_id}"):
                storage.delete(path)
                report.add("lease versions", path)
            storage.delete(f"{LEASE_DIR}/{decision_id}")
        else:
            _trim_chain(root, f"{LEASE_DIR}/{decision_id}", "time_ms", chain_age_s, now_ms,
                        report, "lease versions")


def _remove_stray_heartbeats(root: Root, group: str, cutoff_ms: float, report: GcReport) -> None:
    from ..transactions.group_members import GroupMembership, HEARTBEAT_SEPARATOR

    members = {m.member_id for m in GroupMembership(root.storage, group).latest().members}
    directory = heartbeats_dir(group)
    for name in root.storage.list(directory):
        parts = name.split(HEARTBEAT_SEPARATOR)
        if len(parts) == 3 and parts[0] not in members and parts[2].isdigit() and \
                int(parts[2]) < cutoff_ms:
            root.storage.delete(f"{directory}/{name}")
            report.add("stray heartbeats", f"{directory}/{name}")


def unreferenced_data_objects(root: Root, age_s: float) -> list[str]:
    """Data objects older than ``age_s`` (at the start of this call, by the store's
    clock) that no claim in the log points into.

    The age is taken before any claim is read: a claim published after the
    scan started would point into an object whose write began more than
    ``age_s`` minus the clocks' difference ago, which writers never do
    (docs/protocol.md, section 8).  A claim that cannot be decoded stops the
    collection (what it points to is unknown).
    """
    storage = root.storage
    started = time.time()
    old = {f"{DATA_DIR}/{name}" for name, created in storage.list_times(DATA_DIR)
           if created < started - age_s}
    old = {path for path in old if is_data_object_path(path)}
    if not old:
        return []
    referenced: set[str] = set()
    for topic in storage.list(TOPICS_DIR):
        for name in storage.list(topic_dir(topic)):
            if not name.isdigit():
                continue
            directory = partition_dir(topic, int(name))
            for base in named_offsets(storage.list(directory), BATCH_SUFFIX):
                path = batch_path(directory, base)
                try:
                    head = storage.read_prefix(path, HEADER_READ_SIZE)
                    header = decode_header(head, path, base)
                except FileNotFoundError:
                    continue  # compacted meanwhile: a segment holds its payload
                except CorruptBatchError as exc:
                    logger.warning("gc: keeping every data object, a claim is unreadable: %s",
                                   exc)
                    return []
                if header.is_claim:
                    referenced.add(header.data_path)
    return sorted(old - referenced)


def _versions(root: Root, directory: str) -> list[str]:
    names = sorted(n for n in root.storage.list(directory)
                   if n.isdigit() and len(n) == VERSION_DIGITS)
    return [f"{directory}/{n}" for n in names]


def _time_of(root: Root, path: str, key: str) -> int | None:
    try:
        value = msgpack.unpackb(root.storage.read(path), strict_map_key=False)
    except FileNotFoundError:
        return None
    return value.get(key) if isinstance(value, dict) else None


def _chain_older_than(root: Root, directory: str, key: str, cutoff_ms: float) -> bool:
    paths = _versions(root, directory)
    newest = _time_of(root, paths[-1], key) if paths else None
    return newest is not None and newest < cutoff_ms


def _trim_chain(root: Root, directory: str, key: str, age_s: float, now_ms: int,
                report: GcReport, kind: str) -> dict | None:
    """Delete the versions of a chain superseded more than ``age_s`` ago (oldest first);
    returns the newest version's value.

    A process about to publish version ``v + 1`` read ``v`` before anyone
    published ``v + 1``: deleting ``v`` only once its successor is that old
    never pulls a predecessor from under a writer that is not stalled for
    that long, and the newest version, having no successor, always stays.
    """
    paths = _versions(root, directory)
    if not paths:
        return None
    try:
        latest = msgpack.unpackb(root.storage.read(paths[-1]), strict_map_key=False)
    except FileNotFoundError:
        return None
    cutoff = now_ms - age_s * 1000
    # Versions are written in time order: bisect for the first one written after the cutoff.
    lo, hi = 0, len(paths)
    while lo < hi:
        mid = (lo + hi) // 2
        written = _time_of(root, paths[mid], key)
        if written is not None and written >= cutoff:
            hi = mid
        else:
            lo = mid + 1
    for path in paths[:max(min(lo - 1, len(paths) - 1), 0)]:
        root.storage.delete(path)
        report.add(kind, path)
    return latest
