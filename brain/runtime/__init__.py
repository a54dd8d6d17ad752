"""brain/runtime: see docs/architecture.md."""
