"""The PySpark data source for txlog (``format("txlog")``).

Nothing here imports pyspark at import time: ``txlog.spark.java`` and
``txlog.spark.options`` are usable, and testable, without Spark installed.
"""
