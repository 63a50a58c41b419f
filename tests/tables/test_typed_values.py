"""Typed values: a json topic's values in one struct column, bad ones kept and counted.

Expectations are written out from the values sent, never read back from the
parser: which rows parse, their fields, and which error each bad row gets.
"""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pytest

from txlog import Log
from txlog.errors import InvalidConfigError, UnknownTopicError, ValueSchemaChangedError
from txlog.root.root import Root
from txlog.root.value_schema import VALUE_FORMAT, VALUE_SCHEMA, parse_value_schema

pytest.importorskip("pyiceberg", reason="needs the tables extra: pip install -e '.[tables]'")

import txlog.tables.values as values_module  # noqa: E402
from txlog.tables.catalog import RootCatalog, table_identifier  # noqa: E402
from txlog.tables.evolution import follow_value_schema  # noqa: E402
from txlog.tables.sync import sync_table  # noqa: E402
from txlog.tables.values import (ERRORS_KEY, NOT_AN_OBJECT, NOT_UTF8,  # noqa: E402
                                 parse_json_values)

TOPIC = "orders"
SCHEMA = {"id": "long", "name": "string", "at": "timestamp", "tags": ["string"],
          "item": {"sku": "string", "qty": "int"}}


def typed(schema: dict = SCHEMA) -> dict[str, str]:
    return {VALUE_FORMAT: "json", VALUE_SCHEMA: json.dumps(schema)}


def parse(values: list[bytes | None], schema: dict = SCHEMA) -> list[tuple[dict | None, str | None]]:
    structs, errors = parse_json_values(pa.array(values, pa.binary()),
                                        parse_value_schema(json.dumps(schema)))
    return list(zip(structs.to_pylist(), errors.to_pylist()))


def row(**fields) -> dict:
    return {name: fields.get(name) for name in SCHEMA}


# --- the config ------------------------------------------------------------------------------

@pytest.mark.parametrize("config, named", [
    ({VALUE_FORMAT: "avro"}, "txlog.value.format must be one of ('none', 'json')"),
    ({VALUE_FORMAT: "json"}, "txlog.value.format=json needs txlog.value.schema"),
    ({VALUE_SCHEMA: '{"id": "long"}'}, "txlog.value.schema is set but txlog.value.format"),
    (typed({"id": "integer"}), "field 'id' has unknown type 'integer'"),
    (typed({"a": {"b": ["uuid"]}}), "field 'a.b[]' has unknown type 'uuid'"),
    (typed({"a": {}}), "'a' has no fields"),
    (typed({"a.b": "long"}), "field name 'a.b' is empty or holds a '.'"),
    (typed({"a": 3}), "field 'a' has type 3"),
    ({VALUE_FORMAT: "json", VALUE_SCHEMA: '{"a": "long", "a": "int"}'},
     "field 'a' is declared twice"),
    ({VALUE_FORMAT: "json", VALUE_SCHEMA: '["long"]'}, "it is not a JSON object"),
    ({VALUE_FORMAT: "json", VALUE_SCHEMA: '{"a": '}, "it is not JSON"),
])
def test_a_bad_value_config_is_refused_at_create_naming_the_key_and_field(log, config, named):
    with pytest.raises(InvalidConfigError, match=re.escape(named)):
        log.create_topic(TOPIC, 1, config=config)
    with pytest.raises(UnknownTopicError):
        log.describe_topic(TOPIC)


def test_a_bad_value_config_is_refused_at_alter(log):
    log.create_topic(TOPIC, 1, config=typed())
    with pytest.raises(InvalidConfigError, match="field 'id' has unknown type 'int64'"):
        log.alter_topic_config(TOPIC, set={VALUE_SCHEMA: '{"id": "int64"}'})
    with pytest.raises(InvalidConfigError, match="txlog.value.format=json needs"):
        log.alter_topic_config(TOPIC, delete=[VALUE_SCHEMA])
    with pytest.raises(InvalidConfigError, match="is set but txlog.value.format is not json"):
        log.alter_topic_config(TOPIC, delete=[VALUE_FORMAT])
    assert log.describe_topic(TOPIC, refresh=True).config == typed()
    log.alter_topic_config(TOPIC, delete=[VALUE_FORMAT, VALUE_SCHEMA])
    assert log.describe_topic(TOPIC, refresh=True).config == {}


