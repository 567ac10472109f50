"""Inference: which keys of a training run's stored ``log/args.json`` define the trained model."""
import logging
from collections.abc import Iterable, Mapping

from src.config.schema import Config

logger = logging.getLogger(__name__)

MODEL_KEYS = ("model_config", "tokenizer_dir", "max_txt_len", "max_img_size", "img_pixel_mean",
              "img_pixel_std", "img_input_format", "cnn_type", "num_labels", "loss_type", "classifier",
              "cls_hidden_scale", "task", "task_type", "ans2label_path", "freeze_cnn", "grad_ckpt")


def apply_stored_model_config(cfg: Config, stored_args: Mapping, keys: Iterable[str] = MODEL_KEYS) -> Config:
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
