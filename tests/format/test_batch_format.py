"""The batch file format: header fields, attribute bits, checksums, control records.

The producer state is rebuilt from headers alone, and readers trust a batch only
after its checksums pass, so every field must round-trip and every damaged byte
must be caught as CorruptBatchError naming the file and the offset.
"""

from __future__ import annotations

import struct
from dataclasses import replace

import pyarrow as pa
import pytest

from txlog import CorruptBatchError, InvalidConfigError
from txlog.clients.accumulator import normalise_table
from txlog.format.batch import (ABORT, COMMIT, COMPRESSION_MASK, CONTROL_BIT, CREATE_TIME,
                                FIXED_SIZE, LOG_APPEND_TIME, MAGIC, MIN_COMPRESSED_BYTES,
                                RECORD_SCHEMA, TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT, BatchHeader,
                                ControlRecord,
                                compression_attribute, decode_control, decode_header,
                                decode_records, encode_batch, encode_control, encode_header,
                                encode_records, payload_of)

from helpers_core import records_payload

FULL_HEADER = BatchHeader(
    base_offset=123_456_789_012, record_count=17,
    attributes=compression_attribute("zstd") | TRANSACTIONAL_BIT | TIMESTAMP_TYPE_BIT,
    base_timestamp=1_700_000_000_000, max_timestamp=1_700_000_000_999, producer_id=2**40 + 7,
    producer_epoch=32_000, base_sequence=2**31 - 3, decision_id="decision-ü-1",
    transactional_id="txn.id_9")


def test_header_round_trips_every_field() -> None:
    payload = b"p" * 33
    data = encode_batch(FULL_HEADER, payload)
    header = decode_header(data, "f", FULL_HEADER.base_offset)
    assert header.header_length == len(data) - len(payload)
    assert replace(header, payload_length=0, payload_crc=0,
                   header_length=FULL_HEADER.header_length) == FULL_HEADER
    assert header.payload_length == len(payload)
    assert bytes(payload_of(data, header, "f")) == payload
    assert header.last_offset == FULL_HEADER.base_offset + 16
    assert header.next_offset == FULL_HEADER.base_offset + 17
    # Sequences wrap at 2^31 - 1 like Kafka's.
    assert header.last_sequence == (2**31 - 3 + 16) - 2**31


def test_attribute_bits_follow_kafka_v2() -> None:
    """Compression in bits 0-2, timestamp type bit 3, transactional bit 4, control bit 5."""
    assert (compression_attribute(None), compression_attribute("lz4"),
            compression_attribute("zstd")) == (0, 3, 4)
    assert COMPRESSION_MASK == 0b111
    assert (TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT, CONTROL_BIT) == (0x08, 0x10, 0x20)
    h = BatchHeader(0, 1, attributes=4 | TIMESTAMP_TYPE_BIT | CONTROL_BIT | TRANSACTIONAL_BIT)
    assert h.compression == "zstd" and h.timestamp_type == LOG_APPEND_TIME
    assert h.is_control and h.is_transactional
    plain = BatchHeader(0, 1)
    assert plain.compression is None and plain.timestamp_type == CREATE_TIME
    assert not plain.is_control and not plain.is_transactional and not plain.is_idempotent
    with pytest.raises(InvalidConfigError, match="gzip"):
        compression_attribute("gzip")


def test_header_layout_is_big_endian_with_magic_first() -> None:
    data = encode_header(replace(FULL_HEADER, payload_length=5, payload_crc=9))
    assert data[:4] == MAGIC
    # base_offset follows magic(4) crc(4) header_length(2) attributes(2), big-endian int64.
    assert struct.unpack_from(">q", data, 12)[0] == FULL_HEADER.base_offset
    assert len(data) == FIXED_SIZE + 2 + len(FULL_HEADER.decision_id.encode()) + len(
        FULL_HEADER.transactional_id)


def test_every_damaged_header_byte_is_detected() -> None:
    """Flipping any single header byte makes decoding fail, naming file and offset."""
    payload = b"payload"
    data = encode_batch(FULL_HEADER, payload)
    header_length = decode_header(data, "f", None).header_length
    for i in range(header_length):
        damaged = bytearray(data)
        damaged[i] ^= 0x40
        with pytest.raises(CorruptBatchError) as info:
            decode_header(bytes(damaged), "/some/dir/file.batch", FULL_HEADER.base_offset)
        assert info.value.path == "/some/dir/file.batch"
        assert info.value.offset == FULL_HEADER.base_offset
        assert "/some/dir/file.batch" in str(info.value)
        assert f"offset {FULL_HEADER.base_offset}" in str(info.value)


