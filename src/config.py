"""ClipBERT's configuration (JSON file + CLI overrides) with a schema that checks every value.

One schema (:class:`Option`: type, default, choices, range, help) builds the argparse parser, checks
JSON values and renders the README's option table. Precedence is CLI > JSON > default, where "CLI"
means what argparse parsed (so an abbreviated flag like ``--learning`` still beats the JSON file).

Differences from ClipBERT's ``src/configs/config.py`` (all were bugs, see the reference spec §1/§8):

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
"""
import argparse
import difflib
import json
import logging
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A bad configuration value; the message is a single line naming key, value and the fix."""


class Config(dict):
    """Attribute-access dict; nested dicts (also inside lists) are Configs too (EasyDict-like)."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def __setitem__(self, key, value):
        super().__setitem__(key, _wrap(value))

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"config has no option {name!r}") from None

    def __setattr__(self, name, value):
        self[name] = value

    def __delattr__(self, name):
        try:
            del self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_dict(self):
        return _unwrap(self)


def _wrap(v):
    if isinstance(v, Config):
        return v
    if isinstance(v, dict):
        return Config(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_wrap(x) for x in v)
    return v


def _unwrap(v):
    if isinstance(v, dict):
        return {k: _unwrap(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_unwrap(x) for x in v]
    return v


# ----------------------------------------------------------------------------------------------
# schema
@dataclass
class Option:
    """One config key. ``type`` is int|float|str|bool (bool: 0/1/true/false, stored as bool).

    ``nargs``: None for a scalar, an int for a fixed-length list, "+" for a non-empty list.
    ``unused``: accepted for ClipBERT compatibility but has no effect (a notice is logged when set).
    ``derived``: computed after parsing; a given value is replaced (with a notice if it differs).
    """
    name: str
    type: type
    default: Any = None
    help: str = ""
    choices: Optional[tuple] = None
    nargs: Any = None
    min: Optional[float] = None
    max: Optional[float] = None
    min_exclusive: bool = False
    nullable: Optional[bool] = None  # default: nullable iff default is None
    unused: Optional[str] = None  # the notice text
    derived: bool = False
    json_only: bool = False
    group: str = "shared"

    def __post_init__(self):
        if self.nullable is None:
            self.nullable = self.default is None

    def type_name(self):
        t = {int: "int", float: "float", str: "str", bool: "0|1"}.get(self.type, "json")
        if self.nargs is None:
            return t
        return f"{self.nargs} x {t}" if isinstance(self.nargs, int) else f"list of {t}"


O = Option
_BOOL_TRUE, _BOOL_FALSE = ("1", "true", "True", "yes"), ("0", "false", "False", "no")
DECAYS = ("linear", "invsqrt", "constant", "multi_step", "cosine")
_UNUSED = "accepted for ClipBERT compatibility but has no effect"
_PRETRAIN = "a ClipBERT pretraining option; fine-tuning tasks ignore it"

SHARED_OPTIONS = [
    O("debug", bool, False, "stop training after 3 steps (evaluators may shorten validation)"),
    O("data_ratio", float, 1.0, "keep a random fraction of the training annotations", min=0,
      max=1, min_exclusive=True),
    O("model_config", str, None, "path to the model json config (BERT config)"),
    O("tokenizer_dir", str, None, "directory of the BertTokenizerFast files"),
    O("output_dir", str, None, "where log/, ckpt/ and results go"),
    O("max_txt_len", int, 20, "max text tokens including [CLS]/[SEP]", min=3),
    O("max_img_size", int, 448, "longer image side after resize; zero-padded to a square", min=1),
    O("img_pixel_mean", float, None, "per-channel pixel mean (in img_input_format order)", nargs=3),
    O("img_pixel_std", float, None, "per-channel pixel std", nargs=3),
    O("img_input_format", str, "BGR", "channel order fed to the CNN", choices=("BGR", "RGB")),
    O("max_n_example_per_group", int, 2, "texts sampled per video in a training group", min=1),
    O("fps", int, 1, "frame rate frames are sampled at", min=1),
    O("num_frm", int, 3, "frames per clip", min=1),
    O("frm_sampling_strategy", str, "rand", "which frames of a clip are taken",
      choices=("rand", "uniform", "start", "middle", "end")),
    O("train_n_clips", int, 3, "clips sampled per video in training", min=1),
    O("score_agg_func", str, "mean", "how clip scores are aggregated", choices=("mean", "max", "lse")),
    O("random_sample_clips", int, 1, "1: random clips in training, 0: evenly spaced", choices=(0, 1)),
    O("train_batch_size", int, 128, "training groups (videos) per process per micro-step", min=1),
    O("val_batch_size", int, 128, "validation groups per process", min=1),
    O("gradient_accumulation_steps", int, 1, "micro-steps per optimizer step (loss is divided by it)",
      min=1),
    O("learning_rate", float, 5e-5, "transformer learning rate", min=0, min_exclusive=True),
    O("num_valid", int, 20, "about how many validations in a run", min=1),
    O("min_valid_steps", int, 100, "validation interval is a multiple of this", min=1),
    O("save_steps_ratio", float, 0.01, "restore-file interval as a fraction of the training steps",
      min=0, max=1, min_exclusive=True),
    O("num_train_epochs", int, 10, "training epochs", min=1),
    O("optim", str, "adamw", "optimizer", choices=("adamw", "adam", "adamax")),
    O("betas", float, [0.9, 0.98], "Adam betas", nargs=2, min=0, max=1),
    O("decay", str, "linear", "transformer LR schedule", choices=DECAYS),
    O("dropout", float, 0.1, "", unused=_UNUSED + " (dropout comes from model_config)"),
    O("weight_decay", float, 1e-3, "transformer weight decay", min=0),
    O("grad_norm", float, 2.0, "gradient clipping max norm; -1 disables clipping"),
    O("warmup_ratio", float, 0.1, "warm-up fraction of training (both schedules)", min=0, max=1),
    O("transformer_lr_mul", float, 1.0, "LR multiplier for transformer params matching the prefix",
      min=0),
    O("transformer_lr_mul_prefix", str, "", "substring selecting transformer params for the multiplier"),
    O("step_decay_epochs", int, None, "multi_step milestones (epochs) for the transformer", nargs="+",
      min=0),
    O("cnn_step_decay_epochs", int, None, "multi_step milestones (epochs) for the CNN", nargs="+", min=0),
    O("cnn_optim", str, "adamw", "", unused=_UNUSED + " (one optimizer serves both parts)"),
    O("cnn_sgd_momentum", float, 0.9, "", unused=_UNUSED),
    O("cnn_learning_rate", float, 5e-5, "CNN learning rate", min=0, min_exclusive=True),
    O("cnn_weight_decay", float, 1e-3, "CNN weight decay", min=0),
    O("cnn_lr_mul", float, 1.0, "LR multiplier for CNN params matching the prefix", min=0),
    O("cnn_lr_mul_prefix", str, "grid_encoder", "substring selecting CNN params for the multiplier"),
    O("cnn_lr_decay", str, "linear", "CNN LR schedule", choices=DECAYS),
    O("freeze_cnn", bool, False, "freeze the CNN body (cnn.feature.*)"),
    O("detectron2_model_cfg", str, "", "", unused=_UNUSED + " (no detectron2; the backbone is cnn_type)"),
    O("e2e_weights_path", str, None, "full ClipBERT checkpoint to start from"),
    O("detectron2_weights_path", str, None, "legacy name of cnn_weights_path (copied there if unset)"),
    O("bert_weights_path", str, None, "BERT weights to initialise the transformer"),
    O("inference_model_step", int, -1, "checkpoint step used by --do_inference 1"),
    O("do_inference", bool, False, "run inference from output_dir/ckpt instead of training"),
    O("inference_split", str, "val", "split name used in inference result paths"),
    O("inference_txt_db", str, None, "annotation file for inference"),
    O("inference_img_db", str, None, "video LMDB for inference"),
    O("inference_batch_size", int, 64, "inference batch size", min=1),
    O("inference_n_clips", int, 1, "clips per video at inference", min=1),
    O("seed", int, 42, "random seed"),
    O("fp16", bool, False, "apex-amp O2 mixed precision (fp32 BatchNorm)"),
    O("n_workers", int, 4, "DataLoader worker processes", min=0),
    O("pin_mem", bool, True, "pin DataLoader memory"),
    # product additions
    O("dist_backend", str, "auto", "hvd backend: real Horovod or torch.distributed",
      choices=("auto", "horovod", "torch"), group="product"),
    O("cnn_type", str, "resnet50", "visual backbone", choices=("tiny", "resnet50"), group="product"),
    O("cnn_weights_path", str, None, "CNN (grid-feat ResNet) weights", group="product"),
    O("grad_ckpt", bool, False, "gradient checkpointing in the transformer", group="product"),
    O("skip_bad_videos", bool, True, "training: skip (count and log) undecodable videos", group="product"),
    O("bf16", bool, False, "bfloat16 autocast (no loss scaling); exclusive with fp16", group="product"),
    O("early_stop_patience", int, -1, "stop after this many validations without improvement; -1 off",
      group="product"),
    O("best_metric", str, None, "validation metric for the best checkpoint (task default if unset)",
      group="product"),
    O("best_metric_mode", str, "auto", "max|min; auto: min for loss/medianR/meanR, else max",
      choices=("auto", "max", "min"), group="product"),
    O("log_interval", int, 100, "optimizer steps between log.txt progress lines", min=1, group="product"),
    # ClipBERT pretraining options that may sit in shared config files
    O("itm_neg_prob", float, 0.5, "", unused=_PRETRAIN, group="pretrain"),
    O("use_itm", bool, False, "", unused=_PRETRAIN, group="pretrain"),
    O("use_mlm", bool, False, "", unused=_PRETRAIN, group="pretrain"),
    O("pixel_random_sampling_size", int, 0, "", unused=_PRETRAIN, group="pretrain"),
    # JSON-only
    O("train_datasets", list, None, "list of {name, txt, img[, vis_format, ratio]}", json_only=True),
    O("val_datasets", list, None, "list of {name, txt, img[, vis_format, ratio]}", json_only=True),
]

RETRIEVAL_OPTIONS = [
    O("itm_neg_size", int, 1, "negative texts per positive in training", min=0, group="retrieval"),
    O("classifier", str, "mlp", "head type", choices=("mlp", "linear"), group="retrieval"),
    O("cls_hidden_scale", int, 2, "mlp head hidden size multiplier", min=1, group="retrieval"),
    O("margin", float, 0.2, "rank-loss margin", min=0, group="retrieval"),
    O("loss_type", str, "ce", "ce (2-way ITM) or rank (1 logit)", choices=("ce", "rank"), group="retrieval"),
    O("eval_retrieval_batch_size", int, 256, "texts per forward in retrieval evaluation", min=1,
      group="retrieval"),
    O("num_labels", int, 2, "derived: 1 for loss_type rank, else 2", derived=True, group="retrieval"),
]

VIDEO_QA_OPTIONS = [
    O("task", str, None, "TGIF-QA / MSRVTT-QA task",
      choices=("action", "transition", "frameqa", "msrvtt_qa"), nullable=False, group="video_qa"),
    O("loss_type", str, "ce", "loss (video QA always uses ce)", choices=("ce",), group="video_qa"),
    O("classifier", str, "mlp", "head type", choices=("mlp", "linear"), group="video_qa"),
    O("cls_hidden_scale", int, 2, "mlp head hidden size multiplier", min=1, group="video_qa"),
    O("ans2label_path", str, None, "json {answer: label}; required for frameqa/msrvtt_qa",
      group="video_qa"),
    O("num_labels", int, None, "derived: 5 for action/transition, len(ans2label) otherwise",
      derived=True, group="video_qa"),
]


# ----------------------------------------------------------------------------------------------
# tasks
@dataclass
class TaskSpec:
    name: str
    options: list
    post_parse: Optional[Callable] = None
    parent: Optional[str] = None
    extra: list = field(default_factory=list)


_TASKS = {}


def register_task(name, options=(), post_parse=None, parent="shared"):
    """Declare a task's options (added to the parent's) and its post-parse rule ``fn(cfg)``."""
    _TASKS[name] = TaskSpec(name, list(options), post_parse, parent)


def task_options(task):
    """name -> Option for ``task``, parents first (a child's option replaces the parent's)."""
    if task not in _TASKS:
        raise ConfigError(f"unknown task {task!r}; known: {'|'.join(sorted(_TASKS))}")
    spec = _TASKS[task]
    opts = task_options(spec.parent) if spec.parent else {}
    for o in spec.options:
        opts[o.name] = o
    return dict(opts)


def _post_chain(task):
    spec = _TASKS[task]
    chain = _post_chain(spec.parent) if spec.parent else []
    return chain + ([spec.post_parse] if spec.post_parse else [])


# ----------------------------------------------------------------------------------------------
# value checking
def _fmt(v):
    return json.dumps(v) if not isinstance(v, str) else repr(v)


def _allowed(o):
    if o.choices:
        return "one of " + "|".join(str(c) for c in o.choices)
    rng = []
    if o.min is not None:
        rng.append((">" if o.min_exclusive else ">=") + f" {o.min:g}")
    if o.max is not None:
        rng.append(f"<= {o.max:g}")
    s = o.type_name() + (" " + " and ".join(rng) if rng else "")
    return s + (" or null" if o.nullable else "")


def _bad(o, value, source, why=None):
    why = why or f"expected {_allowed(o)}"
    if source == "command line":  # show what was typed
        shown = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    else:
        shown = _fmt(value)
    return ConfigError(f"{o.name}={shown} ({source}) is invalid: {why}")


def _scalar(o, v, source, from_cli):
    t = o.type
    if t is bool:
        if from_cli:
            if v in _BOOL_TRUE:
                return True
            if v in _BOOL_FALSE:
                return False
        elif isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
            return bool(v)
        raise _bad(o, v, source, "expected 0|1 (or true|false)")
    if t in (int, float):
        if from_cli:
            try:
                return t(v)
            except ValueError:
                raise _bad(o, v, source) from None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _bad(o, v, source)
        if t is float:
            return float(v)
        if isinstance(v, int) or v.is_integer():
            return int(v)
        raise _bad(o, v, source)
    if t is str:
        if isinstance(v, str):
            return v
        raise _bad(o, v, source)
    return v


def _check_range(o, v, source, shown):
    if o.choices is not None and v not in o.choices:
        raise _bad(o, shown, source)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if o.min is not None and (v < o.min or (o.min_exclusive and v == o.min)):
            raise _bad(o, shown, source)
        if o.max is not None and v > o.max:
            raise _bad(o, shown, source)


def coerce(o, value, source, from_cli=False):
    """Check/convert one value for option ``o``; raises ConfigError naming key, value, allowed."""
    if value is None or (from_cli and value in ("None", "null") and o.nullable):
        if o.nullable:
            return None
        raise _bad(o, value, source, f"a value is required ({_allowed(o)})")
    if o.json_only:
        return _check_datasets(o, value, source)
    if o.nargs is None:
        if isinstance(value, (list, dict)):
            raise _bad(o, value, source)
        v = _scalar(o, value, source, from_cli)
        _check_range(o, v, source, value)
        return v
    if not isinstance(value, (list, tuple)):
        raise _bad(o, value, source, f"expected a list ({_allowed(o)})")
    if isinstance(o.nargs, int) and len(value) != o.nargs:
        raise _bad(o, value, source, f"expected exactly {o.nargs} values")
    if o.nargs == "+" and not value:
        raise _bad(o, value, source, "expected at least one value")
    out = []
    for x in value:
        if isinstance(x, (list, dict)):
            raise _bad(o, value, source)
        try:
            y = _scalar(o, x, source, from_cli)
            _check_range(o, y, source, x)
        except ConfigError:
            raise _bad(o, value, source) from None
        out.append(y)
    return out


_DS_KEYS = {"name": str, "txt": (str, list, dict), "img": str, "vis_format": str, "ratio": (int, float)}


def _check_datasets(o, value, source):
    if not isinstance(value, list) or not value:
        raise _bad(o, value, source, "expected a non-empty list of {name, txt, img} objects")
    for i, d in enumerate(value):
        where = f"{o.name}[{i}]"
        if not isinstance(d, dict):
            raise ConfigError(f"{where}={_fmt(d)} ({source}) is invalid: expected an object "
                              "{name, txt, img}")
        for k in d:
            if k not in _DS_KEYS:
                raise ConfigError(f"{where} ({source}) has unknown key {k!r}{_suggest(k, _DS_KEYS)}; "
                                  f"allowed: {', '.join(_DS_KEYS)}")
        for k in ("name", "txt", "img"):
            if k not in d:
                raise ConfigError(f"{where} ({source}) is missing required key {k!r} "
                                  "(each dataset needs name, txt, img)")
        for k, t in _DS_KEYS.items():
            if k in d and not isinstance(d[k], t):
                raise ConfigError(f"{where}.{k}={_fmt(d[k])} ({source}) is invalid: expected "
                                  f"{'a string' if t is str else 'a string, list or object'}")
        txt = d["txt"]
        vals = txt if isinstance(txt, list) else list(txt.values()) if isinstance(txt, dict) else [txt]
        if not vals or not all(isinstance(x, str) for x in vals):
            raise ConfigError(f"{where}.txt={_fmt(txt)} ({source}) is invalid: expected a path, a list "
                              "of paths or {task: path}")
    return value


def _suggest(name, names):
    m = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return f"; did you mean {m[0]!r}?" if m else ""


# ----------------------------------------------------------------------------------------------
# argparse
class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ConfigError(f"command line: {message}")


def build_parser(task):
    """argparse parser generated from the schema. Every default is SUPPRESS: only given flags appear."""
    opts = task_options(task)
    p = _Parser(description=f"clipbert-legacy {task} options (see the README's config reference)",
                argument_default=argparse.SUPPRESS, allow_abbrev=True)
    p.add_argument("--config", default=None, help="JSON config file; CLI flags override its values")
    for o in opts.values():
        if o.json_only:
            continue
        hlp = o.help or o.unused or ""
        p.add_argument(f"--{o.name}", dest=o.name, nargs=o.nargs, metavar=o.type_name().upper(),
                       help=f"{hlp} (default: {o.default!r})".replace("%", "%%"))
    return p


def _load_json(path):
    if not os.path.isfile(path):
        raise ConfigError(f"--config {path!r}: file not found")
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--config {path!r}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}")
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path!r}: expected a JSON object of options, got {type(data).__name__}")
    return data


