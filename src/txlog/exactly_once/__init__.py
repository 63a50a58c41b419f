"""Exactly-once jobs: one transaction shared by many producers, and a streaming sink.

Built on the clients and the coordinator for jobs (Spark's among them) whose
tasks write one transaction together (docs/protocol.md, section 5).
"""
