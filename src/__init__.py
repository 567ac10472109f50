"""clipbert-legacy: src package."""
