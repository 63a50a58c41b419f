"""Every path and file name of a log root, in one place (like Kafka's LogFileUtils).

The names are part of the on-disk format (docs/format.md, section 1): a
process finds a batch, a segment or a transaction's state only by computing
its name, so two modules that spelled a name differently would not see each
other's objects.  Paths are relative to the root and use ``/``.

``txlog.json`` and ``topic.json`` hold msgpack, not JSON: the names predate
the encoding and stay, since existing logs are found by them.
"""

from __future__ import annotations

# --- the root ------------------------------------------------------------------------------

ROOT_MARKER = "txlog.json"  # the format version of the root (msgpack)
TMP_PREFIX = ".tmp-"  # objects being written (local and atomic-rename backends); never listed
PROBE_DIR = f"{TMP_PREFIX}probe"  # where a backend checks that conditional writes work
# The version chain of the root's own settings (a broker's: topic auto-creation).
ROOT_CONFIG_DIR = "config"

# --- data objects (docs/format.md, section 2.7) -------------------------------------------

DATA_DIR = "data"  # one object per producer flush, holding the payloads its claims point to
DATA_SUFFIX = ".data"


def data_object_path(name: str) -> str:
    """``data/<32 hex digits>.data``: a unique name, so its creation never contends."""
    return f"{DATA_DIR}/{name}{DATA_SUFFIX}"


# --- topics and partitions -----------------------------------------------------------------

TOPICS_DIR = "topics"
OFFSET_DIGITS = 20
BATCH_SUFFIX = ".batch"
SEGMENT_DIR = "segments"
SEGMENT_SUFFIX = ".segment"
SNAPSHOT_DIR = "snapshots"
SNAPSHOT_SUFFIX = ".snapshot"
LOG_START_SUFFIX = ".start"  # a recorded log start offset (delete-records), in the segments dir


def topic_dir(topic: str) -> str:
    return f"{TOPICS_DIR}/{topic}"


def topic_meta_path(topic: str) -> str:
    """The topic's creation record (name, partitions, config, topic id; msgpack)."""
    return f"{topic_dir(topic)}/topic.json"


def partition_count_path(topic: str) -> str:
    """The version chain of partitions added to a topic after its creation."""
    return f"{topic_dir(topic)}/partition_count"


def topic_config_path(topic: str) -> str:
    """The version chain of a topic's altered config (retention and segment settings)."""
    return f"{topic_dir(topic)}/config"


def partition_dir(topic: str, partition: int) -> str:
    return f"{topic_dir(topic)}/{partition}"


def offset_name(offset: int, suffix: str) -> str:
    """``<offset, 20 digits><suffix>``: names sort as their offsets do."""
    return f"{offset:0{OFFSET_DIGITS}d}{suffix}"


def named_offsets(names: list[str], suffix: str) -> list[int]:
    """Offsets of the ``<offset><suffix>`` names, sorted (anything else there is not ours)."""
    return sorted(int(n[:-len(suffix)]) for n in names
                  if n.endswith(suffix) and n[:-len(suffix)].isdigit())


def batch_path(directory: str, offset: int) -> str:
    """The batch object based at ``offset`` in partition directory ``directory``."""
    return f"{directory}/{offset_name(offset, BATCH_SUFFIX)}"


def segments_dir(directory: str) -> str:
    return f"{directory}/{SEGMENT_DIR}"


def segment_name(base_offset: int) -> str:
    return offset_name(base_offset, SEGMENT_SUFFIX)


def segment_path(directory: str, base_offset: int) -> str:
    return f"{segments_dir(directory)}/{segment_name(base_offset)}"


def segment_bases(names: list[str]) -> list[int]:
    """Base offsets of the segment names among ``names``, sorted."""
    return named_offsets(names, SEGMENT_SUFFIX)


def merged_segment_name(base_offset: int, end_offset: int) -> str:
    """``<base:020d>-<end:020d>.segment``: a merged segment names its whole range, so a
    listing alone tells which other segments it covers (docs/format.md 4.9)."""
    return f"{base_offset:0{OFFSET_DIGITS}d}-{end_offset:0{OFFSET_DIGITS}d}{SEGMENT_SUFFIX}"


def merged_segment_path(directory: str, base_offset: int, end_offset: int) -> str:
    return f"{segments_dir(directory)}/{merged_segment_name(base_offset, end_offset)}"


