"""clipbert-legacy: tasks package."""
