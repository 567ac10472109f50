"""ClipBERT's script path ``src/tasks/run_vqa.py``: runs ``clipbert_legacy.tasks.run_vqa`` (the project's
code lives in ``src/clipbert_legacy/``; this file only keeps ClipBERT's command line working from a
checkout)."""
import runpy

if __name__ == "__main__":
    runpy.run_module("clipbert_legacy.tasks.run_vqa", run_name="__main__", alter_sys=True)
