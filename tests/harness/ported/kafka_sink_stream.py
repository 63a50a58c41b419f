"""A stream from one Kafka topic into another through Spark's Kafka sink, as a Spark user
writes it: the sink names its ``checkpointLocation`` and nothing else of its own.

tests/spark/test_ported_spark_programs.py runs it with ``format("kafka")`` replaced by
``format("txlog")`` and nothing else changed; the output topic does not exist beforehand.

    kafka_sink_stream.py BOOTSTRAP_SERVERS SOURCE_TOPIC SINK_TOPIC CHECKPOINT
"""

import sys

from pyspark.sql import SparkSession

bootstrap_servers, source, sink, checkpoint = sys.argv[1:5]

spark = SparkSession.builder.appName("KafkaToKafka").getOrCreate()
shouted = (spark.readStream.format("kafka")
           .option("kafka.bootstrap.servers", bootstrap_servers)
           .option("subscribe", source)
           .option("startingOffsets", "earliest")
           .load()
           .selectExpr("key", "upper(CAST(value AS STRING)) AS value"))
query = (shouted.writeStream.format("kafka")
         .option("kafka.bootstrap.servers", bootstrap_servers)
         .option("topic", sink)
         .option("checkpointLocation", checkpoint)
         .trigger(availableNow=True)
         .start())
query.awaitTermination()

written = (spark.read.format("kafka")
           .option("kafka.bootstrap.servers", bootstrap_servers)
           .option("subscribe", sink)
           .load()
           .selectExpr("CAST(value AS STRING) AS value"))
for row in written.groupBy("value").count().orderBy("value").collect():
    print(f"written {row['value']} {row['count']}", flush=True)
spark.stop()
