"""The PySpark data source for txlog (``format("txlog")``).

Spark's calls are mapped onto the core here; no protocol rule lives in this
package. Nothing here imports pyspark at import time, so ``txlog.spark.java``
and ``txlog.spark.options`` are usable, and testable, without Spark installed.
"""

from .tables import read_table, table_starting_offsets

__all__ = ["read_table", "table_starting_offsets"]
