"""The root: one storage root's services (its topics and partitions, the coordinator, producer
ids), handed by composition to the clients and jobs above it; ``txlog.api.log.Log`` wraps it."""
