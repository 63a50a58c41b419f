"""Example pipelines, runnable from an installed package."""
