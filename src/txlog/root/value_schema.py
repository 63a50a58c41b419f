"""A topic's declared value format: the two config keys, checked when they are set.

``txlog.value.format`` says how a topic's values are encoded (``none``, or
``json``); ``txlog.value.schema`` gives a ``json`` topic's fields as a JSON
object of field name -> type, which a sync of the topic's table parses into
typed columns (tables/values.py, docs/tables.md "Typed values").  The checks
live here, with the other topic configs, so that a bad schema is refused when
it is set, naming the field and the type, rather than found by a later sync.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from ..errors import InvalidConfigError

VALUE_FORMAT = "txlog.value.format"
VALUE_SCHEMA = "txlog.value.schema"
VALUE_FORMATS = ("none", "json")

# The type names a schema may use, and the Arrow types the parser fills (Iceberg's
# boolean, int, long, double, string, timestamptz).  A timestamp is ISO-8601 text, taken
# as UTC where it names no offset.
TYPES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "double": pa.float64(),
    "string": pa.string(), "timestamp": pa.timestamp("us", tz="UTC"),
}
SCHEMA_FORM = (f"a JSON object of field name -> type, a type being one of "
               f"{', '.join(TYPES)}, an object of the same form (a nested record) or a "
               "one-element array [type] (a list)")


class _Problem(Exception):
    """What is wrong with a schema, naming the field (a dotted path) where there is one."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    names = [name for name, _ in pairs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise _Problem(f"field {twice[0]!r} is declared twice")
    return dict(pairs)


def _arrow_type(declared: Any, path: str) -> pa.DataType:
    if isinstance(declared, str):
        if declared not in TYPES:
            raise _Problem(f"field {path!r} has unknown type {declared!r} "
                           f"(known: {', '.join(TYPES)})")
        return TYPES[declared]
    if isinstance(declared, dict):
        return _struct(declared, path + ".")
    if isinstance(declared, list) and len(declared) == 1:
        return pa.list_(_arrow_type(declared[0], path + "[]"))
    raise _Problem(f"field {path!r} has type {json.dumps(declared)}, which is neither a type "
                   "name, an object, nor a one-element array")


def _struct(fields: dict[str, Any], prefix: str) -> pa.StructType:
    if not fields:
        # Parquet cannot store a record without fields.
        raise _Problem(f"{'the schema' if not prefix else repr(prefix[:-1])} has no fields")
    for name in fields:
        # pyiceberg addresses nested fields by dotted names: a dot in a name is ambiguous.
        if not name or "." in name:
            raise _Problem(f"field name {prefix + name!r} is empty or holds a '.'")
    return pa.struct([pa.field(n, _arrow_type(t, prefix + n)) for n, t in fields.items()])


def _parse(text: Any) -> pa.StructType:
    if not isinstance(text, str):
        raise _Problem(f"it is a {type(text).__name__}, not text holding JSON")
    try:
        declared = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise _Problem(f"it is not JSON ({exc})") from None
    if not isinstance(declared, dict):
        raise _Problem("it is not a JSON object")
    return _struct(declared, "")


def schema_problem(value: Any) -> str | None:
    """The config rule of ``txlog.value.schema`` (topics.py): what is wrong, or None."""
    try:
        _parse(value)
    except _Problem as problem:
        return f"{SCHEMA_FORM}; {problem}"
    return None


def parse_value_schema(text: Any) -> pa.StructType:
    """The Arrow struct a schema declares (InvalidConfigError naming the key and the field
    when it is not one: a config written before these checks, or by hand)."""
    try:
        return _parse(text)
    except _Problem as problem:
        raise InvalidConfigError(f"{VALUE_SCHEMA} must be {SCHEMA_FORM}; {problem}") from None


def check_value_config(topic: str, config: dict[str, Any]) -> None:
    """A topic's whole config, as created or altered: a json format needs its schema, and
    a schema without the json format would be set for nothing."""
    json_format = config.get(VALUE_FORMAT) == "json"
    if json_format and VALUE_SCHEMA not in config:
        raise InvalidConfigError(f"topic {topic!r}: {VALUE_FORMAT}=json needs "
                                 f"{VALUE_SCHEMA} ({SCHEMA_FORM})")
    if not json_format and VALUE_SCHEMA in config:
        raise InvalidConfigError(f"topic {topic!r}: {VALUE_SCHEMA} is set but {VALUE_FORMAT} "
                                 "is not json: set both, or remove both")


def value_fields(config: dict[str, Any]) -> pa.StructType | None:
    """The fields a topic's values are parsed into; None: its values stay bytes only."""
    if config.get(VALUE_FORMAT) != "json":
        return None
    return parse_value_schema(config[VALUE_SCHEMA])


def _declared(arrow: pa.DataType) -> Any:
    if pa.types.is_struct(arrow):
        return {f.name: _declared(f.type) for f in arrow}
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow):
        return [_declared(arrow.value_type)]
    names = {t: n for n, t in TYPES.items()}
    return names.get(arrow, str(arrow))


def type_name(arrow: pa.DataType) -> str:
    """A type as a schema writes it (for messages about schema changes)."""
    declared = _declared(arrow)
    return declared if isinstance(declared, str) else json.dumps(declared)
