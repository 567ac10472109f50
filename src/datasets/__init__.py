"""clipbert-legacy: datasets package."""
