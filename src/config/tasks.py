"""The task registry: each task's options (added to its parent's) and its post-parse rule."""
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Optional

from src.config.schema import Config, ConfigError, Option

PostParse = Callable[[Config, list], None]
"""A post-parse rule ``fn(cfg, notices)``: derives keys and checks combinations (raising
:class:`ConfigError`); it may append notice lines to ``notices``, which are logged as warnings."""


@dataclass
class TaskSpec:
    name: str
    options: list
    post_parse: Optional[PostParse] = None
    parent: Optional[str] = None
    extra: list = field(default_factory=list)


_TASKS: dict[str, TaskSpec] = {}


def register_task(name: str, options: Iterable[Option] = (), post_parse: Optional[PostParse] = None,
                  parent: Optional[str] = "shared") -> None:
    """Declare a task's options (added to the parent's) and its post-parse rule ``fn(cfg, notices)``
    (run after the parent's rules)."""
    _TASKS[name] = TaskSpec(name, list(options), post_parse, parent)


def task_options(task: str) -> dict[str, Option]:
    """name -> Option for ``task``, parents first (a child's option replaces the parent's)."""
    if task not in _TASKS:
        raise ConfigError(f"unknown task {task!r}; known: {'|'.join(sorted(_TASKS))}")
    spec = _TASKS[task]
    opts = task_options(spec.parent) if spec.parent else {}
    for o in spec.options:
        opts[o.name] = o
    return dict(opts)


def post_parse_chain(task: str) -> list[PostParse]:
    """The post-parse rules of ``task``, its ancestors' first."""
    spec = _TASKS[task]
    chain = post_parse_chain(spec.parent) if spec.parent else []
    return chain + ([spec.post_parse] if spec.post_parse else [])


def with_defaults(cfg: Mapping, task: str = "shared") -> Config:
    """``cfg`` as a :class:`Config` in which every option of ``task`` is present: values ``cfg`` lacks
    (or holds as None where the schema default is not None) are the schema's defaults.

    For library callers (scripts, tests, benchmarks) that pass a plain dict to a builder: the schema
    stays the one place a default is written. A parsed config comes back with the same values.
    """
    out = Config()
    for name, o in task_options(task).items():
        out[name] = o.default
    for k, v in cfg.items():
        if v is not None or k not in out or out[k] is None:
            out[k] = v
    return out