# --- the parse -------------------------------------------------------------------------------

def test_good_values_are_typed_and_bad_ones_kept_with_their_error():
    got = parse([
        b'{"id": 1, "name": "a", "at": "2026-11-27T10:00:00+01:00", "tags": ["x", "y"], '
        b'"item": {"sku": "s1", "qty": 2}, "undeclared": {"deep": [1]}}',
        b"not json",
        None,                                       # a tombstone: no fields, and no error
        b'{"id": "one"}',                           # a type mismatch
        b' \n{"id": 2,\n  "name": "spread over lines"}\n',
        b'{"id": 3} {"id": 4}',                     # two values in one record
        b"   ",
        b'{"id": 1.5}',
        b'{"item": {"qty": 99999999999}}',          # out of int's range
        b'{"name": "\xff"}',                        # not UTF-8
        b'{"name": "\\ud800"}',                     # an escaped lone surrogate
        b'{"name": "\xed\xa0\x80"}',                # a raw one: not UTF-8 either
        b"{}",
        b'{"id": 5',
    ])
    assert got == [
        (row(id=1, name="a", at=pa.scalar(1795770000000000, pa.timestamp("us", "UTC")).as_py(),
             tags=["x", "y"], item={"sku": "s1", "qty": 2}), None),
        (None, NOT_AN_OBJECT),
        (None, None),
        (None, "JSON parse error: Column(/id) changed from number to string"),
        (row(id=2, name="spread over lines"), None),
        (None, "more than one JSON value"),
        (None, NOT_AN_OBJECT),
        (None, "Failed to convert JSON to int64, couldn't parse:1.5"),
        (None, "Failed to convert JSON to int32, couldn't parse:99999999999"),
        (None, NOT_UTF8),
        (None, "JSON parse error: The surrogate pair in string is invalid."),
        (None, NOT_UTF8),
        (row(), None),
        (None, NOT_AN_OBJECT),
    ]


def counting_reads(monkeypatch) -> list[int]:
    """The number of Arrow JSON reads the parse makes, and the rows each was given."""
    reads: list[int] = []
    read = values_module._Parser._read

    def counted(parser, lo: int, hi: int) -> pa.Table:
        reads.append(hi - lo)
        return read(parser, lo, hi)

    monkeypatch.setattr(values_module._Parser, "_read", counted)
    return reads


def test_bad_values_are_found_among_many_good_ones(monkeypatch):
    """The block fails; bisection keeps every good value typed and blames only the bad,
    with at most two reads per bad value and halving (docs/tables.md: the cost)."""
    reads = counting_reads(monkeypatch)
    values = [b'{"id": %d}' % i for i in range(1025)]
    bad = {7: b'{"id": true}', 500: b'{"id": 1} {"id": 2}', 501: b'{"id": "x"}', 1024: b"]"}
    for i, v in bad.items():
        values[i] = v
    got = parse(values, {"id": "long"})
    assert [i for i, (_, error) in enumerate(got) if error] == sorted(bad)
    assert all(fields == {"id": i} for i, (fields, _) in enumerate(got) if i not in bad)
    assert all(fields is None for i, (fields, _) in enumerate(got) if i in bad)
    # "]" is no candidate: three bad among 1024 candidates, ten halvings each at most.
    assert len(reads) <= 1 + 2 * 3 * 10 and sum(reads) <= 1024 * (1 + 2 * 2)
    reads.clear()
    parse(values[:7] + values[8:500], {"id": "long"})
    assert reads == [499]  # all good: one read


def test_values_spread_over_lines_take_one_read_across_many_blocks(monkeypatch):
    """Blocks as small as the longest value: Arrow's reader that finds objects' ends
    keeps a value spread over lines whole, where the line reader would cut it."""
    monkeypatch.setattr(values_module, "MIN_BLOCK", 1)
    reads = counting_reads(monkeypatch)
    values = [b'{\n  "id": %d,\n  "name": "n%d"\n}' % (i, i) for i in range(300)]
    assert parse(values) == [(row(id=i, name=f"n{i}"), None) for i in range(300)]
    assert reads == [300]