OVERRIDES_ENV = "CLIPBERT_OVERRIDES"


def env_overrides():
    """Extra CLI flags from ``$CLIPBERT_OVERRIDES``, appended after the command line (so they win).

    For wrappers that must change a setting of every run without editing commands, e.g. cluster
    scripts, or the README test that runs the documented commands in a reduced mode.
    """
    text = os.environ.get(OVERRIDES_ENV, "").strip()
    if not text:
        return []
    try:
        return shlex.split(text)
    except ValueError as e:
        raise ConfigError(f"${OVERRIDES_ENV}={text!r}: {e}") from None


def parse_args(task, argv=None):
    """Parse ``argv`` (default ``sys.argv[1:]``) for ``task`` into a validated :class:`Config`.

    Raises :class:`ConfigError` (one line) on any bad key or value.
    """
    opts = task_options(task)
    parser = build_parser(task)
    argv = (sys.argv[1:] if argv is None else list(argv)) + env_overrides()
    ns, unknown = parser.parse_known_args(argv)
    if unknown:
        tok = unknown[0]
        flag = tok.split("=", 1)[0]
        if flag.startswith("--"):
            flags = [n for n, o in opts.items() if not o.json_only]
            hint = _suggest(flag[2:], flags)
            if flag[2:] in opts and opts[flag[2:]].json_only:
                hint = f"; {flag[2:]} can only be set in the --config JSON file"
            raise ConfigError(f"command line: unknown option {flag!r}{hint}")
        raise ConfigError(f"command line: unexpected argument {tok!r}")
    cli = vars(ns)
    cfg_path = cli.pop("config", None)
    values = {n: o.default for n, o in opts.items()}
    given = set()
    notices = []
    if cfg_path:
        src = os.path.basename(cfg_path)
        for k, v in _load_json(cfg_path).items():
            if k not in opts:
                if k == "config":
                    continue
                raise ConfigError(f"unknown option {k!r} in {cfg_path}{_suggest(k, opts)}")
            values[k] = coerce(opts[k], v, src)
            given.add(k)
    for k, v in cli.items():
        values[k] = coerce(opts[k], v, "command line", from_cli=True)
        given.add(k)
    for k in sorted(given):
        if opts[k].unused:
            notices.append(f"option {k!r} is {opts[k].unused}")
    cfg = Config({k: (list(v) if isinstance(v, list) else v) for k, v in values.items()})
    cfg._given = sorted(given)  # popped below; lets post-parse rules know what the user set
    for fn in _post_chain(task):
        fn(cfg, notices)
    for o in opts.values():
        if o.derived and o.name in given:
            user = coerce(o, _raw(cfg_path, cli, o.name), "given", from_cli=o.name in cli)
            if user != cfg[o.name]:
                notices.append(f"option {o.name!r} is derived ({o.help}); the given {user!r} is "
                               f"replaced by {cfg[o.name]!r}")
    del cfg["_given"]
    for n in notices:
        logger.warning("config: %s", n)
    return cfg


