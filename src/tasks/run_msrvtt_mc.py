"""ClipBERT's script path ``src/tasks/run_msrvtt_mc.py``: ``python -m clipbert_legacy.tasks msrvtt_mc``.

The task class is ``clipbert_legacy.tasks.run_msrvtt_mc``'s (the project's code lives in
``src/clipbert_legacy/``; this file only keeps ClipBERT's command line working from a checkout). The
command line is checked before torch and the model are imported."""
import sys

from clipbert_legacy.tasks.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["msrvtt_mc", *sys.argv[1:]]))
