"""``format("txlog")``: the DataSource Spark instantiates for reads and writes.

Each method imports what it builds.  Spark unpickles this class in every
Python process that plans or commits for a query (a stream's source runs in
a process of its own, started for each query), and a reader's process has
no use for the writer's modules: producer, transactions of jobs, checkpoint
files (docs/spark.md, the source's imports).
"""

from __future__ import annotations

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    DataSourceStreamWriter, DataSourceWriter)
from pyspark.sql.types import StructType

from .options import ReadOptions, WriteOptions, check_table_options
from .reader import TxlogBatchReader, arrow_schema, spark_schema


class TxlogDataSource(DataSource):
    """Reads and writes txlog topics with the options and columns of Spark's Kafka source."""

    @classmethod
    def name(cls) -> str:
        return "txlog"

    def schema(self) -> StructType:
        # Called before reader(); only includeHeaders shapes the schema, and a bad
        # value is reported by ReadOptions.parse with every other read option.
        # CREATE TABLE ... USING txlog (without a column list) calls only this,
        # before the catalog stores the table: the one place to refuse credentials.
        check_table_options(self.options)
        return spark_schema(str(self.options.get("includeHeaders", "false")).lower() == "true")

    def reader(self, schema: StructType) -> DataSourceReader:
        return TxlogBatchReader.create(ReadOptions.parse(self.options, streaming=False), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .writer import TxlogBatchWriter

        return TxlogBatchWriter.create(WriteOptions.parse(self.options, streaming=False), schema,
                                       overwrite)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .stream_reader import TxlogStreamReader

        options = ReadOptions.parse(self.options, streaming=True)
        return TxlogStreamReader(options, arrow_schema(options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .writer import TxlogStreamWriter

        return TxlogStreamWriter.create(WriteOptions.parse(self.options, streaming=True), schema,
                                        overwrite)