def _raw(cfg_path, cli, name):
    if name in cli:
        return cli[name]
    return _load_json(cfg_path)[name]


def parse_args_or_exit(task, argv=None):
    """CLI entry: like :func:`parse_args`, but a ConfigError prints one line and exits with 2."""
    try:
        return parse_args(task, argv)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(2)


# ----------------------------------------------------------------------------------------------
# post-parse rules
def _shared_post(cfg, notices):
    if cfg.fp16 and cfg.bf16:
        raise ConfigError("fp16=1 and bf16=1 are exclusive: choose one mixed-precision mode")
    if cfg.grad_norm != -1 and cfg.grad_norm <= 0:
        raise ConfigError(f"grad_norm={cfg.grad_norm:g} is invalid: expected > 0, or -1 to disable clipping")
    if cfg.early_stop_patience != -1 and cfg.early_stop_patience < 1:
        raise ConfigError(f"early_stop_patience={cfg.early_stop_patience} is invalid: expected >= 1, "
                          "or -1 to disable early stopping")
    if not 0 <= cfg.warmup_ratio < 1:
        raise ConfigError(f"warmup_ratio={cfg.warmup_ratio:g} is invalid: expected 0 <= value < 1")
    for sched, key in (("decay", "step_decay_epochs"), ("cnn_lr_decay", "cnn_step_decay_epochs")):
        if cfg[sched] == "multi_step" and not cfg[key]:
            raise ConfigError(f"{sched}='multi_step' needs {key} (milestone epochs, e.g. [2, 4])")
    if cfg.detectron2_weights_path and not cfg.cnn_weights_path:
        cfg.cnn_weights_path = cfg.detectron2_weights_path
        notices.append("detectron2_weights_path is used as cnn_weights_path")
    if "score_agg_func" in cfg and cfg.score_agg_func == "lse" and cfg.get("loss_type") not in (None, "ce"):
        raise ConfigError(f"score_agg_func='lse' requires loss_type='ce', got loss_type={cfg.loss_type!r}")


