"""The batch file: a fixed big-endian header with Kafka v2's fields, then a payload.

docs/format.md describes every byte; keep the two in step.

Two checksums (both CRC-32C, Kafka's checksum): one over the header, so that
the producer state can be rebuilt from headers alone without reading large
payloads, and one over the payload, checked whenever records are read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from typing import TypeAlias

import crc32c
import pyarrow as pa
import pyarrow.ipc as ipc

from ..errors import CorruptBatchError, InvalidConfigError
from ..storage.paths import DATA_DIR, DATA_SUFFIX

MAGIC = b"TXL\x01"

# magic, header_crc | header_length, attributes, base_offset, last_offset_delta,
# base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence,
# record_count, payload_length, payload_crc
_FIXED = struct.Struct(">4sI HhqiqqqhiiII")
FIXED_SIZE = _FIXED.size  # 66
# The optional trailing int64 after the strings (and a claim's reference): the
# writer's clock at publish (format.md 2.1).
_APPEND_TIME = struct.Struct(">q")
MAX_HEADER_SIZE = FIXED_SIZE + 2 * (1 + 255) + _APPEND_TIME.size
# A claim's header also holds its reference: the data object's path (a length
# byte and up to 255 bytes) and the payload's position in it (uint64).
_REFERENCE_OFFSET = struct.Struct(">Q")
MAX_CLAIM_HEADER_SIZE = MAX_HEADER_SIZE + 1 + 255 + _REFERENCE_OFFSET.size
# A claim of several batches (PARTS_BIT) ends with its parts table: a count byte, then
# each part's record count (int32) and payload length (uint32), in offset order.
_PART = struct.Struct(">iI")
# At most this many batches in one claim, so that the largest claim header still fits
# the first HEADER_READ_SIZE bytes a state refresh reads (850 + 1 + 16 * 8 = 979).
MAX_CLAIM_PARTS = 16
MAX_PARTS_HEADER_SIZE = MAX_CLAIM_HEADER_SIZE + 1 + MAX_CLAIM_PARTS * _PART.size
# Enough to hold any header (a claim's included) plus a control batch's payload in one read.
HEADER_READ_SIZE = 1024

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

# attributes (Kafka v2 bit positions)
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08  # 0 CreateTime, 1 LogAppendTime
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
# The payload is not in this object but in a data object the header names
# (format.md, section 2.7).  Bit 7: Kafka's bit 6 is its delete-horizon flag.
CLAIM_BIT = 0x80
# A claim covering several consecutive batches of one producer: its payload is their
# Arrow IPC streams back to back, and a parts table (format.md, 2.7.1) says where each
# ends.  Bit 8, the first of the bits Kafka leaves unused; only ever with CLAIM_BIT.
PARTS_BIT = 0x100

COMPRESSION_CODES = {None: 0, "none": 0, "lz4": 3, "zstd": 4}
_CODE_TO_ARROW = {0: None, 3: "lz4", 4: "zstd"}

CREATE_TIME = 0
LOG_APPEND_TIME = 1

# control record types, as Kafka's ControlRecordType
ABORT = 0
COMMIT = 1
_CONTROL = struct.Struct(">hhiq")  # version, type, coordinator_epoch, first_offset

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string(), nullable=False),
                                  pa.field("value", pa.binary())]))
RECORD_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("timestamp", pa.int64(), nullable=False),
    pa.field("headers", HEADER_TYPE),
])


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    record_count: int
    attributes: int = 0
    base_timestamp: int = -1
    max_timestamp: int = -1
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    decision_id: str = ""
    transactional_id: str = ""
    payload_length: int = 0
    payload_crc: int = 0
    header_length: int = FIXED_SIZE + 2
    # A claim's reference (CLAIM_BIT): the data object holding the payload, and where.
    data_path: str = ""
    data_offset: int = -1
    # The writer's clock when it published the batch (ms), -1 if not recorded (batches
    # written before the field existed): producer expiry's time base, never CreateTime.
    append_time: int = -1
    # A claim of several batches (PARTS_BIT): each part's (record count, payload length),
    # in offset order; empty for a batch of one part.
    parts: tuple[tuple[int, int], ...] = ()

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.record_count - 1) & 0x7FFFFFFF

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def is_claim(self) -> bool:
        """The payload lives in a data object (a batch object holding only this header)."""
        return bool(self.attributes & CLAIM_BIT)

    @property
    def has_parts(self) -> bool:
        """The payload is several batches' Arrow streams back to back (a parts table says
        where each ends)."""
        return bool(self.attributes & PARTS_BIT)

    @property
    def compression(self) -> str | None:
        return _CODE_TO_ARROW.get(self.attributes & COMPRESSION_MASK)

    @property
    def timestamp_type(self) -> int:
        return LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_BIT else CREATE_TIME

    @property
    def is_idempotent(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID


@dataclass(frozen=True, slots=True)
class ControlRecord:
    type: int  # ABORT or COMMIT
    coordinator_epoch: int
    first_offset: int  # first offset of the transaction in this partition, -1 if none


def _short_string(value: str, what: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 255:
        raise InvalidConfigError(f"{what} {value[:20]!r}... is longer than 255 bytes")
    return bytes([len(raw)]) + raw


def encode_header(h: BatchHeader) -> bytes:
    strings = _short_string(h.decision_id, "decision id") + _short_string(
        h.transactional_id, "transactional id")
    if h.attributes & CLAIM_BIT:
        strings += _short_string(h.data_path, "data object path") + \
            _REFERENCE_OFFSET.pack(h.data_offset)
    if h.append_time >= 0 or h.attributes & PARTS_BIT:
        strings += _APPEND_TIME.pack(h.append_time)
    if h.attributes & PARTS_BIT:
        if not h.attributes & CLAIM_BIT or not 2 <= len(h.parts) <= MAX_CLAIM_PARTS or \
                sum(c for c, _ in h.parts) != h.record_count or \
                sum(n for _, n in h.parts) != h.payload_length:
            raise ValueError(f"inconsistent parts table {h.parts} for a batch of "
                             f"{h.record_count} records and {h.payload_length} bytes")
        strings += bytes([len(h.parts)]) + b"".join(_PART.pack(c, n) for c, n in h.parts)
    header_length = FIXED_SIZE + len(strings)
    body = _FIXED.pack(MAGIC, 0, header_length, h.attributes, h.base_offset, h.record_count - 1,
                       h.base_timestamp, h.max_timestamp, h.producer_id, h.producer_epoch,
                       h.base_sequence, h.record_count, h.payload_length, h.payload_crc) + strings
    crc = crc32c.crc32c(body[8:])
    return body[:4] + struct.pack(">I", crc) + body[8:]


def encode_batch(header: BatchHeader, payload: bytes) -> bytes:
    """Header and payload as one object; fills in the payload length and checksum."""
    header = replace(header, payload_length=len(payload), payload_crc=crc32c.crc32c(payload))
    return encode_header(header) + payload


def decode_header(data: bytes | memoryview | pa.Buffer, path: str,
                  expected_offset: int | None) -> BatchHeader:
    """Parse and check a header; ``data`` may hold just the first bytes of the file."""
    view = memoryview(data)
    if len(view) < FIXED_SIZE:
        raise CorruptBatchError(f"truncated batch header ({len(view)} bytes, need {FIXED_SIZE})",
                                path, expected_offset)
    (magic, header_crc, header_length, attributes, base_offset, last_offset_delta, base_ts,
     max_ts, pid, epoch, base_seq, count, payload_length, payload_crc) = _FIXED.unpack_from(view)
    if magic != MAGIC:
        raise CorruptBatchError(f"bad magic {bytes(magic)!r} (expected {MAGIC!r})", path,
                                expected_offset)
    limit = MAX_PARTS_HEADER_SIZE if attributes & PARTS_BIT else \
        MAX_CLAIM_HEADER_SIZE if attributes & CLAIM_BIT else MAX_HEADER_SIZE
    if not FIXED_SIZE + 2 <= header_length <= limit or len(view) < header_length:
        raise CorruptBatchError(f"bad or truncated header length {header_length}", path,
                                expected_offset)
    if crc32c.crc32c(view[8:header_length]) != header_crc:
        raise CorruptBatchError("header checksum mismatch", path, expected_offset)
    if expected_offset is not None and base_offset != expected_offset:
        raise CorruptBatchError(f"header says base offset {base_offset}", path, expected_offset)
    if count < 1 or last_offset_delta != count - 1:
        raise CorruptBatchError(f"bad record count {count}", path, expected_offset)
    pos = FIXED_SIZE
    strings = []
    for _ in range(2):
        if pos >= header_length:
            raise CorruptBatchError("header strings overrun the header", path, expected_offset)
        n = view[pos]
        if pos + 1 + n > header_length:
            raise CorruptBatchError("header strings overrun the header", path, expected_offset)
        try:
            strings.append(bytes(view[pos + 1:pos + 1 + n]).decode("utf-8"))
        except UnicodeDecodeError:
            raise CorruptBatchError("header string is not UTF-8", path, expected_offset) from None
        pos += 1 + n
    data_path, data_offset = "", -1
    if attributes & CLAIM_BIT:
        data_path, data_offset, pos = _claim_reference(view, pos, header_length, attributes,
                                                       path, expected_offset)
    # Trailing bytes: the append time if there are 8 of them (older writers wrote none).
    append_time = _APPEND_TIME.unpack_from(view, pos)[0] \
        if header_length - pos >= _APPEND_TIME.size else -1
    parts: tuple[tuple[int, int], ...] = ()
    if attributes & PARTS_BIT:
        parts = _parts_table(view, pos + _APPEND_TIME.size, header_length, attributes, count,
                             payload_length, path, expected_offset)
    return BatchHeader(base_offset=base_offset, record_count=count, attributes=attributes,
                       base_timestamp=base_ts, max_timestamp=max_ts, producer_id=pid,
                       producer_epoch=epoch, base_sequence=base_seq, decision_id=strings[0],
                       transactional_id=strings[1], payload_length=payload_length,
                       payload_crc=payload_crc, header_length=header_length,
                       data_path=data_path, data_offset=data_offset,
                       append_time=append_time, parts=parts)


def _claim_reference(view: memoryview, pos: int, header_length: int, attributes: int,
                     path: str, expected_offset: int | None) -> tuple[str, int, int]:
    """A claim's reference at ``pos`` (data object path, payload offset) and the position
    after it; checked apart, like the parts table, since only claims carry one."""
    n = view[pos] if pos < header_length else 0
    end = pos + 1 + n + _REFERENCE_OFFSET.size
    if pos >= header_length or end > header_length:
        raise CorruptBatchError("claim reference overruns the header", path, expected_offset)
    data_path = bytes(view[pos + 1:pos + 1 + n]).decode("utf-8", "replace")
    (data_offset,) = _REFERENCE_OFFSET.unpack_from(view, pos + 1 + n)
    if not is_data_object_path(data_path) or attributes & CONTROL_BIT:
        raise CorruptBatchError(f"claim names {data_path!r}, not a data object", path,
                                expected_offset)
    return data_path, data_offset, end


def _parts_table(view: memoryview, pos: int, header_length: int, attributes: int, count: int,
                 payload_length: int, path: str, expected_offset: int | None
                 ) -> tuple[tuple[int, int], ...]:
    """A multi-batch claim's parts table, checked against the header's totals."""
    def bad(why: str) -> CorruptBatchError:
        return CorruptBatchError(f"parts table {why}", path, expected_offset)

    if not attributes & CLAIM_BIT:
        raise bad("on a batch that is not a claim")
    if pos >= header_length:
        raise bad("missing")
    k = view[pos]
    if not 2 <= k <= MAX_CLAIM_PARTS or pos + 1 + k * _PART.size > header_length:
        raise bad(f"of {k} parts does not fit the header")
    parts = tuple(_PART.unpack_from(view, pos + 1 + i * _PART.size) for i in range(k))
    if any(c < 1 for c, _ in parts) or sum(c for c, _ in parts) != count or \
            sum(n for _, n in parts) != payload_length:
        raise bad(f"{parts} does not add up to {count} records and {payload_length} bytes")
    return parts


def payload_of(data: bytes | pa.Buffer, header: BatchHeader, path: str) -> memoryview:
    """The payload, after checking its length and checksum.

    ``data`` is the batch inline: a batch object without CLAIM_BIT, or any
    batch inside a segment (compaction copies a claim's payload in after its
    unchanged header).
    """
    view = memoryview(data)
    end = header.header_length + header.payload_length
    if len(view) != end:
        raise CorruptBatchError(
            f"batch is {len(view)} bytes, header promises {end}", path, header.base_offset)
    payload = view[header.header_length:end]
    if crc32c.crc32c(payload) != header.payload_crc:
        raise CorruptBatchError("payload checksum mismatch", path, header.base_offset)
    return payload


def check_claim(data: bytes | pa.Buffer, header: BatchHeader, path: str) -> None:
    """A claim object is its header and nothing else."""
    if len(memoryview(data)) != header.header_length:
        raise CorruptBatchError(f"claim is {len(memoryview(data))} bytes, its header "
                                f"{header.header_length}", path, header.base_offset)


def referenced_payload(data: bytes | pa.Buffer, header: BatchHeader, path: str) -> memoryview:
    """A claim's payload as read from its data object: length and checksum checked."""
    view = memoryview(data)
    if len(view) != header.payload_length:
        raise CorruptBatchError(
            f"data object {header.data_path} holds {len(view)} bytes at {header.data_offset}, "
            f"the claim promises {header.payload_length}", path, header.base_offset)
    if crc32c.crc32c(view) != header.payload_crc:
        raise CorruptBatchError(f"payload checksum mismatch (data object {header.data_path} at "
                                f"{header.data_offset})", path, header.base_offset)
    return view


