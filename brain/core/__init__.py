"""brain/core: see docs/architecture.md."""
