"""The inference steps every ClipBERT task shares: the trained run's config and checkpoint, the result
directory and its ``raw_args.json`` / ``merged_args.json`` (ClipBERT's layout)."""
import copy
import logging

from clipbert_legacy.training.inference import (
    check_writable,
    checkpoint_mode,
    inference_result_dir,
    load_trained_model,
    prepare_inference_config,
)
from clipbert_legacy.training.inference import write_inference_outputs as write_outputs

logger = logging.getLogger(__name__)


class InferenceSteps:
    """Mixed into ``clipbert_legacy.tasks.base.ClipBertTask``: :meth:`prepare_inference` before a task's
    inference, :meth:`write_inference_outputs` after it; :meth:`run_inference` is the task's."""

    _inference_args: dict

    def prepare_inference(self, cfg, prefix="results"):
        """Stored model config applied (CLI inference settings kept), checkpoint resolved, model
        loaded. Nothing is written yet: :meth:`write_inference_outputs` writes the result dir (with
        ``raw_args.json`` / ``merged_args.json``) once inference has succeeded.

        Returns ``(model, result_dir)``.
        """
        if not cfg.output_dir and not cfg.e2e_weights_path:
            raise ValueError("--output_dir must point at the training run to run inference from (or give "
                             "--e2e_weights_path FILE to evaluate a checkpoint file)")
        if not cfg.inference_txt_db:
            raise ValueError("--inference_txt_db is not set: give the annotation file to run inference on")
        raw = copy.deepcopy(cfg.to_dict())
        prepare_inference_config(cfg)
        result_dir = inference_result_dir(cfg, prefix=prefix)
        check_writable(result_dir)
        model = load_trained_model(cfg, self)
        self._inference_args = {"raw_args.json": raw, "merged_args.json": copy.deepcopy(cfg.to_dict())}
        logger.info("inference: %s, %d clip(s), %s aggregation, results -> %s",
                    cfg.e2e_weights_path if checkpoint_mode(cfg) else f"step {cfg.inference_model_step}",
                    cfg.inference_n_clips, cfg.score_agg_func, result_dir)
        return model, result_dir

    def write_inference_outputs(self, result_dir, files):
        """Rank 0: the result dir with raw/merged args and ``files`` ({name: JSON object})."""
        write_outputs(result_dir, {**self._inference_args, **files})

    def run_inference(self, cfg):  # required for --do_inference 1
        raise NotImplementedError
