"""clipbert-legacy: compat package."""
