"""clipbert-legacy: preprocessing package."""
