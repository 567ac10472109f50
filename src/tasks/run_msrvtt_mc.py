"""ClipBERT's script path ``src/tasks/run_msrvtt_mc.py``: runs ``clipbert_legacy.tasks.run_msrvtt_mc`` (the
project's code lives in ``src/clipbert_legacy/``; this file only keeps ClipBERT's command line working from
a checkout)."""
import runpy

if __name__ == "__main__":
    runpy.run_module("clipbert_legacy.tasks.run_msrvtt_mc", run_name="__main__", alter_sys=True)
