"""ClipBERT's configuration (JSON file + CLI overrides) with a schema that checks every value.

One schema (:class:`Option`: type, default, choices, range, help) builds the argparse parser, checks
JSON values and renders the README's option table. Precedence is CLI > JSON > default, where "CLI"
means what argparse parsed (so an abbreviated flag like ``--learning`` still beats the JSON file).

Differences from ClipBERT's ``src/configs/config.py``, each of which fixes a bug there (ClipBERT
took JSON values unchecked, so a typo or a wrong type surfaced late in training or not at all):

* JSON values are type-, choice- and range-checked exactly like CLI values; unknown keys are an error
  with a "did you mean" hint. Options ClipBERT accepted but never read are accepted with one notice.
* ``--betas 0.9 0.98`` parses to floats; ``step_decay_epochs`` to ints.
* the ``config`` path does not end up in the resulting config (and thus not in ``log/args.json``).
* video QA: ``num_labels`` is exactly ``len(ans2label)`` for open-ended tasks (no 1540/1500 floor,
  which allowed KeyErrors at evaluation); ``ans2label_path`` is only required where it is read.
* a bad value raises :class:`ConfigError` with one line naming key, value and what is allowed,
  before any work starts; :func:`parse_args_or_exit` prints that line and exits with status 2.

Usage::

    from clipbert_legacy.config import parse_args
    cfg = parse_args("retrieval")            # sys.argv[1:]
    cfg = parse_args("video_qa", ["--config", "configs/demo_qa_frameqa.json", "--fp16", "0"])
    cfg.train_datasets[0].txt, cfg.learning_rate, cfg.to_dict()

Adding a task: declare a :class:`TaskSpec` (name, options, post-parse rule, parent) and register it
with :func:`register_task` (the task layer's ``clipbert_legacy.tasks.registry.register`` does it for a whole
task); see docs/adding_a_task.md. Flag each option ``model=True`` (inference takes it from the trained run)
or ``runtime=True`` (it may change between the runs of one directory): :func:`model_keys` and
:func:`runtime_keys` are generated from the flags of every registered task.

Modules: ``schema`` (Config, Option, ConfigError, value checks), ``task_spec`` (TaskSpec), ``tasks`` (the
registry, the built-in tasks, the generated key sets), ``options`` (ClipBERT's shared, retrieval and video
QA options and post-parse rules), ``options_vqa`` / ``options_pretrain`` (tasks ``vqa``, ``pretrain``),
``parse`` (argparse, JSON, ``$CLIPBERT_OVERRIDES``), ``path_roots`` (``--path_prefix``: ClipBERT's /txt,
/img, /pretrain, /storage mapped to the user's folders), ``stored`` (model keys taken from a trained run
at inference), ``reference`` (the option table of docs/config_reference.md;
``python -m clipbert_legacy.config [--update-docs]``).
"""
from clipbert_legacy.config.options import DECAYS, RETRIEVAL_OPTIONS, SHARED_OPTIONS, VIDEO_QA_OPTIONS
from clipbert_legacy.config.options_pretrain import PRETRAIN_OPTIONS
from clipbert_legacy.config.options_vqa import VQA_OPTIONS
from clipbert_legacy.config.parse import (
    OVERRIDES_ENV,
    build_parser,
    env_overrides,
    parse_args,
    parse_args_or_exit,
)
from clipbert_legacy.config.reference import (
    REFERENCE_BEGIN,
    REFERENCE_END,
    config_reference_markdown,
    update_reference,
)
from clipbert_legacy.config.schema import Config, ConfigError, Option, coerce
from clipbert_legacy.config.stored import apply_stored_model_config
from clipbert_legacy.config.task_spec import PostParse, TaskSpec
from clipbert_legacy.config.tasks import (
    documented_tasks,
    model_keys,
    register_task,
    runtime_keys,
    task_names,
    task_options,
    with_defaults,
)

__all__ = [
    "DECAYS", "OVERRIDES_ENV", "REFERENCE_BEGIN", "REFERENCE_END", "RETRIEVAL_OPTIONS",
    "SHARED_OPTIONS", "VIDEO_QA_OPTIONS", "VQA_OPTIONS", "PRETRAIN_OPTIONS",
    "Config", "ConfigError", "Option", "PostParse", "TaskSpec", "apply_stored_model_config", "build_parser",
    "coerce", "config_reference_markdown", "documented_tasks", "env_overrides", "model_keys", "parse_args",
    "parse_args_or_exit", "register_task", "runtime_keys", "task_names", "task_options", "update_reference",
    "with_defaults",
]
