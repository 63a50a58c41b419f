"""Storage: the backends (local files, memory, fsspec object stores, S3), version chains, names.

The lowest layer.  It knows objects, conditional publishes and listings,
nothing about batches or transactions; every layer above reaches storage
only through it.
"""
