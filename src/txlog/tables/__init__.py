"""Topics as Iceberg tables (docs/tables.md): a table per topic under the root, kept by a sync."""
