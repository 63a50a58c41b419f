"""Transactions: the coordinator, producer-id blocks and consumer-group offsets.

What Kafka's transaction and group coordinators decide, kept in version
chains on storage (docs/protocol.md, sections 4 to 6 and 9).
"""
