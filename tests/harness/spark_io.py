"""Reading and writing a txlog root through Spark with options as keyword arguments,
for the Spark test files (driver-side only: nothing here runs in a task)."""

from __future__ import annotations


def read(spark, root, **options):
    reader = spark.read.format("txlog").option("path", str(root))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def write(df, root, **options):
    writer = df.write.format("txlog").mode("append").option("path", str(root))
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()
