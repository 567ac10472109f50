"""clipbert-legacy: evaluation package."""
