"""The shared training engine (see engine.py), checkpoints, resumable data order, inference helpers."""
