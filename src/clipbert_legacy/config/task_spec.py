"""What the config layer knows of a task: its name, its options and its post-parse rule.

A :class:`TaskSpec` is plain data, declared beside what it configures: a task class carries its spec
(``Task.spec``); ClipBERT's built-in tasks declare theirs in ``clipbert_legacy.config.options*`` because
layers below the tasks (the dataset builders, the model builder, inference) read their options.
``clipbert_legacy.config.tasks``
keeps the specs the parser knows; the task classes are the task layer's (``clipbert_legacy.tasks.registry``),
which the config layer does not import.
"""
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

from clipbert_legacy.config.schema import Config, Option

PostParse = Callable[[Config, list], None]
"""A post-parse rule ``fn(cfg, notices)``: derives keys and checks combinations (raising
:class:`ConfigError`); it may append notice lines to ``notices``, which are logged as warnings."""


@dataclass
class TaskSpec:
    """A task's config: ``options`` are added to the ``parent``'s (``None``: the root, ``shared``);
    ``post_parse`` runs after the parent's rules."""
    name: str
    options: list[Option] = field(default_factory=list)
    post_parse: Optional[PostParse] = None
    parent: Optional[str] = "shared"
