"""ClipBERT's script path ``src/tasks/run_video_qa.py``: ``python -m clipbert_legacy.tasks video_qa``.

The task class is ``clipbert_legacy.tasks.run_video_qa``'s (the project's code lives in
``src/clipbert_legacy/``; this file only keeps ClipBERT's command line working from a checkout). The
command line is checked before torch and the model are imported."""
import sys

from clipbert_legacy.tasks.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["video_qa", *sys.argv[1:]]))
