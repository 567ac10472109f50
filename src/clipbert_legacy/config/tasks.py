"""The specs the parser knows: each task's options (added to its parent's) and post-parse rule.

This is the config layer's half of the task registry. It starts with ClipBERT's specs
(:data:`CONFIG_SPECS`: their options are read below the task layer, by the dataset and model builders
and by inference, so they are declared in ``clipbert_legacy.config.options*``); the task layer's registry
(``clipbert_legacy.tasks.registry``: the one list of built-in task classes, and ``register`` for a plugin)
adds the spec of every task class it loads with :func:`register_task`. Everything that needs "all options"
iterates the specs known here: the parser, the config reference (:func:`documented_tasks`), the
generated key sets (:func:`model_keys`, :func:`runtime_keys`) and the schema tests.
"""
from collections.abc import Iterable, Mapping
from typing import Optional, Union

from clipbert_legacy.config.options import MSRVTT_MC, RETRIEVAL, SHARED, VIDEO_QA
from clipbert_legacy.config.options_pretrain import PRETRAIN
from clipbert_legacy.config.options_vqa import VQA
from clipbert_legacy.config.schema import Config, ConfigError, Option
from clipbert_legacy.config.task_spec import PostParse, TaskSpec

CONFIG_SPECS = (SHARED, RETRIEVAL, MSRVTT_MC, VIDEO_QA, VQA, PRETRAIN)

_SPECS: dict[str, TaskSpec] = {spec.name: spec for spec in CONFIG_SPECS}


def register_task(spec: Union[TaskSpec, str], options: Iterable[Option] = (),
                  post_parse: Optional[PostParse] = None, parent: Optional[str] = "shared") -> TaskSpec:
    """Add a task's config: a :class:`TaskSpec`, or its fields (``name, options, post_parse, parent``).

    Its options are added to the parent's; ``post_parse(cfg, notices)`` runs after the parent's rules.
    Registering a name again replaces the earlier spec (an entry point run as a script carries the
    spec again)."""
    if isinstance(spec, str):
        spec = TaskSpec(spec, list(options), post_parse, parent)
    if spec.parent is not None and spec.parent not in _SPECS:
        raise ConfigError(f"task {spec.name!r}: parent {spec.parent!r} is not registered; known: "
                          f"{'|'.join(sorted(_SPECS))}")
    _SPECS[spec.name] = spec
    return spec


def task_spec(task: str) -> TaskSpec:
    """The registered spec of ``task``."""
    if task not in _SPECS:
        raise ConfigError(f"unknown task {task!r}; known: {'|'.join(sorted(_SPECS))}")
    return _SPECS[task]


def task_names() -> list[str]:
    """Every known spec's name, in registration order (ClipBERT's first)."""
    return list(_SPECS)


def documented_tasks() -> list[str]:
    """The tasks the config reference has a column entry for: those adding options of their own (the
    root ``shared`` and option-less children such as ``msrvtt_mc`` show through them)."""
    return [n for n, s in _SPECS.items() if s.parent is not None and s.options]


def task_options(task: str) -> dict[str, Option]:
    """name -> Option for ``task``, parents first (a child's option replaces the parent's)."""
    spec = task_spec(task)
    opts = task_options(spec.parent) if spec.parent else {}
    for o in spec.options:
        opts[o.name] = o
    return dict(opts)


def post_parse_chain(task: str) -> list[PostParse]:
    """The post-parse rules of ``task``, its ancestors' first."""
    spec = _SPECS[task]
    chain = post_parse_chain(spec.parent) if spec.parent else []
    return chain + ([spec.post_parse] if spec.post_parse else [])


def all_options() -> list[Option]:
    """Every option of every registered task (a name defined by several tasks appears once per task)."""
    return [o for spec in _SPECS.values() for o in spec.options]


DERIVED_MODEL_KEYS = ("task_type",)
"""Keys the post-parse rules set that are no options but define the model (the head's kind)."""


def model_keys() -> tuple[str, ...]:
    """The keys inference takes from a trained run's ``log/args.json``: every option flagged ``model``,
    in registration order, and :data:`DERIVED_MODEL_KEYS`."""
    names = dict.fromkeys(o.name for o in all_options() if o.model)
    return tuple(names) + DERIVED_MODEL_KEYS


def runtime_keys() -> frozenset[str]:
    """The settings that may differ between the runs of one output directory: options flagged ``runtime``."""
    return frozenset(o.name for o in all_options() if o.runtime)


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
