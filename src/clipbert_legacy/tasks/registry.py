"""The task registry: name -> task class, the object that is the whole task (the product's entry asks it).

A task is its :class:`~clipbert_legacy.training.task.Task` subclass (usually through ``ClipBertTask``),
declaring

* ``spec``: its :class:`~clipbert_legacy.config.TaskSpec` (name, options each flagged
  ``model``/``runtime`` where it applies, the post-parse rule), beside the class, and ``name = spec.name``;
* ``build_train_data`` (dataset builder), ``build_head`` (the head on the ClipBERT model; or its own
  ``build_model``), ``evaluate`` (validation metrics) and ``run_inference``.

The built-in tasks are :data:`BUILTIN_TASKS`, one line each: adding a built-in task is its file plus one
line there. A class is imported when its name is first asked for (an entry imports only its own), and
looking it up registers its spec with the
parser (``clipbert_legacy.config.register_task``), so its options, ``model_keys()``/``runtime_keys()`` and the
config reference follow. :func:`register` adds a task at run time (a plugin, a test): one call.
The product's entries ask this registry: ``python -m clipbert_legacy.tasks NAME ...``
(``src/clipbert_legacy/tasks/__main__.py``; ClipBERT's script paths ``python src/tasks/run_x.py`` are it)
and :func:`clipbert_legacy.tasks.entry.main`, which ``python -m clipbert_legacy.tasks.run_x`` calls with its
class.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from clipbert_legacy.config import ConfigError, register_task, task_names

if TYPE_CHECKING:  # the registry itself imports no torch: the entry checks a command line before that
    from clipbert_legacy.training.task import Task

BUILTIN_TASKS = {
    "retrieval": "clipbert_legacy.tasks.run_video_retrieval:RetrievalTask",
    "msrvtt_mc": "clipbert_legacy.tasks.run_msrvtt_mc:MSRVTTMCTask",
    "video_qa": "clipbert_legacy.tasks.run_video_qa:VideoQATask",
    "vqa": "clipbert_legacy.tasks.run_vqa:VQATask",
    "pretrain": "clipbert_legacy.tasks.run_pretrain:PretrainTask",
}
"""name -> ``"module:Class"`` of every built-in task."""

_CLASSES: dict[str, type[Task]] = {}  # the classes looked up or registered in this process


def register(task_cls: type[Task]) -> type[Task]:
    """Register a task class and its spec (usable as a class decorator); returns the class. Registering a
    name again replaces the earlier class (an entry point run as a script holds its own copy)."""
    name, spec = getattr(task_cls, "name", ""), getattr(task_cls, "spec", None)
    if not name or spec is None or spec.name != name:
        raise ConfigError(f"task class {task_cls.__qualname__}: set spec = TaskSpec(name, options, "
                          f"post_parse) and name = spec.name (got name={name!r}, "
                          f"spec={getattr(spec, 'name', spec)!r})")
    register_task(spec)
    _CLASSES[name] = task_cls
    return task_cls


def get_task(name: str) -> type[Task]:
    """The task class registered as ``name``; a built-in one is imported and registered when first asked."""
    if name not in _CLASSES:
        if name not in BUILTIN_TASKS:
            what = "has options but no task class" if name in task_names() else "is not a task"
            raise ConfigError(f"task {name!r} {what}; known: {'|'.join(runnable_tasks())}")
        module, cls = BUILTIN_TASKS[name].split(":")
        register(getattr(importlib.import_module(module), cls))
    return _CLASSES[name]


def runnable_tasks() -> list[str]:
    """The names of every task with a task class: the built-in ones, then those registered at run time."""
    return list(dict.fromkeys([*BUILTIN_TASKS, *_CLASSES]))


def load_builtin_tasks() -> list[type[Task]]:
    """Every built-in task class (imported and registered): what needs them all (the config reference)."""
    return [get_task(name) for name in BUILTIN_TASKS]
