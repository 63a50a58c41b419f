"""``format("txlog")``: the DataSource Spark instantiates for reads and writes."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceWriter
from pyspark.sql.types import StructType

from .options import ReadOptions, WriteOptions
from .reader import TxlogBatchReader, spark_schema
from .writer import TxlogBatchWriter


class TxlogDataSource(DataSource):
    """Reads and writes txlog topics with the options and columns of Spark's Kafka source."""

    @classmethod
    def name(cls) -> str:
        return "txlog"

    def schema(self) -> StructType:
        # Called before reader(); only includeHeaders shapes the schema, and a bad
        # value is reported by ReadOptions.parse with every other read option.
        return spark_schema(str(self.options.get("includeHeaders", "false")).lower() == "true")

    def reader(self, schema: StructType) -> DataSourceReader:
        return TxlogBatchReader.create(ReadOptions.parse(self.options, streaming=False), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return TxlogBatchWriter.create(WriteOptions.parse(self.options, streaming=False), schema,
                                       overwrite)