def test_a_record_holding_two_objects_next_to_an_empty_one_is_not_split_between_them():
    """Two objects in one record and none in the next parse into as many rows as records:
    only the check that a record starts with '{' and ends with '}' keeps them apart."""
    assert parse([b'{"id": 1} {"id": 2}', b" "], {"id": "long"}) == [
        (None, "more than one JSON value"), (None, NOT_AN_OBJECT)]
    assert parse([b'{"id": 1}\n{"id": 2}', b"\n"], {"id": "long"}) == [
        (None, "more than one JSON value"), (None, NOT_AN_OBJECT)]


# --- the table -------------------------------------------------------------------------------

def send(log: Log, *values: bytes | None, partition: int = 0) -> None:
    producer = log.producer()
    for value in values:
        producer.send(TOPIC, value, partition=partition)
    producer.close()


def load(root: Root):
    return RootCatalog(root.storage).load_table(table_identifier(TOPIC))


def by_offset(root: Root) -> dict[tuple[int, int], tuple[bytes | None, dict | None, str | None]]:
    scanned = load(root).scan().to_arrow()
    return {(p, o): (v, f, e) for p, o, v, f, e in zip(*(
        scanned[c].to_pylist() for c in ("partition", "offset", "value", "value_fields",
                                          "value_error")))}


def test_a_sync_keeps_every_record_typed_or_with_its_error_and_counts_the_errors(log, tmp_path):
    log.create_topic(TOPIC, 2, config=typed({"id": "long", "tags": ["string"]}))
    send(log, b'{"id": 1, "tags": ["a"]}', b"oops", None, partition=0)
    send(log, b'{"id": "two"}', b'{"id": 3}', partition=1)
    root = Root(tmp_path / "log")
    first = sync_table(root, TOPIC)
    assert first.records == 5 and first.value_errors == 2
    assert load(root).current_snapshot().summary[ERRORS_KEY] == "2"
    assert by_offset(root) == {
        (0, 0): (b'{"id": 1, "tags": ["a"]}', {"id": 1, "tags": ["a"]}, None),
        (0, 1): (b"oops", None, NOT_AN_OBJECT),
        (0, 2): (None, None, None),
        (1, 0): (b'{"id": "two"}', None,
                 "JSON parse error: Column(/id) changed from number to string"),
        (1, 1): (b'{"id": 3}', {"id": 3, "tags": None}, None),
    }
    send(log, b'{"id": 4}', partition=0)
    sync_table(root, TOPIC)
    assert load(root).current_snapshot().summary[ERRORS_KEY] == "0"


def test_an_untyped_topic_has_neither_the_columns_nor_the_count(log, tmp_path):
    log.create_topic(TOPIC, 1)
    send(log, b"anything")
    root = Root(tmp_path / "log")
    sync_table(root, TOPIC)
    table = load(root)
    assert "value_fields" not in table.schema().column_names
    assert ERRORS_KEY not in table.current_snapshot().summary.additional_properties


def test_an_added_field_evolves_the_table_and_old_rows_read_it_as_null(log, tmp_path):
    log.create_topic(TOPIC, 1, config=typed({"id": "long", "item": {"sku": "string"}}))
    send(log, b'{"id": 1, "item": {"sku": "a", "qty": 5}, "note": "n"}')
    root = Root(tmp_path / "log")
    sync_table(root, TOPIC)
    log.alter_topic_config(TOPIC, set={VALUE_SCHEMA: json.dumps(
        {"note": "string", "id": "long", "item": {"qty": "int", "sku": "string"}})})
    send(log, b'{"id": 2, "item": {"sku": "b", "qty": 6}, "note": "m"}')
    sync_table(root, TOPIC)
    table = load(root)
    assert table.schema().find_type("value_fields.item.qty") is not None
    assert len(table.metadata.schemas) == 2  # the original schema, and one with the fields
    rows = by_offset(root)
    assert rows[(0, 0)][1] == {"id": 1, "item": {"sku": "a", "qty": None}, "note": None}
    assert rows[(0, 1)][1] == {"id": 2, "item": {"sku": "b", "qty": 6}, "note": "m"}
    duckdb = pytest.importorskip("duckdb")  # a file-list reader: the old file lacks the fields
    files = [task.file.file_path for task in table.scan().plan_files()]
    assert len(files) == 2
    assert duckdb.sql(f"SELECT value_fields FROM read_parquet({files}, union_by_name = true) "
                      'ORDER BY "offset"').fetchall() == [(rows[(0, 0)][1],), (rows[(0, 1)][1],)]


