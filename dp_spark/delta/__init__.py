"""delta: see docs/architecture.md."""