def listed_segment_names(names: list[str]) -> list[tuple[int, int | None, str]]:
    """``(base, end, name)`` of every segment among ``names``, sorted by base, then by end
    descending with a merged segment before the plain one at its base; ``end`` is None for
    a plain ``<base>.segment`` (its end is in its header only)."""
    out: list[tuple[int, int | None, str]] = []
    for n in names:
        if not n.endswith(SEGMENT_SUFFIX):
            continue
        stem = n[:-len(SEGMENT_SUFFIX)]
        if stem.isdigit():
            out.append((int(stem), None, n))
            continue
        lo, sep, hi = stem.partition("-")
        if sep and lo.isdigit() and hi.isdigit() and int(lo) < int(hi):
            out.append((int(lo), int(hi), n))
    out.sort(key=lambda s: (s[0], -(s[1] if s[1] is not None else -1)))
    return out


def log_start_path(directory: str, offset: int) -> str:
    """The record that moves the log start of partition directory ``directory`` to ``offset``
    (DeleteRecords).  It sits beside the segments so that the one listing that finds them
    finds it too."""
    return f"{segments_dir(directory)}/{offset_name(offset, LOG_START_SUFFIX)}"


def snapshots_dir(directory: str) -> str:
    return f"{directory}/{SNAPSHOT_DIR}"


def snapshot_path(directory: str, end_offset: int) -> str:
    """The producer-state snapshot at ``end_offset`` of partition directory ``directory``."""
    return f"{snapshots_dir(directory)}/{offset_name(end_offset, SNAPSHOT_SUFFIX)}"


# --- topics as tables (docs/tables.md) ----------------------------------------------------

# A topic's Iceberg table: its files under ``tables/<topic>/`` (Iceberg's own ``metadata/``
# and ``data/`` names, written by pyiceberg), and the version chain that names the
# current metadata file, moved only by an exclusive publish (the catalog's pointer).
# Outside ``topics/``: deleting the topic leaves the table, which a sync then refuses.
TABLES_DIR = "tables"


def table_dir(topic: str) -> str:
    return f"{TABLES_DIR}/{topic}"


def table_pointer_dir(topic: str) -> str:
    """The version chain naming the table's current metadata file."""
    return f"{table_dir(topic)}/pointer"


def table_retired_dir(topic: str) -> str:
    """Records of the files of snapshots expired by count, kept for the age bound."""
    return f"{table_dir(topic)}/retired"


def table_data_path(topic: str, name: str) -> str:
    """A data file a sync writes (a unique name: two syncs never write the same file)."""
    return f"{table_dir(topic)}/data/{name}.parquet"


# --- the coordinator -----------------------------------------------------------------------

TXN_DIR = "coordinator/transactions"  # a version chain per transactional id
DECISION_DIR = "coordinator/decisions"  # one decision object per transaction
LEASE_DIR = "coordinator/leases"  # a version chain per shared transaction's decision
GROUP_DIR = "coordinator/groups"  # a version chain per consumer group
MEMBERS_DIR = "coordinator/members"  # per group: a generation chain and heartbeat objects
BLOCK_DIR = "coordinator/producer-ids"  # one object per allocated block of producer ids
# Shared transactions' participants, by prefix and job: <prefix>/<decision id>/<transactional id>
JOB_DIR = "coordinator/jobs"
# Pooled job prefixes, by base prefix: a version chain per slot naming the job holding it
POOL_DIR = "coordinator/pools"
VERSION_DIGITS = 20


def version_path(directory: str, version: int) -> str:
    """Version ``version`` of the version chain in ``directory``."""
    return f"{directory}/{version:0{VERSION_DIGITS}d}"


def job_dir(prefix: str, decision_id: str | None = None) -> str:
    """The unfinished jobs of ``prefix``, or the participants of one of its jobs."""
    return f"{JOB_DIR}/{prefix}" if decision_id is None else f"{JOB_DIR}/{prefix}/{decision_id}"


def pool_slot_dir(base: str, slot: int | None = None) -> str:
    """The slots of the prefix pool of ``base``, or the lease chain of one slot."""
    return f"{POOL_DIR}/{base}" if slot is None else f"{POOL_DIR}/{base}/{slot}"


def block_path(block: int) -> str:
    """The object that allocates block ``block`` of producer ids to its publisher."""
    return f"{BLOCK_DIR}/{block:020d}"


def generations_dir(group_id: str) -> str:
    """The version chain of a group's generations (members and assignment)."""
    return f"{MEMBERS_DIR}/{group_id}/generations"


def heartbeats_dir(group_id: str) -> str:
    """Where a group's members publish their heartbeats, one live object per member."""
    return f"{MEMBERS_DIR}/{group_id}/heartbeats"