def inline_batch(claim: bytes | pa.Buffer, header: BatchHeader, payload: bytes | memoryview,
                 path: str) -> bytes:
    """A claim and its payload as one inline batch (what a segment stores): the claim's
    header bytes unchanged (so its anchor stays), then the payload."""
    check_claim(claim, header, path)
    return bytes(memoryview(claim)) + bytes(referenced_payload(payload, header, path))


# --- data objects ------------------------------------------------------------

DATA_MAGIC = b"TXD\x01"
# A batch's encoded records: an Arrow buffer from the IPC writer as it is (no copy into
# bytes), or bytes where they come from elsewhere.
Payload: TypeAlias = bytes | pa.Buffer


def is_data_object_path(path: str) -> bool:
    name = path[len(DATA_DIR) + 1:-len(DATA_SUFFIX)] if path.startswith(DATA_DIR + "/") \
        and path.endswith(DATA_SUFFIX) else ""
    return len(name) == 32 and all(c in "0123456789abcdef" for c in name)


def encode_data_object(payloads: list[Payload]) -> tuple[list[Payload], int, list[int]]:
    """The payloads of one flush back to back after the magic: the pieces, their total
    size and where each payload starts.  Pieces, not one joined object, so that local
    disk writes them as they are (joining copied every payload once more)."""
    offsets = []
    position = len(DATA_MAGIC)
    for p in payloads:
        offsets.append(position)
        position += len(p)
    return [DATA_MAGIC, *payloads], position, offsets


