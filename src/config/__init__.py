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

    from src.config import parse_args
    cfg = parse_args("retrieval")            # sys.argv[1:]
    cfg = parse_args("video_qa", ["--config", "configs/demo_qa_frameqa.json", "--fp16", "0"])
    cfg.train_datasets[0].txt, cfg.learning_rate, cfg.to_dict()

Adding task options: ``register_task(name, [Option(...), ...], post_parse=fn, parent="retrieval")``.

Modules: ``schema`` (Config, Option, ConfigError, value checks), ``tasks`` (the task registry),
``options`` (ClipBERT's options and post-parse rules; registers the tasks), ``options_vqa`` (task
``vqa``), ``parse`` (argparse,
JSON, ``$CLIPBERT_OVERRIDES``), ``path_roots`` (``--path_prefix``: ClipBERT's /txt, /img, /pretrain, /storage
mapped to the user's folders), ``stored`` (model keys taken from a trained run at inference),
``reference`` (the README table; ``python -m src.config [--update-readme README.md]``).
"""
from src.config.options import DECAYS, RETRIEVAL_OPTIONS, SHARED_OPTIONS, VIDEO_QA_OPTIONS
from src.config.options_pretrain import PRETRAIN_OPTIONS
from src.config.options_vqa import VQA_OPTIONS
from src.config.parse import (
    OVERRIDES_ENV,
    SharedConfigs,
    build_parser,
    env_overrides,
    parse_args,
    parse_args_or_exit,
    shared_configs,
)
from src.config.reference import README_BEGIN, README_END, config_reference_markdown, update_readme
from src.config.schema import Config, ConfigError, Option, coerce
from src.config.stored import MODEL_KEYS, apply_stored_model_config
from src.config.tasks import PostParse, TaskSpec, register_task, task_options, with_defaults

__all__ = [
    "DECAYS", "MODEL_KEYS", "OVERRIDES_ENV", "README_BEGIN", "README_END", "RETRIEVAL_OPTIONS",
    "SHARED_OPTIONS", "VIDEO_QA_OPTIONS", "VQA_OPTIONS", "PRETRAIN_OPTIONS",
    "Config", "ConfigError", "Option", "PostParse", "SharedConfigs",
    "TaskSpec", "apply_stored_model_config", "build_parser", "coerce", "config_reference_markdown",
    "env_overrides", "parse_args", "parse_args_or_exit", "register_task", "shared_configs", "task_options",
    "update_readme", "with_defaults",
]
