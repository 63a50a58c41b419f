"""A structured streaming word count as a Spark user writes it for Kafka.

Written against Spark's own Kafka source (``format("kafka")``, ``kafka.bootstrap.servers``,
``subscribe``); tests/spark/test_ported_spark_programs.py runs it through spark-submit with
``format("kafka")`` replaced by ``format("txlog")`` and nothing else changed, the broker
address being a txlog root.

    kafka_wordcount.py BOOTSTRAP_SERVERS TOPICS CHECKPOINT
"""

import sys

from pyspark.sql import SparkSession
from pyspark.sql.functions import explode, split

bootstrap_servers, topics, checkpoint = sys.argv[1:4]

spark = SparkSession.builder.appName("StructuredKafkaWordCount").getOrCreate()
lines = (spark.readStream.format("kafka")
         .option("kafka.bootstrap.servers", bootstrap_servers)
         .option("subscribe", topics)
         .option("startingOffsets", "earliest")
         .load()
         .selectExpr("CAST(value AS STRING)"))
words = lines.select(explode(split(lines.value, " ")).alias("word"))
counts = words.groupBy("word").count()


def show(batch, batch_id):
    for row in batch.orderBy("word").collect():
        print(f"count {row['word']} {row['count']}", flush=True)


query = (counts.writeStream.outputMode("complete").foreachBatch(show)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
query.awaitTermination()
spark.stop()
