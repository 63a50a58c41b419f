"""Storage: the backends (local files, fsspec object stores), version chains, names.

The lowest layer.  It knows objects, conditional publishes and listings,
nothing about batches or transactions; every layer above reaches storage
only through it.
"""
