"""Stand-in for detectron2 (the legacy layer serves it only where the real one cannot be imported): the
names on ClipBERT's grid-feature path. See docs/legacy_forks_detectron2.md for each name."""
__version__ = "0.1.1"  # the detectron2 release of commit ffff8ac, which ClipBERT's Dockerfile installs
LEGACY_STAND_IN = True
