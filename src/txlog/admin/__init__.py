"""Maintenance of a log: garbage collection, dump and verify (docs/cli.md)."""
