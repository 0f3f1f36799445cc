"""core: see docs/architecture.md."""
