"""Makes ``format("txlog")`` work without ``spark.dataSource.register``.

PySpark imports every top-level module whose name starts with ``pyspark_``
and registers its ``DefaultSource`` under the source's ``name()``.
"""

from txlog.spark.source import TxlogDataSource as DefaultSource

__all__ = ["DefaultSource"]
