"""clipbert-legacy: modeling package."""
