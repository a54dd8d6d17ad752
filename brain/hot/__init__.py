"""brain/hot: see docs/architecture.md."""
