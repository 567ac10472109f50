"""clipbert-legacy: optimization package."""
