"""clipbert-legacy: utils package."""
