"""Delta release tables (writer, reads, snapshots). Imports pyspark."""
