"""clipbert-legacy: ClipBERT-style video-and-language training on current PyTorch.

The import name is ``clipbert_legacy`` (installed from ``src/clipbert_legacy/``): never a top-level ``src``,
which is what every ClipBERT-lineage fork is, so a user's fork and this project install side by side.
"""
