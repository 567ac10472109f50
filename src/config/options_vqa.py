"""ClipBERT's VQA options (``get_vqa_args``) and their post-parse rule; importing this module registers
the task ``vqa``. Kept apart from ``options.py`` so each task's keys sit with its rule."""
import json
import os

from src.config.schema import Config, ConfigError
from src.config.schema import Option as O
from src.config.tasks import register_task

VQA_OPTIONS = [
    O("ans2label_path", str, None, "json {answer: label}: the answer vocabulary (from the training answers)",
      group="vqa"),
    O("loss_type", str, "bce", "loss over the soft VQA scores (binary cross-entropy, as ClipBERT)",
      choices=("bce",), group="vqa"),
    O("classifier", str, "mlp", "head type", choices=("mlp", "linear"), group="vqa"),
    O("cls_hidden_scale", int, 2, "mlp head hidden size multiplier", min=1, group="vqa"),
    O("num_labels", int, 3129, "derived: len(ans2label) (ClipBERT's 3129 answers)", min=1, derived=True,
      group="vqa"),
]


def _load_ans2label(path: str) -> dict:
    if not os.path.isfile(path):
        raise ConfigError(f"ans2label_path={path!r}: file not found")
    try:
        with open(path) as f:
            ans2label = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"ans2label_path={path!r}: invalid JSON ({e})") from None
    if not isinstance(ans2label, dict) or not ans2label:
        raise ConfigError(f"ans2label_path={path!r}: expected a non-empty JSON object {{answer: label}}")
    if sorted(ans2label.values()) != list(range(len(ans2label))):
        raise ConfigError(f"ans2label_path={path!r}: labels must be 0..{len(ans2label) - 1} without gaps")
    return ans2label


def _vqa_post(cfg: Config, notices: list) -> None:
    """task_type qa_open with num_labels = len(ans2label): ClipBERT took num_labels from the config, so a
    vocabulary of another size crashed (larger) or left dead outputs (smaller)."""
    cfg.task_type = "qa_open"
    for key in ("train_datasets", "val_datasets"):
        for i, d in enumerate(cfg.get(key) or []):
            if d.get("vis_format", "image") != "image":
                raise ConfigError(f"{key}[{i}].vis_format={d['vis_format']!r}: VQA reads images; use 'image'")
    if not cfg.ans2label_path:
        if cfg.do_inference:  # inference takes the vocabulary from the trained run
            return
        raise ConfigError("ans2label_path=null is invalid for vqa: give the {answer: label} json of the "
                          "training answers (python -m src.preprocessing.make_demo_vqa writes one)")
    cfg.num_labels = len(_load_ans2label(cfg.ans2label_path))


register_task("vqa", VQA_OPTIONS, _vqa_post)
