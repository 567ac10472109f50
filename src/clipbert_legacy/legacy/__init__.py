"""The legacy layer: a ClipBERT-lineage fork (ClipBERT, ALPRO, HERO, UNITER, ...) runs unmodified.

Opt-in only. Importing this package patches nothing; the layer is installed by the launcher::

    python -m clipbert_legacy.legacy [--cpu] [--uint8-masks] path/to/fork/src/tasks/run_x.py ARGS...

(also under ``horovodrun -np N python -m clipbert_legacy.legacy ...`` and
``torchrun --nproc_per_node N -m clipbert_legacy.legacy ...``), or by one documented import at the top of
a script: ``import clipbert_legacy.legacy.install``.

What it installs (``layer.install``):

* ``finder``: two import finders. One is *appended* to ``sys.meta_path``, so it is asked only after
  every real finder failed: a real apex with ``amp``, a real detectron2, a real Horovod always win. It
  serves the stand-in modules in ``shims/`` (``apex``, ``detectron2``, ``torchvision``, ``torch._six``,
  ``transformers.configuration_bert`` ...) under the requested name. The other, in front, handles the few
  names where the real package exists but must not be used (``horovod.torch`` under torchrun, a
  torchvision that cannot load next to the installed torch) and adds the names removed from real
  modules after they load (``patches``).
* ``patches``: transformers 3.x/4.x names and lifecycle, lmdb's second open of one directory, and
  the opt-ins: ``--cpu`` (``cpu``) and uint8 masks (``torch_compat``).

``docs/legacy_forks.md`` has the whole surface in one table.
"""