def _retrieval_post(cfg, notices):
    cfg.num_labels = 1 if cfg.loss_type == "rank" else 2
    cfg.task_type = "retrieval"


def _mc_post(cfg, notices):
    if not cfg.do_inference:
        raise ConfigError("msrvtt_mc is inference only: set do_inference=1 (with inference_txt_db, "
                          "inference_img_db, inference_model_step)")


def _video_qa_post(cfg, notices):
    if cfg.task is None:
        if cfg.do_inference:  # inference takes task (and the derived keys) from the trained run
            return
        raise ConfigError("task=null is invalid: video QA needs task, one of "
                          "action|transition|frameqa|msrvtt_qa")
    cfg.max_n_example_per_group = 1
    cfg.loss_type = "ce"
    if cfg.task in ("action", "transition"):
        cfg.num_labels = 5
        cfg.task_type = "qa_mc"
        return
    cfg.task_type = "qa_open"
    path = cfg.ans2label_path
    if not path:
        raise ConfigError(f"ans2label_path=null is invalid for task={cfg.task!r}: give the "
                          "{answer: label} json of the training answers")
    if not os.path.isfile(path):
        raise ConfigError(f"ans2label_path={path!r}: file not found")
    try:
        with open(path) as f:
            ans2label = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"ans2label_path={path!r}: invalid JSON ({e})")
    if not isinstance(ans2label, dict) or not ans2label:
        raise ConfigError(f"ans2label_path={path!r}: expected a non-empty JSON object {{answer: label}}")
    labels = sorted(ans2label.values())
    if labels != list(range(len(labels))):
        raise ConfigError(f"ans2label_path={path!r}: labels must be 0..{len(labels) - 1} without gaps")
    cfg.num_labels = len(ans2label)
    if "train_datasets" in cfg and cfg.train_datasets:
        for key in ("train_datasets", "val_datasets"):
            for i, d in enumerate(cfg.get(key) or []):
                if isinstance(d.txt, dict) and cfg.task not in d.txt:
                    raise ConfigError(f"{key}[{i}].txt has no entry for task {cfg.task!r}; "
                                      f"keys: {', '.join(d.txt)}")


