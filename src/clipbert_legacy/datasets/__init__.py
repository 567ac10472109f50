"""Video data pipeline: LMDB store (``lmdb_store``), sparse-sampling decoder (``decoder``), task datasets
and collators (``dataset_*``, ``collate``), loaders (``loaders``).

The tasks build their data through ``clipbert_legacy.datasets.build`` (``build_retrieval_datasets``,
``build_qa_datasets``, ``build_mc_dataset``: ``(dataset, collator)``); import each name from its module.
"""
