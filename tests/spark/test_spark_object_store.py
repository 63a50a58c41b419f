"""Spark reads and writes a txlog root on S3, the store reached through data source options.

Executors open the log in their own Python workers, which see neither the
driver's Python objects nor (here) any AWS environment: the endpoint and the
credentials can only reach them as ``txlog.storage.*`` options.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from txlog import InvalidConfigError, Log
from txlog.spark.options import ReadOptions, WriteOptions

from s3_server import SECRET_KEY

READ = {"path": "s3://b/log", "subscribe": "t"}


def test_storage_options_map_to_nested_fsspec_arguments() -> None:
    # Spark hands options over with lower-cased names, as PySpark's CaseInsensitiveDict does.
    parsed = ReadOptions.parse({**READ, "txlog.storage.endpoint_url": "http://127.0.0.1:9",
                                "txlog.storage.client_kwargs.region_name": "eu-west-1",
                                "txlog.storage.anon": "FALSE", "txlog.storage.secret": "s3cr3t!",
                                "txlog.storage_options": '{"config_kwargs": {"retries": '
                                                         '{"max_attempts": 3}}}'}, False)
    assert parsed.storage_options == {
        "endpoint_url": "http://127.0.0.1:9", "anon": False, "secret": "s3cr3t!",
        "client_kwargs": {"region_name": "eu-west-1"},
        "config_kwargs": {"retries": {"max_attempts": 3}}}
    assert "s3cr3t!" not in repr(parsed)  # the options' repr never carries them
    written = WriteOptions.parse({"path": "s3://b/log", "topic": "t",
                                  "txlog.storage.key": "AKIA"}, False)
    assert written.storage_options == {"key": "AKIA"} and "AKIA" not in repr(written)
    assert ReadOptions.parse(READ, False).storage_options == {}


@pytest.mark.parametrize("options,message", [
    ({"txlog.storge.key": "x"}, "'txlog.storge.key': unknown option; storage options are"),
    ({"txlog.storage.": "x"}, "is not a storage option name"),
    ({"txlog.storage.a..b": "x"}, "is not a storage option name"),
    ({"txlog.storage_options": "{not json, secret-value"}, "is not valid JSON"),
    ({"txlog.storage_options": "[1]"}, "expected a JSON object of storage options, got a JSON "
                                       "list"),
    ({"txlog.storage_options": '{"key": "secret-value"}', "txlog.storage.key": "secret-value"},
     "storage option 'key' is given twice"),
    ({"txlog.storage.client_kwargs": "secret-value",
      "txlog.storage.client_kwargs.region_name": "r"},
     "'client_kwargs' is already set to a value that is not an object"),
])
def test_bad_storage_options_are_named_and_their_values_never_shown(options, message) -> None:
    with pytest.raises(InvalidConfigError, match="option '") as info:
        ReadOptions.parse({**READ, **options}, False)
    assert message in str(info.value)
    assert "secret-value" not in str(info.value)


def test_spark_batch_write_and_read_on_s3(spark, s3_server, s3_root) -> None:
    pyspark = pytest.importorskip("pyspark")
    import pyspark.cloudpickle
    from pyspark.sql import functions as F

    pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    assert "AWS_ENDPOINT_URL" not in os.environ  # nothing but the options can lead to the store
    Log(s3_root, storage_options=s3_server.storage_options).create_topic("events", 2)
    # Credentials as options, the endpoint and region through the JSON form.
    store = {"txlog.storage.key": s3_server.storage_options["key"],
             "txlog.storage.secret": SECRET_KEY,
             "txlog.storage_options": json.dumps({
                 "endpoint_url": s3_server.endpoint,
                 "client_kwargs": s3_server.storage_options["client_kwargs"]})}
    df = spark.range(500, numPartitions=2).select(
        F.format_string("k%04d", "id").alias("key"), F.format_string("v%d", "id").alias("value"))
    writer = df.write.format("txlog").mode("append").option("path", s3_root).option(
        "topic", "events")
    for name, value in store.items():
        writer = writer.option(name, value)
    writer.save()

    reader = spark.read.format("txlog").option("path", s3_root).option("subscribe", "events")
    for name, value in store.items():
        reader = reader.option(name, value)
    back = reader.load().select(F.col("key").cast("string"), F.col("value").cast("string"),
                                "partition", "offset").toArrow()
    assert sorted(zip(back.column("key").to_pylist(), back.column("value").to_pylist(),
                      strict=True)) == [(f"k{i:04d}", f"v{i}") for i in range(500)]
    # The same records through the Python API: the data really is in the bucket.
    log = Log(s3_root, storage_options=s3_server.storage_options)
    assert sum(log.read("events", p).num_rows for p in range(2)) == 500
    assert any(key.startswith("log/topics/events/") and key.endswith(".batch")
               for key in s3_server.objects(s3_root.split("/")[2]))
