"""SQL on format("txlog"): CREATE TABLE ... USING txlog, SELECT, INSERT INTO, credentials.

What PySpark 4.3 does with a Python data source's catalog table, found by
running it: CREATE TABLE (without a column list) calls the source's schema()
with the table's OPTIONS, plus Spark's table properties ("provider", "owner",
"location") and each option again as "option.<name>"; SELECT and INSERT INTO
the table then hand the reader and the writer no options at all.  So the table
can be defined but not queried: txlog's error says so instead of just
"missing option 'path'".
"""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from pyspark.errors import AnalysisException  # noqa: E402

from txlog import Log  # noqa: E402
from txlog.spark.options import check_table_options, is_table_definition  # noqa: E402


@pytest.fixture
def root(tmp_path):
    log = Log(tmp_path / "log")
    log.create_topic("events", partitions=2)
    with log.producer() as producer:
        producer.send("events", b"one", key=b"k")
    return tmp_path / "log"


@pytest.fixture
def table(spark, request):
    names: list[str] = []

    def name(base: str) -> str:
        full = f"{base}_{request.node.name.split('[')[0][-20:]}"
        names.append(full)
        return full

    yield name
    for full in names:
        spark.sql(f"DROP TABLE IF EXISTS {full}")


def tables(spark) -> set[str]:
    return {row.tableName for row in spark.sql("SHOW TABLES").collect() if not row.isTemporary}


def test_create_table_defines_the_kafka_columns_but_select_and_insert_get_no_options(
        spark, root, table):
    t = table("events")
    spark.sql(f"CREATE TABLE {t} USING txlog "
              f"OPTIONS (path '{root}', subscribe 'events', topic 'events')")
    assert t in tables(spark)
    columns = [(c.name, c.dataType.simpleString()) for c in spark.table(t).schema]
    assert columns == [("key", "binary"), ("value", "binary"), ("topic", "string"),
                       ("partition", "int"), ("offset", "bigint"), ("timestamp", "timestamp"),
                       ("timestampType", "int")]
    # PySpark 4.3 passes the reader of a catalog table no options: Spark's
    # PYTHON_DATA_SOURCE_ERROR around txlog's explanation.
    with pytest.raises(AnalysisException) as read:
        spark.sql(f"SELECT * FROM {t}").collect()
    assert "PYTHON_DATA_SOURCE_ERROR" in str(read.value)
    assert "no options reached" in str(read.value) and "CREATE TABLE" in str(read.value)
    # The same for the writer; nothing is written.
    with pytest.raises(AnalysisException) as insert:
        spark.sql(f"INSERT INTO {t} (key, value) "
                  "SELECT CAST('k' AS BINARY), CAST('v' AS BINARY)").collect()
    assert "PYTHON_DATA_SOURCE_ERROR" in str(insert.value)
    assert "no options reached" in str(insert.value)
    log = Log(root)
    assert sum(log.end_offset("events", p) for p in range(2)) == 1
    # What works in its place: the same options on a DataFrame read and write.
    read_back = spark.read.format("txlog").option("path", str(root)) \
        .option("subscribe", "events").load()
    assert [r.value for r in read_back.collect()] == [b"one"]


@pytest.mark.parametrize("option, value", [
    ("`txlog.storage.secret`", "'s3cr3t-value'"),
    ("`txlog.storage.client_kwargs.aws_secret_access_key`", "'s3cr3t-value'"),
    ("`txlog.storage_options`", """'{"key": "AKIA-s3cr3t-value"}'"""),
])
def test_create_table_with_a_credential_option_is_refused_and_not_stored(
        spark, root, table, option, value):
    t = table("secret")
    with pytest.raises(AnalysisException) as refused:
        spark.sql(f"CREATE TABLE {t} USING txlog OPTIONS (path '{root}', "
                  f"subscribe 'events', {option} {value})")
    message = str(refused.value)
    assert option.strip("`") in message  # names the option ...
    assert "s3cr3t-value" not in message  # ... never its value
    assert "environment" in message and "AWS_ACCESS_KEY_ID" in message
    assert "credentials file" in message
    assert t not in tables(spark)  # nothing reached the catalog


def test_create_table_with_storage_options_that_are_not_credentials_is_accepted(
        spark, root, table):
    t = table("endpoint")
    spark.sql(f"CREATE TABLE {t} USING txlog OPTIONS (path '{root}', subscribe 'events', "
              "`txlog.storage.endpoint_url` 'http://127.0.0.1:9', `txlog.storage.anon` 'true')")
    assert t in tables(spark)


def test_dataframe_options_are_not_a_table_definition():
    # .option() calls keep taking credentials (tests/spark/test_spark_object_store.py
    # passes them so); only Spark's catalog properties mark a table definition.
    dataframe = {"path": "s3://b/log", "subscribe": "events", "txlog.storage.secret": "x"}
    assert not is_table_definition(dataframe)
    check_table_options(dataframe)
    table_definition = {**dataframe, "option.path": "s3://b/log", "provider": "txlog",
                        "owner": "someone", "option.txlog.storage.secret": "x"}
    assert is_table_definition(table_definition)
    with pytest.raises(Exception, match="txlog.storage.secret"):
        check_table_options(table_definition)


def test_a_read_with_no_options_at_all_says_what_is_missing(spark):
    with pytest.raises(Exception, match="no options reached"):
        spark.read.format("txlog").load().collect()
