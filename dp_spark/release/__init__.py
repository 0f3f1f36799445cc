"""Delta release tables (``writer``: schema, the idempotent write, reads, snapshots; imports
pyspark), through Delta's public API only."""
