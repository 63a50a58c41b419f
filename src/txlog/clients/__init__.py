"""The clients: producer (with its partitioner), consumer, and Kafka's record columns."""
