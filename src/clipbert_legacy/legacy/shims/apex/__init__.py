"""Stand-in for NVIDIA apex (not on PyPI; its ``amp`` was removed upstream): the legacy layer's ``apex``.

Served only where ``import apex`` finds no installed apex. Submodules: ``amp`` (the project's
``clipbert_legacy.compat.amp``), ``normalization``, ``optimizers``, ``parallel``, ``fp16_utils``.
"""
