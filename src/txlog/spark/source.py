"""STAND-IN: the lead is writing the real data source; replace this file with it.

Only here so that ``pyspark_txlog`` imports and ``format("txlog")`` resolves
while the packaging and session plumbing are tested.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource


class TxlogDataSource(DataSource):
    """Placeholder with a name and nothing else (no schema, reader or writer)."""

    @classmethod
    def name(cls) -> str:
        return "txlog"
