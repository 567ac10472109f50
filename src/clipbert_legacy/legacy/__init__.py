"""The legacy layer: runs ClipBERT-lineage forks unmodified (docs/legacy_forks.md)."""