register_task("shared", SHARED_OPTIONS, _shared_post, parent=None)
register_task("retrieval", RETRIEVAL_OPTIONS, _retrieval_post)
register_task("msrvtt_mc", [], _mc_post, parent="retrieval")
register_task("video_qa", VIDEO_QA_OPTIONS, _video_qa_post)


class SharedConfigs:
    """ClipBERT's entry-point names (``shared_configs.get_video_retrieval_args()`` etc.)."""

    def get_video_retrieval_args(self, argv=None):
        return parse_args_or_exit("retrieval", argv)

    def get_video_qa_args(self, argv=None):
        return parse_args_or_exit("video_qa", argv)

    def get_msrvtt_mc_args(self, argv=None):
        return parse_args_or_exit("msrvtt_mc", argv)


shared_configs = SharedConfigs()


# ----------------------------------------------------------------------------------------------
# inference: which stored keys define the trained model
MODEL_KEYS = ("model_config", "tokenizer_dir", "max_txt_len", "max_img_size", "img_pixel_mean",
              "img_pixel_std", "img_input_format", "cnn_type", "num_labels", "loss_type", "classifier",
              "cls_hidden_scale", "task", "task_type", "ans2label_path", "freeze_cnn", "grad_ckpt")


def apply_stored_model_config(cfg, stored_args, keys=MODEL_KEYS):
    """Copy the model-defining keys of a training run's ``log/args.json`` into ``cfg``.

    Unlike ClipBERT (which overwrote every stored key but ``*inference*``), inference settings the
    user gives now (score_agg_func, fps, num_frm, output_dir, ...) stay as given.
    """
    for k in keys:
        if k in stored_args and k in cfg and cfg[k] != stored_args[k]:
            logger.info("inference: %s=%r from the trained run's args.json (was %r)", k, stored_args[k],
                        cfg[k])
        if k in stored_args:
            cfg[k] = stored_args[k]
    return cfg


