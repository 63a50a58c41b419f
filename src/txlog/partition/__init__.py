"""One partition: producer-state rules, its storage cache, appends, reads, compaction.

Everything a Kafka partition leader would do for one partition, done by any
process against storage (docs/protocol.md, sections 1 to 3 and 7).
"""