def test_a_json_format_set_on_an_untyped_table_adds_the_typed_columns(log, tmp_path):
    log.create_topic(TOPIC, 1)
    send(log, b'{"id": 1}')
    root = Root(tmp_path / "log")
    sync_table(root, TOPIC)
    log.alter_topic_config(TOPIC, set=typed({"id": "long"}))
    send(log, b'{"id": 2}')
    sync_table(root, TOPIC)
    assert {k: v[1:] for k, v in by_offset(root).items()} == {
        (0, 0): (None, None), (0, 1): ({"id": 2}, None)}


@pytest.mark.parametrize("change, named", [
    ({"id": "string", "name": "string"}, "field 'value_fields.id' changed from long to string"),
    ({"id": "long"}, "field 'value_fields.name' was removed (or renamed)"),
    ({"id": "long", "title": "string"}, "field 'value_fields.name' was removed"),
    ({"id": ["long"], "name": "string"}, "field 'value_fields.id' changed from long to [\"long\"]"),
    (None, "the topic's values are no longer json"),
])
def test_any_other_change_is_refused_and_the_table_stays(log, tmp_path, change, named):
    log.create_topic(TOPIC, 1, config=typed({"id": "long", "name": "string"}))
    send(log, b'{"id": 1, "name": "a"}')
    root = Root(tmp_path / "log")
    before = sync_table(root, TOPIC).metadata_location
    if change is None:
        log.alter_topic_config(TOPIC, delete=[VALUE_FORMAT, VALUE_SCHEMA])
    else:
        log.alter_topic_config(TOPIC, set={VALUE_SCHEMA: json.dumps(change)})
    send(log, b'{"id": 2, "name": "b"}')
    with pytest.raises(ValueSchemaChangedError, match=re.escape(named)) as refused:
        sync_table(root, TOPIC)
    assert f"move tables/{TOPIC} away" in str(refused.value)
    assert load(root).metadata_location == before


def test_a_config_read_before_another_sync_added_a_field_is_read_again(log, tmp_path):
    """A sync read the config, then another sync (of the newer config) added a field to
    the table: the first must not take the field for a removed one."""
    log.create_topic(TOPIC, 1, config=typed({"id": "long"}))
    root = Root(tmp_path / "log")
    stale = root.describe_topic(TOPIC, refresh=True)
    sync_table(root, TOPIC)
    log.alter_topic_config(TOPIC, set={VALUE_SCHEMA: json.dumps({"id": "long", "n": "int"})})
    sync_table(root, TOPIC)
    table = load(root)
    fresh = root.describe_topic(TOPIC, refresh=True)
    assert follow_value_schema(table, stale, lambda: fresh) == pa.struct(
        [("id", pa.int64()), ("n", pa.int32())])
    with pytest.raises(ValueSchemaChangedError, match="'value_fields.n' was removed"):
        follow_value_schema(table, stale, lambda: stale)


def test_a_sync_that_lost_to_one_adding_a_field_starts_again_with_it(log, tmp_path):
    log.create_topic(TOPIC, 1, config=typed({"id": "long"}))
    send(log, b'{"id": 1, "n": 7}')
    first, second = Root(tmp_path / "log"), Root(tmp_path / "log")
    done = {}

    def pause(step: str, partition: int | None) -> None:
        if step == "commit" and not done:
            log.alter_topic_config(TOPIC, set={VALUE_SCHEMA: json.dumps(
                {"id": "long", "n": "int"})})
            done["second"] = sync_table(second, TOPIC)
            send(log, b'{"id": 2, "n": 8}')

    result = sync_table(first, TOPIC, pause)
    # Its first attempt parsed offset 0 without n: not appended; the next reads offset 1.
    assert result.conflicts == 1 and result.records == 1
    assert by_offset(first) == {(0, 0): (b'{"id": 1, "n": 7}', {"id": 1, "n": 7}, None),
                                (0, 1): (b'{"id": 2, "n": 8}', {"id": 2, "n": 8}, None)}