# --- data batches ------------------------------------------------------------


# A batch whose records encode to fewer bytes than this is written uncompressed, whatever
# the producer's codec.  Arrow compresses each body buffer with a codec context of its
# own, a fixed cost of about 0.15 ms a batch on the development machine (zstd; lz4 about
# half), which a small transaction pays once per partition on its critical path, while
# a body this small shrinks by 2 KiB at most (format.md 2.4).
MIN_COMPRESSED_BYTES = 4096


def encode_records(table: pa.Table, compression: str | None) -> tuple[pa.Buffer, str | None]:
    """Arrow IPC stream of the records, with Arrow's own buffer compression, and the codec
    it holds: None for a body under MIN_COMPRESSED_BYTES, whatever ``compression`` says."""
    if compression not in COMPRESSION_CODES:
        raise InvalidConfigError(
            f"compression {compression!r} is not supported (use None, 'lz4' or 'zstd')")
    codec = None if compression in (None, "none") else ("lz4" if compression == "lz4" else "zstd")

    def write(sink: pa.NativeFile, codec: str | None) -> None:
        with ipc.new_stream(sink, RECORD_SCHEMA,
                            options=ipc.IpcWriteOptions(compression=codec)) as writer:
            writer.write_table(table)

    def compressed() -> pa.Buffer:
        # Compressing twice to learn the size first would cost more than one copy of
        # the (smaller) result.
        grown = pa.BufferOutputStream()
        write(grown, codec)
        return pa.py_buffer(grown.getvalue().to_pybytes())

    # Records holding twice the threshold in Arrow buffers encode to more than it: they
    # skip the sizing pass, which serialises every column (rebasing a slice's offsets)
    # only to count bytes.
    if codec is not None and table.nbytes >= 2 * MIN_COMPRESSED_BYTES:
        return compressed(), codec
    # Sized first (a pass that copies nothing), then written into a buffer of exactly
    # that size: a growing stream's buffer keeps up to twice the payload allocated for
    # as long as the batch is staged, and copying it out costs a pass over the bytes.
    counted = pa.MockOutputStream()
    write(counted, None)
    if codec is not None and counted.size() >= MIN_COMPRESSED_BYTES:
        return compressed(), codec
    payload = pa.allocate_buffer(counted.size())
    write(pa.FixedSizeBufferWriter(payload), None)
    return payload, None


