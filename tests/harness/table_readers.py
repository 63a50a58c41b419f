"""A typed topic with a table for the reader tests, each engine's read of it, one checksum.

The engines read through the snippets of docs/tables.md ("How each engine
reads the table"), run as they stand, so the documentation is what is
tested.  Every answer is brought to one form (Kafka's record columns and the
typed two, in their order and types, rows by partition and offset) and summed
up as a row count and a digest over every value of every column.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from txlog import Log
from txlog.root.root import Root
from txlog.root.value_schema import VALUE_FORMAT, VALUE_SCHEMA, parse_value_schema
from txlog.tables.sync import sync_table
from txlog.tables.values import typed_schema, with_typed_values

TOPIC = "events"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "tables.md"
ENGINES = ("pyiceberg", "Polars", "DuckDB")
# The topic's values are typed (docs/tables.md, "Typed values"): a nested struct, a list and
# a timestamp among the fields; the plain producer's values do not parse (kept, with errors).
SCHEMA = {"n": "long", "s": "string", "at": "timestamp", "tags": ["string"],
          "item": {"sku": "string", "qty": "int"}}
FIELDS = parse_value_schema(json.dumps(SCHEMA))
COLUMNS = typed_schema(FIELDS)  # Kafka's columns, headers included, and the typed two
BARE = pa.schema([f for f in COLUMNS if f.name != "headers"])  # includeHeaders false


def value(i: int) -> bytes:
    return json.dumps({"n": i, "s": f"s{i}", "at": f"2026-11-27T10:00:{i:02d}",
                       "tags": [f"t{i}"] * (i % 3), "item": {"sku": f"k{i}", "qty": i}}).encode()


@dataclass(frozen=True)
class Built:
    """The topic as built: what its writers were told was committed, and the offsets."""

    committed: frozenset[tuple[int, int]]  # (partition, offset) of every committed record
    snapshot: dict[int, int]  # the newest snapshot's offsets
    ends: dict[int, int]  # every partition's end, the tail past the snapshot included


def _send(producer, records: list[tuple[int, bytes]]) -> list[tuple[int, int]]:
    futures = [producer.send(TOPIC, v, key=b"k" + v[-4:], partition=p,
                             headers=[("h", v[:4]), ("n", None)]) for p, v in records]
    return [(m.partition, m.offset) for m in (f.get() for f in futures)]


def build(log: Log, syncer: Root) -> Built:
    """Three partitions: transactions committed across partitions and aborted, plain
    records, three syncs, then a tail of committed records past the newest snapshot."""
    log.create_topic(TOPIC, partitions=3,
                     config={VALUE_FORMAT: "json", VALUE_SCHEMA: json.dumps(SCHEMA)})
    txn = log.producer(transactional_id="readers")
    txn.init_transactions()
    plain = log.producer()
    committed: set[tuple[int, int]] = set()
    rounds = [(True, [(0, value(1)), (1, value(2)), (2, value(3))]),
              (False, [(0, value(4)), (1, value(5))]), (True, [(1, value(6)), (2, value(7))]),
              (True, [(0, value(8)), (0, b'{"n": "nine"}'), (2, value(10))])]
    for i, (commit, records) in enumerate(rounds):
        txn.begin_transaction()
        written = _send(txn, records)
        if commit:
            txn.commit_transaction()
            committed.update(written)
        else:
            txn.abort_transaction()
        committed.update(_send(plain, [(i % 3, b"p%d" % i)]))
        txn.flush()
        if i % 2:
            sync_table(syncer, TOPIC)
    for producer in (txn, plain):
        producer.close()  # markers written: the last sync and the ends see them
    snapshot = sync_table(syncer, TOPIC).offsets
    tail = log.producer(transactional_id="tail")
    tail.init_transactions()
    tail.begin_transaction()
    committed.update(_send(tail, [(0, value(11)), (2, b"not json")]))
    tail.commit_transaction()
    tail.close()
    ends = {p: log.end_offset(TOPIC, p) for p in range(3)}
    return Built(frozenset(committed), snapshot, ends)


def typed(records: pa.Table) -> pa.Table:
    """A txlog read's records with the typed columns the table's sync would give them."""
    return with_typed_values(records, FIELDS)


def canonical(records: pa.Table, schema: pa.Schema = COLUMNS) -> pa.Table:
    """An engine's answer in ``schema``'s columns and types, by partition and offset."""
    chosen = records.select(schema.names)
    return chosen.cast(schema).sort_by([("partition", "ascending"), ("offset", "ascending")])


def checksum(records: pa.Table, schema: pa.Schema = COLUMNS) -> tuple[int, str]:
    """(rows, digest over every value of every column) of ``records`` in canonical form."""
    table = canonical(records, schema)
    digest = hashlib.sha256()
    for name in table.column_names:
        digest.update(name.encode())
        digest.update(repr(table.column(name).to_pylist()).encode())
    return table.num_rows, digest.hexdigest()


def keys(records: pa.Table) -> set[tuple[int, int]]:
    return set(zip(records["partition"].to_pylist(), records["offset"].to_pylist()))


def snippets() -> dict[str, str]:
    """The Python snippets of docs/tables.md's "How each engine reads the table", by engine
    (the bold name that introduces each)."""
    text = DOCS.read_text()
    section = text[text.index("## How each engine reads the table"):]
    section = section[:section.index("\n## ", 1)]
    found, engine = {}, ""
    for i, part in enumerate(re.split(r"^```", section, flags=re.M)):
        if i % 2 == 0:  # prose: the last engine named in bold introduces the next block
            names = re.findall(r"^\*\*(\w+)\*\*", part, re.M)
            engine = names[-1] if names else engine
        elif part.startswith("python\n"):
            found[engine] = part[len("python\n"):]
    return found


def engine_reads(url: str, storage_options: dict, polars_options: dict) -> dict[str, pa.Table]:
    """Each engine's read of the table, by the documented snippets, run in order in one
    namespace (Polars uses pyiceberg's table, DuckDB its root)."""
    namespace = {"url": url, "topic": TOPIC, "storage_options": storage_options,
                 "polars_options": polars_options}
    reads = {}
    code = snippets()
    assert set(code) == set(ENGINES), f"docs/tables.md's snippets: {sorted(code)}"
    for engine in ENGINES:
        exec(compile(code[engine], f"docs/tables.md ({engine})", "exec"), namespace)
        reads[engine] = namespace.pop("records")
    return reads
