"""brain/stack: see docs/architecture.md."""
