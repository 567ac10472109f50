"""The task registry of the task layer: name -> task class, the object that is the whole task.

A task is its :class:`~src.training.task.Task` subclass (usually through ``ClipBertTask``), declaring

* ``name``: the registered name (``main`` parses its config with it),
* ``config``: its :class:`~src.config.TaskSpec` (options, each flagged ``model``/``runtime`` where it
  applies, the post-parse rule, and ``entry``: this class as ``"module:Class"``),
* ``build_train_data`` (dataset builder), ``build_head`` (the head on the ClipBERT model; or its own
  ``build_model``), ``evaluate`` (validation metrics) and ``run_inference``.

The config layer keeps the specs (``src.config.tasks``: parser, config reference, generated
``MODEL_KEYS``/``RUNTIME_KEYS``, schema tests iterate it) and must not import this layer, so a
built-in task is found through its spec's ``entry`` and imported when first asked for; an entry point
run as a script (``python src/tasks/run_x.py``) therefore never imports this module. :func:`register`
adds a task at run time (a plugin, a test): one call registers the class and its spec.
"""
import importlib

from src.config import ConfigError, register_task
from src.config.tasks import task_names, task_spec
from src.training.task import Task

_TASKS: dict[str, type[Task]] = {}


def register(task_cls: type[Task]) -> type[Task]:
    """Register a task class and its config spec (usable as a class decorator); returns the class."""
    name, spec = getattr(task_cls, "name", ""), getattr(task_cls, "config", None)
    if not name or spec is None or spec.name != name:
        raise ConfigError(f"task class {task_cls.__qualname__}: set name = '...' and config = TaskSpec(name, "
                          f"options, post_parse) with the same name (got name={name!r}, "
                          f"config={getattr(spec, 'name', spec)!r})")
    register_task(spec)
    _TASKS[name] = task_cls
    return task_cls


def get_task(name: str) -> type[Task]:
    """The task class registered as ``name`` (a built-in one is imported from its spec's ``entry``)."""
    if name not in _TASKS:
        entry = task_spec(name).entry
        if not entry:
            raise ConfigError(f"task {name!r} has options but no task class (its TaskSpec has no entry); "
                              f"known: {'|'.join(runnable_tasks())}")
        module, cls = entry.split(":")
        _TASKS[name] = getattr(importlib.import_module(module), cls)
    return _TASKS[name]


def runnable_tasks() -> list[str]:
    """The names of every task with a task class (``shared`` and other bases are left out)."""
    return [n for n in task_names() if n in _TASKS or task_spec(n).entry]
