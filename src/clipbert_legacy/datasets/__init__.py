"""Video data pipeline: LMDB store, sparse-sampling decoder, task datasets/collators, loaders.

Entry points for the engine: build_retrieval_datasets(cfg, split), build_qa_datasets(cfg, split),
build_mc_dataset(cfg, split="inference") -> (dataset, collator); PrefetchLoader. Submodules are imported
lazily so `import clipbert_legacy.datasets.decoder` stays light.
"""

_EXPORTS = {
    "build_retrieval_datasets": "clipbert_legacy.datasets.build",
    "build_qa_datasets": "clipbert_legacy.datasets.build",
    "build_mc_dataset": "clipbert_legacy.datasets.build", "load_tokenizer": "clipbert_legacy.datasets.build",
    "PrefetchLoader": "clipbert_legacy.datasets.loaders", "ImageNorm": "clipbert_legacy.datasets.image_ops",
    "BadVideosError": "clipbert_legacy.datasets.dataset_base",
    "LMDBStore": "clipbert_legacy.datasets.lmdb_store",
}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'clipbert_legacy.datasets' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
