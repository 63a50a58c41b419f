"""A table follows its topic's value schema: added fields only.

Old snapshots' files hold the old fields, and a reader given the table's
schema reads them with the added fields null; that is all Iceberg promises
every engine here (a file-list reader such as DuckDB's ``union_by_name`` or
Spark's Parquet scan included).  A field removed, renamed or retyped would
leave old files disagreeing with the table, so the sync refuses it and the
user starts a new table (docs/tables.md "Typed values").
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
from pyiceberg.table import Table

from ..errors import ValueSchemaChangedError
from ..root.topics import TopicDescription
from ..root.value_schema import VALUE_SCHEMA, type_name, value_fields
from .values import VALUE_ERROR, VALUE_FIELDS, typed_schema


def plain(arrow: pa.DataType) -> pa.DataType:
    """``arrow`` as the parser builds it: pyiceberg reads strings and lists as their large
    forms, and names a list's element "element" (the parser: "item")."""
    if pa.types.is_struct(arrow):
        return pa.struct([pa.field(f.name, plain(f.type)) for f in arrow])
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow):
        return pa.list_(plain(arrow.value_type))
    return {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}.get(arrow, arrow)


def differences(old: pa.StructType, new: pa.StructType, prefix: str = ""
                ) -> tuple[list[str], list[str]]:
    """(fields ``new`` adds, what else changed from ``old``), each naming the field."""
    added, changed = [], []
    for field in new:
        if old.get_field_index(field.name) < 0:
            added.append(prefix + field.name)
    for field in old:
        path = prefix + field.name
        if new.get_field_index(field.name) < 0:
            changed.append(f"field {path!r} was removed (or renamed)")
            continue
        was, now = plain(field.type), plain(new.field(field.name).type)
        while pa.types.is_list(was) and pa.types.is_list(now):
            was, now, path = was.value_type, now.value_type, path + "[]"
        if pa.types.is_struct(was) and pa.types.is_struct(now):
            more, other = differences(was, now, path + ".")
            added, changed = added + more, changed + other
        elif was != now:
            changed.append(f"field {path!r} changed from {type_name(was)} to {type_name(now)}")
    return added, changed


def _compare(table: Table, fields: pa.StructType | None) -> tuple[list[str], list[str]]:
    held = pa.struct(list(table.schema().as_arrow()))
    if held.get_field_index(VALUE_FIELDS) < 0:
        return ([VALUE_FIELDS, VALUE_ERROR] if fields is not None else []), []
    if fields is None:
        return [], [f"the table has typed columns ({VALUE_FIELDS}), but the topic's values "
                    "are no longer json"]
    return differences(held.field(VALUE_FIELDS).type, fields, VALUE_FIELDS + ".")


def follow_value_schema(table: Table, desc: TopicDescription,
                        reread: Callable[[], TopicDescription]) -> pa.StructType | None:
    """Add to ``table`` (a schema-change commit, no snapshot) the fields its topic's value
    schema added; the fields to parse values into, in the table's order (None: untyped).

    ``desc`` may be older than the config that last changed the table (read before the
    table was loaded): a change other than additions is refused only if the config
    ``reread`` after the load still asks for it.
    """
    fields = value_fields(desc.config)
    added, changed = _compare(table, fields)
    if changed:
        fields = value_fields(reread().config)
        added, changed = _compare(table, fields)
    if changed:
        topic = table.name()[1]
        raise ValueSchemaChangedError(
            f"the table of topic {topic!r} cannot follow its {VALUE_SCHEMA}: "
            f"{'; '.join(changed)}. Only added fields change a table's schema; move "
            f"tables/{topic} away to start a new table (read from the log start), or set "
            "the schema back")
    if added:
        with table.update_schema() as update:  # CommitFailedException: the sync tries again
            update.union_by_name(typed_schema(fields))
    if fields is None:
        return None
    return plain(pa.struct(list(table.schema().as_arrow())).field(VALUE_FIELDS).type)