# ----------------------------------------------------------------------------------------------
def config_reference_markdown(tasks=("retrieval", "video_qa")):
    """Markdown table of every option (for the README), generated from the schema."""
    rows = {}
    for t in tasks:
        for name, o in task_options(t).items():
            rows.setdefault(name, (o, []))[1].append(t)
    lines = ["| option | type | default | allowed | tasks | description |",
             "|---|---|---|---|---|---|"]
    for name, (o, ts) in rows.items():
        allowed = "|".join(str(c) for c in o.choices) if o.choices else _range_text(o)
        scope = "all" if o.group in ("shared", "product", "pretrain") else ", ".join(ts)
        desc = o.help if not o.unused else f"*{o.unused}*"
        if o.json_only:
            desc += " (JSON only)"
        if o.derived:
            desc = f"*{desc}*"
        default = "" if o.json_only else f"`{json.dumps(o.default)}`"
        cells = [f"`{name}`", o.type_name(), default, allowed, scope, desc]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _range_text(o):
    parts = []
    if o.min is not None:
        parts.append(("> " if o.min_exclusive else ">= ") + f"{o.min:g}")
    if o.max is not None:
        parts.append(f"<= {o.max:g}")
    return ", ".join(parts)


README_BEGIN = "<!-- BEGIN CONFIG REFERENCE -->"
README_END = "<!-- END CONFIG REFERENCE -->"


def update_readme(path):
    """Rewrite the generated config table between the README's markers; True if it changed."""
    with open(path) as f:
        text = f.read()
    if README_BEGIN not in text or README_END not in text:
        raise ValueError(f"{path}: markers {README_BEGIN} / {README_END} not found")
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    new = f"{head}{README_BEGIN}\n{config_reference_markdown()}{README_END}{tail}"
    if new != text:
        with open(path, "w") as f:
            f.write(new)
    return new != text


if __name__ == "__main__":  # python -m src.config [--update-readme README.md]
    if len(sys.argv) == 3 and sys.argv[1] == "--update-readme":
        print("updated" if update_readme(sys.argv[2]) else "up to date", sys.argv[2])
    else:
        sys.stdout.write(config_reference_markdown())
