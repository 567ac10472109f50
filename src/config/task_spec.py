"""What the config layer knows of a task: its name, its options and its post-parse rule.

A :class:`TaskSpec` is plain data, so option modules can declare one without registering anything
(no import side effects); ``src.config.tasks`` keeps the registry. The task object itself (a
``src.training.task.Task`` subclass with dataset builder, head and evaluator) lives in the task layer,
which the config layer must not import: a spec names it as a string, ``entry = "module:Class"``, which
``src.tasks.registry.get_task`` imports when first asked for (a lazy registration).
"""
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

from src.config.schema import Config, Option

PostParse = Callable[[Config, list], None]
"""A post-parse rule ``fn(cfg, notices)``: derives keys and checks combinations (raising
:class:`ConfigError`); it may append notice lines to ``notices``, which are logged as warnings."""


@dataclass
class TaskSpec:
    """A task's config: ``options`` are added to the ``parent``'s (``None``: the root, ``shared``);
    ``post_parse`` runs after the parent's rules; ``entry`` is the task class, ``"module:Class"``
    (``None`` for a spec that only others build on, such as ``shared``)."""
    name: str
    options: list[Option] = field(default_factory=list)
    post_parse: Optional[PostParse] = None
    parent: Optional[str] = "shared"
    entry: Optional[str] = None
