"""Delta release tables (writer, reads, snapshots; ``writer`` imports pyspark), the readers of
Delta commits (``delta_commits``) and the identity-keyed cache (``identity_cache``)."""