def test_payload_damage_and_length_mismatch_are_detected() -> None:
    payload = records_payload([b"a" * 100, None, b""])
    data = encode_batch(BatchHeader(5, 3), payload)
    header = decode_header(data, "f", 5)
    damaged = bytearray(data)
    damaged[header.header_length + len(payload) // 2] ^= 1
    with pytest.raises(CorruptBatchError, match="payload checksum") as info:
        payload_of(bytes(damaged), header, "path.batch")
    assert (info.value.path, info.value.offset) == ("path.batch", 5)
    with pytest.raises(CorruptBatchError, match="header promises"):
        payload_of(data[:-1], header, "path.batch")
    with pytest.raises(CorruptBatchError, match="header promises"):
        payload_of(data + b"\0", header, "path.batch")


def test_header_truncation_and_offset_mismatch() -> None:
    data = encode_batch(BatchHeader(40, 2), b"xy")
    with pytest.raises(CorruptBatchError, match="truncated"):
        decode_header(data[:10], "f", 40)
    with pytest.raises(CorruptBatchError, match="header length"):
        decode_header(data[:FIXED_SIZE], "f", 40)  # fixed part present, strings cut off
    with pytest.raises(CorruptBatchError, match="header says base offset 40"):
        decode_header(data, "f", 41)  # a file under the wrong name is not trusted
    # The header alone (what the producer state reads) is enough to decode it.
    header_only = data[:decode_header(data, "f", 40).header_length]
    assert decode_header(header_only, "f", 40).record_count == 2


def test_header_strings_are_limited() -> None:
    with pytest.raises(InvalidConfigError, match="transactional id"):
        encode_header(BatchHeader(0, 1, transactional_id="t" * 256))
    encode_header(BatchHeader(0, 1, transactional_id="t" * 255))


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_records_round_trip(compression: str | None) -> None:
    values = [b"", None, b"x" * 5000, bytes(range(256))]
    keys = [None, b"", b"k", b"\0\xff"]
    payload = records_payload(values, keys, compression)
    header = BatchHeader(0, len(values), attributes=compression_attribute(compression))
    table = decode_records(pa.py_buffer(payload), header, "f")
    assert table.schema.equals(RECORD_SCHEMA)
    assert table.column("value").to_pylist() == values
    assert table.column("key").to_pylist() == keys


@pytest.mark.parametrize("compression", [None, "lz4"])
def test_an_encoded_payload_holds_no_more_memory_than_its_bytes(compression: str | None
                                                                ) -> None:
    """A producer stages payloads until its data object fills: what it holds must be
    their size (docs/spark.md bounds a task's memory by dataObjectBytes), not a growing
    stream's doubled allocation."""
    values = [bytes([i % 251]) * 1000 for i in range(1100)]  # about 1.1 MB
    before = pa.total_allocated_bytes()
    payloads = [records_payload(values, compression=compression) for _ in range(10)]
    held = pa.total_allocated_bytes() - before
    assert held <= 1.05 * sum(len(p) for p in payloads) + 10 * 64


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_a_slice_is_compressed_by_its_own_size_not_its_parents(compression: str) -> None:
    """send_table encodes slices of one table regrouped by partition: a few records cut
    from a large table stay under the threshold, and a large slice is compressed without
    the pass that sizes it, reading back as the same records."""
    values = [bytes([i % 251]) * 100 for i in range(2000)]  # 200 KB in all
    records = normalise_table(pa.table({"value": values}), 0)[0]
    small = records.slice(1000, 3)
    assert small.nbytes < MIN_COMPRESSED_BYTES < records.nbytes
    assert encode_records(small, compression)[1] is None
    large = records.slice(500, 1000)
    payload, codec = encode_records(large, compression)
    assert codec == compression and len(payload) < large.nbytes
    header = BatchHeader(0, 1000, attributes=compression_attribute(codec))
    assert decode_records(payload, header, "f").column("value").to_pylist() == values[500:1500]


def test_record_count_mismatch_is_corruption() -> None:
    payload = records_payload([b"a", b"b"])
    with pytest.raises(CorruptBatchError, match="2 records"):
        decode_records(payload, BatchHeader(7, 3), "f")
    with pytest.raises(CorruptBatchError, match="unreadable Arrow payload"):
        decode_records(b"not arrow at all", BatchHeader(7, 1), "f")


def test_unknown_compression_is_refused() -> None:
    table = RECORD_SCHEMA.empty_table()
    with pytest.raises(InvalidConfigError, match="snappy"):
        encode_records(table, "snappy")


@pytest.mark.parametrize("kind", [ABORT, COMMIT])
def test_control_record_round_trip(kind: int) -> None:
    record = ControlRecord(kind, coordinator_epoch=12, first_offset=345)
    payload = encode_control(record)
    header = BatchHeader(0, 1, attributes=CONTROL_BIT | TRANSACTIONAL_BIT)
    assert decode_control(payload, header, "f") == record
    with pytest.raises(CorruptBatchError):
        decode_control(payload[:-1], header, "f")
    bad_type = payload[:2] + struct.pack(">h", 7) + payload[4:]
    with pytest.raises(CorruptBatchError, match="type 7"):
        decode_control(bad_type, header, "f")
