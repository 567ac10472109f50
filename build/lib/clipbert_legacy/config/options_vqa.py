"""ClipBERT's VQA options (``get_vqa_args``) and their post-parse rule; declared as the task spec ``VQA``
(its task class carries it). Kept apart from ``options.py`` so each task's keys sit with its rule."""

from clipbert_legacy.config.options import load_ans2label
from clipbert_legacy.config.schema import Config, ConfigError
from clipbert_legacy.config.schema import Option as O
from clipbert_legacy.config.task_spec import TaskSpec
from clipbert_legacy.utils.errors import shown

VQA_OPTIONS = [
    O("ans2label_path", str, None, "json {answer: label}: the answer vocabulary (from the training answers)",
      group="vqa", model=True),
    O("loss_type", str, "bce", "loss over the soft VQA scores (binary cross-entropy, as ClipBERT)",
      choices=("bce",), group="vqa", model=True),
    O("classifier", str, "mlp", "head type", choices=("mlp", "linear"), group="vqa", model=True),
    O("cls_hidden_scale", int, 2, "mlp head hidden size multiplier", min=1, group="vqa", model=True),
    O("num_labels", int, 3129, "derived: len(ans2label) (ClipBERT's 3129 answers)", min=1, derived=True,
      group="vqa", model=True),
]


def _vqa_post(cfg: Config, _notices: list) -> None:
    """task_type qa_open with num_labels = len(ans2label): ClipBERT took num_labels from the config, so a
    vocabulary of another size crashed (larger) or left dead outputs (smaller)."""
    cfg.task_type = "qa_open"
    for key in ("train_datasets", "val_datasets"):
        for i, d in enumerate(cfg.get(key) or []):
            if d.get("vis_format", "image") != "image":
                raise ConfigError(f"{key}[{i}].vis_format={shown(d['vis_format'])}: VQA reads images; "
                                  "use 'image'")
    if not cfg.ans2label_path:
        if cfg.do_inference:  # inference takes the vocabulary from the trained run
            return
        raise ConfigError("ans2label_path=null is invalid for vqa: give the {answer: label} json of the "
                          "training answers "
                          "(python -m clipbert_legacy.preprocessing.make_demo_vqa writes one)")
    cfg.num_labels = len(load_ans2label(cfg.ans2label_path))


VQA = TaskSpec("vqa", VQA_OPTIONS, _vqa_post)
