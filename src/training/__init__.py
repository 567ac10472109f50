"""clipbert-legacy: training package."""
