"""ClipBERT's script path ``src/preprocessing/file2lmdb.py``: runs ``clipbert_legacy.preprocessing.file2lmdb``
(the project's code lives in
``src/clipbert_legacy/``; this file only keeps ClipBERT's command line working from a checkout)."""
import runpy

if __name__ == "__main__":
    runpy.run_module("clipbert_legacy.preprocessing.file2lmdb", run_name="__main__", alter_sys=True)