def decode_records(payload: memoryview | pa.Buffer, header: BatchHeader, path: str) -> pa.Table:
    """The records of a checked payload; a claim of several batches is read part by part
    (each its own Arrow stream, of the length and row count its parts table gives)."""
    buffer = pa.py_buffer(payload)
    if header.has_parts:
        tables, position = [], 0
        for i, (count, length) in enumerate(header.parts):
            part = _read_stream(buffer.slice(position, length), header, path)
            if part.num_rows != count:
                raise CorruptBatchError(f"part {i} of the payload holds {part.num_rows} records, "
                                        f"its parts table says {count}", path,
                                        header.base_offset)
            tables.append(part)
            position += length
        table = pa.concat_tables(tables)
    else:
        table = _read_stream(buffer, header, path)
    if table.num_rows != header.record_count or not table.schema.equals(RECORD_SCHEMA):
        raise CorruptBatchError(
            f"payload holds {table.num_rows} records with schema {table.schema}, header says "
            f"{header.record_count}", path, header.base_offset)
    return table


def _read_stream(buffer: pa.Buffer, header: BatchHeader, path: str) -> pa.Table:
    try:
        return ipc.open_stream(buffer).read_all()
    except (pa.ArrowInvalid, pa.ArrowException) as exc:
        raise CorruptBatchError(f"unreadable Arrow payload: {exc}", path,
                                header.base_offset) from exc


def compression_attribute(compression: str | None) -> int:
    if compression not in COMPRESSION_CODES:
        raise InvalidConfigError(
            f"compression {compression!r} is not supported (use None, 'lz4' or 'zstd')")
    return COMPRESSION_CODES[compression]


# --- control batches ---------------------------------------------------------


def encode_control(record: ControlRecord) -> bytes:
    return _CONTROL.pack(0, record.type, record.coordinator_epoch, record.first_offset)


def decode_control(payload: memoryview | bytes, header: BatchHeader, path: str) -> ControlRecord:
    if len(payload) != _CONTROL.size:
        raise CorruptBatchError(f"control payload of {len(payload)} bytes", path,
                                header.base_offset)
    version, kind, coordinator_epoch, first_offset = _CONTROL.unpack(bytes(payload))
    if version != 0 or kind not in (ABORT, COMMIT):
        raise CorruptBatchError(f"unknown control record version {version} type {kind}", path,
                                header.base_offset)
    return ControlRecord(kind, coordinator_epoch, first_offset)
