"""Every coordinator and topic record in the old log decodes and re-encodes to its bytes.

READ THIS BEFORE CHANGING THE FILE.  fixtures/log_v1.tar.gz is a log written by txlog
before the issue 31 restructuring; it stands for the logs users already have, so its
bytes are never regenerated (``test_the_fixture_is_intact`` fails if they change).
Each record kind is read here through the code's own reader of that kind and written
back through its own writer, and the bytes must be identical: the on-disk format did
not move.  When you turn dict entries into typed dataclasses, or move a reader or a
writer, adapt ONLY the ``decode``/``encode`` pairs in ``CODECS`` to call the new ones;
never the fixture, never the assertions.

Segments and data objects are not records of this kind (their contents are read back
record by record in test_old_log.py); batch objects are checked by their header.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from make_fixtures import LOG_MANIFEST, LOG_TARBALL
from txlog.format.batch import decode_header, encode_header
from txlog.format.log_start import decode_log_start, encode_log_start
from txlog.format.snapshot_frame import frame, unframe
from txlog.transactions.group_members import GroupGeneration
from txlog.transactions.groups import GroupOffsets
from txlog.transactions.metadata import Decision, Lease, TransactionMetadata

MANIFEST = json.loads(LOG_MANIFEST.read_text())


def _chain_value(raw: bytes) -> Any:
    """What storage/chain.py's VersionChain reads a version as."""
    return msgpack.unpackb(raw, strict_map_key=False)


def _chain_bytes(value: Any) -> bytes:
    """What VersionChain.publish writes for a value."""
    return msgpack.packb(value)


def _read_batch_head(raw: bytes) -> tuple[Any, bytes]:
    """A batch object as its header and the bytes after it."""
    header = decode_header(raw, "fixture", None)
    return header, raw[len(encode_header(header)):]


def _read_snapshot(raw: bytes) -> tuple[dict, bytes]:
    """A framed snapshot as its fields and its entries section."""
    fields, entries_at = unframe(raw)
    return fields, raw[entries_at:]


# (path pattern, kind, decode, encode): decode reads the stored bytes as the code does,
# encode writes the result back; ``roundtrip`` composes them.
CODECS: list[tuple[str, str, Callable[[bytes], Any], Callable[[Any], bytes]]] = [
    (r"txlog\.json", "root marker", msgpack.unpackb, msgpack.packb),
    (r"topics/[^/]+/topic\.json", "topic creation record", msgpack.unpackb, msgpack.packb),
    (r"topics/[^/]+/config/\d{20}", "topic config chain", _chain_value, _chain_bytes),
    (r"topics/[^/]+/partition_count/\d{20}", "partition count chain", _chain_value,
     _chain_bytes),
    (r"topics/[^/]+/\d+/segments/\d{20}\.start", "log start record",
     lambda raw: decode_log_start(raw, "fixture"), encode_log_start),
    (r"topics/[^/]+/\d+/snapshots/\d{20}\.snapshot", "producer-state snapshot",
     _read_snapshot, lambda read: frame(*read)),
    (r"topics/[^/]+/\d+/\d{20}\.batch", "batch header", _read_batch_head,
     lambda read: encode_header(read[0]) + read[1]),
    (r"coordinator/transactions/[^/]+/\d{20}", "transaction metadata chain",
     lambda raw: TransactionMetadata.from_dict(_chain_value(raw)),
     lambda meta: _chain_bytes(meta.to_dict())),
    (r"coordinator/groups/[^/]+/\d{20}", "group offsets chain (with owner and fence)",
     lambda raw: GroupOffsets.from_value(_chain_value(raw)),
     lambda group: _chain_bytes(group.to_value())),
    (r"coordinator/members/[^/]+/generations/\d{20}", "group generation chain",
     lambda raw: GroupGeneration.from_dict(_chain_value(raw)),
     lambda generation: _chain_bytes(generation.to_dict())),
    (r"coordinator/leases/[^/]+/\d{20}", "shared transaction lease chain",
     lambda raw: Lease.from_value(_chain_value(raw)), lambda lease: _chain_bytes(lease.to_value())),
    (r"coordinator/decisions/[^/]+", "decision",
     lambda raw: Decision.from_value(msgpack.unpackb(raw)),
     lambda decision: msgpack.packb(decision.to_value())),
    (r"coordinator/producer-ids/\d{20}", "producer-id block", msgpack.unpackb, msgpack.packb),
]
NOT_RECORDS = (r"topics/[^/]+/\d+/segments/.*\.segment", r"data/[0-9a-f]{32}\.data")


def kind_of(path: str) -> tuple[str, Callable[[bytes], Any], Callable[[Any], bytes]] | None:
    for pattern, kind, decode, encode in CODECS:
        if re.fullmatch(pattern, path):
            return kind, decode, encode
    return None


def fixture_files() -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(LOG_TARBALL.read_bytes()), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers() if m.isfile()}


FILES = fixture_files()
RECORDS = sorted(path for path in FILES if kind_of(path) is not None)


def test_the_fixture_is_intact() -> None:
    """The log's bytes are those make_fixtures.py wrote: nobody regenerated it."""
    assert hashlib.sha256(LOG_TARBALL.read_bytes()).hexdigest() == MANIFEST["tarball_sha256"]
    assert {path: hashlib.sha256(data).hexdigest() for path, data in FILES.items()} == \
        MANIFEST["files"]


def test_every_file_is_a_known_kind() -> None:
    unknown = [path for path in FILES if kind_of(path) is None and
               not any(re.fullmatch(p, path) for p in NOT_RECORDS)]
    assert unknown == []


def test_every_kind_is_in_the_fixture() -> None:
    found = {kind_of(path)[0] for path in RECORDS}  # type: ignore[index]
    assert found == {kind for _, kind, _, _ in CODECS}


@pytest.mark.parametrize("path", RECORDS)
def test_record_reencodes_to_its_bytes(path: str) -> None:
    _, decode, encode = kind_of(path)  # type: ignore[misc]
    assert encode(decode(FILES[path])) == FILES[path]
