"""Video data pipeline: LMDB store, sparse-sampling decoder, task datasets/collators, loaders.

Entry points for the engine: build_retrieval_datasets(cfg, split), build_qa_datasets(cfg, split),
build_mc_dataset(cfg, split="inference") -> (dataset, collator); PrefetchLoader. Submodules are imported
lazily so `import src.datasets.decoder` stays light.
"""

_EXPORTS = {
    "build_retrieval_datasets": "src.datasets.build", "build_qa_datasets": "src.datasets.build",
    "build_mc_dataset": "src.datasets.build", "load_tokenizer": "src.datasets.build",
    "PrefetchLoader": "src.datasets.loaders", "ImageNorm": "src.datasets.image_ops",
    "BadVideosError": "src.datasets.dataset_base", "LMDBStore": "src.datasets.lmdb_store",
}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'src.datasets' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
