"""Typed values: a json topic's values parsed into one struct column, bad ones kept.

A topic whose config sets ``txlog.value.format=json`` (root/value_schema.py)
has its table carry two more columns: ``value_fields``, a struct of the
declared fields, and ``value_error``, why a value did not parse (null when it
did).  A value that does not parse keeps its row: its raw ``value``, a null
struct and the error, and each snapshot counts them (``txlog.value-errors``).

The parse is Arrow's JSON reader over the joined values, one call for a block
of good values.  Per-row attribution comes from two facts argued in
docs/tables.md ("Typed values"): a value is a candidate only if it starts with
``{`` and ends with ``}`` (whitespace aside), and a block of candidates that
parses into exactly as many rows as it has values holds one object per value,
in order.  A block that fails is split in two and each half parsed again,
down to single values, whose failure is their error.  Only pyarrow is needed:
readers that build these columns from a log's records use this module too.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from ..clients.columns import spark_schema

VALUE_FIELDS = "value_fields"
VALUE_ERROR = "value_error"
ERRORS_KEY = "txlog.value-errors"  # snapshot summary: values of the snapshot that did not parse
NOT_AN_OBJECT = "not a JSON object"
NOT_UTF8 = "not valid UTF-8"
# Well-formed UTF-8 byte by byte (RFC 3629: no overlong forms, surrogates or code points
# past U+10FFFF); on binary values Arrow's regular expressions match bytes.
UTF8 = (r"^(?:[\x00-\x7F]|[\xC2-\xDF][\x80-\xBF]|\xE0[\xA0-\xBF][\x80-\xBF]"
        r"|[\xE1-\xEC\xEE\xEF][\x80-\xBF]{2}|\xED[\x80-\x9F][\x80-\xBF]"
        r"|\xF0[\x90-\xBF][\x80-\xBF]{2}|[\xF1-\xF3][\x80-\xBF]{3}|\xF4[\x80-\x8F][\x80-\xBF]{2})*$")
# Arrow's JSON reader parses a block per thread; no value may straddle two, so a block
# is at least the longest value, and otherwise this many bytes.
MIN_BLOCK = 1 << 22
_LARGE = pa.large_binary()


def typed_schema(fields: pa.StructType | None) -> pa.Schema:
    """A table's columns: Kafka's, and for a json topic the struct and the error."""
    schema = spark_schema(True)
    if fields is None:
        return schema
    return schema.append(pa.field(VALUE_FIELDS, fields)).append(pa.field(VALUE_ERROR, pa.string()))


def with_typed_values(records: pa.Table, fields: pa.StructType | None) -> pa.Table:
    """``records`` (Kafka's columns) with the typed columns of ``fields`` (None: as is)."""
    if fields is None:
        return records
    parsed = [parse_json_values(chunk, fields) for chunk in records["value"].chunks]
    structs = pa.chunked_array([p[0] for p in parsed], fields)
    errors = pa.chunked_array([p[1] for p in parsed], pa.string())
    return records.append_column(VALUE_FIELDS, structs).append_column(VALUE_ERROR, errors)


def error_count(records: pa.Table) -> int:
    """How many of ``records`` (typed) did not parse."""
    return int(pc.count(records[VALUE_ERROR]).as_py())


def parse_json_values(values: pa.Array, fields: pa.StructType) -> tuple[pa.Array, pa.Array]:
    """Each value's fields (null where it is null or did not parse) and its error (null
    where it parsed, or is null: a tombstone is no error)."""
    # Arrow's JSON reader copies a string's bytes unchecked: well-formed UTF-8 (RFC 3629),
    # checked here byte-wise, is what keeps broken text out of a string column.
    utf8 = pc.match_substring_regex(values, UTF8).fill_null(False)
    candidate = pc.and_(utf8, pc.and_(pc.match_substring_regex(values, r"^[ \t\r\n]*\{"),
                                      pc.match_substring_regex(values, r"\}[ \t\r\n]*$")))
    positions = _where(candidate)
    blocks: list[tuple[int, pa.Table]] = []
    failed: dict[int, str] = {}
    if len(positions):
        _Parser(values.take(positions), fields).parse(0, len(positions), blocks, failed)
    parsed = pa.concat_tables([t for _, t in blocks]).to_struct_array().combine_chunks() \
        if blocks else pa.array([], fields)
    good = np.concatenate([positions[lo:lo + t.num_rows] for lo, t in blocks]) \
        if blocks else np.array([], np.int64)
    structs = parsed.cast(fields).take(_scatter(len(values), good))
    # Error codes: 0 not UTF-8, 1 not an object, 2 + i the i-th failed candidate's.
    codes = np.full(len(values), -1, np.int64)
    codes[_where(pc.and_(pc.is_valid(values), pc.invert(candidate)))] = 1
    codes[_where(pc.and_(pc.is_valid(values), pc.invert(utf8)))] = 0
    codes[positions[list(failed)]] = np.arange(2, len(failed) + 2)
    messages = pa.array([NOT_UTF8, NOT_AN_OBJECT, *failed.values()], pa.string())
    return structs, messages.take(pa.array(codes, mask=codes < 0))


def _where(mask: pa.Array) -> np.ndarray:
    return np.flatnonzero(mask.fill_null(False).to_numpy(zero_copy_only=False))


def _scatter(n: int, rows: np.ndarray) -> pa.Array:
    """Take-indices of length ``n``: ``rows[i]`` gets ``i``, every other row null."""
    where = np.full(n, -1, np.int64)
    where[rows] = np.arange(len(rows))
    return pa.array(where, mask=where < 0)


class _Parser:
    """The candidates as newline-terminated values, parsed a block at a time."""

    def __init__(self, values: pa.Array, fields: pa.StructType) -> None:
        lines = pc.binary_join_element_wise(values.cast(_LARGE), pa.scalar(b"", _LARGE),
                                            pa.scalar(b"\n", _LARGE))
        self.data = lines.buffers()[2]
        self.offsets = np.frombuffer(lines.buffers()[1], np.int64)[
            lines.offset:lines.offset + len(lines) + 1]
        longest = int(np.max(np.diff(self.offsets)))
        self.schema = pa.schema(list(fields))
        self.block = max(longest + 1, MIN_BLOCK)
        # Arrow's faster reader cuts its blocks at newlines; where a value spreads over
        # lines (JSON allows newlines as whitespace), blocks must end where objects do.
        self.spread = bool(pc.any(pc.match_substring_regex(values, r"[\r\n]")).as_py())

    def _read(self, lo: int, hi: int) -> pa.Table:
        start, end = int(self.offsets[lo]), int(self.offsets[hi])
        options = pj.ParseOptions(explicit_schema=self.schema, newlines_in_values=self.spread,
                                  unexpected_field_behavior="ignore")
        return pj.read_json(pa.BufferReader(self.data.slice(start, end - start)),
                            read_options=pj.ReadOptions(block_size=self.block),
                            parse_options=options)

    def parse(self, lo: int, hi: int, blocks: list[tuple[int, pa.Table]],
              failed: dict[int, str]) -> None:
        """Candidates ``[lo, hi)``: each good block appended with its first candidate, in
        order; each bad candidate's error in ``failed``."""
        try:
            table = self._read(lo, hi)
            problem = None if table.num_rows == hi - lo else "more than one JSON value"
        except ValueError as exc:  # ArrowInvalid: the values, not the reader, are at fault
            problem = str(exc).split(" in row ")[0]
        if problem is None:
            blocks.append((lo, table))
        elif hi - lo == 1:
            failed[lo] = problem
        else:
            mid = (lo + hi) // 2
            self.parse(lo, mid, blocks, failed)
            self.parse(mid, hi, blocks, failed)
