"""Inference from a training run's output_dir: stored model config, checkpoint, result directory.

Or from a weights file alone (``--do_inference 1 --config X --e2e_weights_path model.pt``, as
CLIP4Clip's ``--do_eval --init_model``): when ``output_dir`` holds no training run, the model is built
from the given config, the file is loaded (every model key must be in it), and results go to
``output_dir`` (default: the file's folder) under ``{prefix}_{stem}/{file stem}_{nclips}_{agg}``.

ClipBERT's inference overwrote every current option with the stored ``log/args.json`` value except
keys containing ``inference`` (so CLI ``score_agg_func``/``fps``/``num_frm`` were silently lost) and
named the result directory before that merge. Here only the model-defining keys
(:func:`clipbert_legacy.config.model_keys`) come from the stored run, ``model_config`` from
``log/model_config.json``, and the result directory is named from the final settings.
"""
import json
import logging
import os
import tempfile

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.config import apply_stored_model_config
from clipbert_legacy.training.checkpoint_files import load_model_weights, model_step_path, saved_model_steps
from clipbert_legacy.utils.device import training_device
from clipbert_legacy.utils.errors import CheckpointError, UnsafeFileError, one_line, write_error
from clipbert_legacy.utils.safe_load import torch_load

logger = logging.getLogger(__name__)


def available_steps(output_dir):
    """Steps of the run's ``ckpt/model_step_N.pt`` files, ascending."""
    return saved_model_steps(os.path.join(output_dir, "ckpt"))


def checkpoint_mode(cfg) -> bool:
    """Inference from ``e2e_weights_path`` alone: set, and ``output_dir`` holds no training run."""
    return bool(cfg.e2e_weights_path) and not os.path.isfile(
        os.path.join(cfg.output_dir or "", "log", "args.json"))


def prepare_inference_config(cfg):
    """Apply the trained run's model-defining settings to ``cfg``; resolve ``inference_model_step``.

    ``inference_model_step=-1`` picks the latest ``ckpt/model_step_*.pt``. In :func:`checkpoint_mode`
    the config is the model's as given, and ``output_dir`` defaults to the weights file's folder.
    """
    if checkpoint_mode(cfg):
        if not os.path.isfile(cfg.e2e_weights_path):
            raise FileNotFoundError(f"e2e_weights_path={cfg.e2e_weights_path!r} does not exist; give the "
                                    f"checkpoint file to evaluate")
        cfg.output_dir = cfg.output_dir or os.path.dirname(os.path.abspath(cfg.e2e_weights_path))
        return cfg
    out = cfg.output_dir
    args_path = os.path.join(out, "log", "args.json")
    if not os.path.isfile(args_path):
        raise FileNotFoundError(f"{args_path} not found: output_dir must be a training run's directory, "
                                f"or give --e2e_weights_path FILE to evaluate a checkpoint file")
    with open(args_path) as f:
        stored = json.load(f)
    apply_stored_model_config(cfg, stored)
    mc = os.path.join(out, "log", "model_config.json")
    if os.path.isfile(mc):
        cfg.model_config = mc
    steps = available_steps(out)
    if not steps:
        raise FileNotFoundError(f"no checkpoints in {os.path.join(out, 'ckpt')} (model_step_*.pt)")
    if cfg.inference_model_step == -1:
        cfg.inference_model_step = steps[-1]
        logger.info("inference_model_step=-1: using the latest checkpoint, step %d", steps[-1])
    elif cfg.inference_model_step not in steps:
        raise FileNotFoundError(f"inference_model_step={cfg.inference_model_step}: no "
                                f"ckpt/model_step_{cfg.inference_model_step}.pt; available steps: {steps}")
    return cfg


def load_trained_model(cfg, task, device=None):
    """``task.build_model(cfg)`` with ``ckpt/model_step_{inference_model_step}.pt`` loaded (strict),
    on the device, in eval mode, amp O2 applied when ``cfg.fp16``."""
    if not hvd.is_initialized():
        hvd.set_backend(cfg.dist_backend)
    hvd.init()
    if device is None:
        device = training_device()
    if checkpoint_mode(cfg):
        model = _model_from_weights_file(cfg, task)
    else:
        model = _model_from_run(cfg, task)
    model.to(device)
    if cfg.fp16:
        from clipbert_legacy.compat import amp
        model = amp.initialize(model, opt_level="O2", keep_batchnorm_fp32=True, verbosity=0)
    model.eval()
    return model


def _model_from_weights_file(cfg, task):
    """The model of ``cfg`` with ``e2e_weights_path`` loaded; every model key must come from the file
    (a model partly at its initial weights would report numbers of no model)."""
    path = cfg.e2e_weights_path
    try:
        model = task.build_model(cfg)  # loads e2e_weights_path (clipbert_legacy.modeling.build)
    except CheckpointError:  # already one line naming the file
        raise
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{path} is unreadable ({one_line(e)}); it may be a truncated save") from e
    summary = getattr(model, "load_summaries", {}).get("e2e")
    if summary is not None and (summary.missing or summary.mismatched):
        raise CheckpointError(f"{path} does not fit the model of this config: {len(summary.missing)} key(s) "
                              f"missing (e.g. {summary.missing[:3]}), {len(summary.mismatched)} of another "
                              f"shape (e.g. {[m[0] for m in summary.mismatched[:3]]}); give the --config "
                              f"(model_config, cnn_type, classifier) the checkpoint was trained with")
    return model


def _model_from_run(cfg, task):
    model = task.build_model(cfg)
    path = model_step_path(os.path.join(cfg.output_dir, "ckpt"), cfg.inference_model_step)
    others = [s for s in available_steps(cfg.output_dir) if s != cfg.inference_model_step]
    try:
        another = f" and pick another --inference_model_step (available: {others})" if others else ""
        sd = torch_load(path, f"the training run writes it as tensors only: if you did not put it there, "
                              f"delete it{another}", follow_symlinks=False)
    except UnsafeFileError:
        raise
    except CheckpointError as e:  # truncated/corrupt file: one line naming it, and the other steps
        raise CheckpointError(f"{e}; or pick another --inference_model_step (available: {others})") from e
    except Exception as e:
        raise CheckpointError(f"{path} is unreadable ({one_line(e)}); it may be a truncated save: "
                              f"pick another --inference_model_step (available: {others})") from e
    load_model_weights(model, sd, path, f"the model is built from {cfg.output_dir}/log/args.json: pick "
                                        f"another --inference_model_step (available: {others})")
    return model


def inference_result_dir(cfg, prefix="results", with_clips=True):
    """ClipBERT's layout: ``{output_dir}/{prefix}_{stem(inference_txt_db)}/step_{N}[_{nclips}_{agg}]``
    (``_first{N}`` appended with ``max_eval_examples``)."""
    stem = os.path.splitext(os.path.basename(cfg.inference_txt_db or "inference"))[0]
    name = (os.path.splitext(os.path.basename(cfg.e2e_weights_path))[0] if checkpoint_mode(cfg)
            else f"step_{cfg.inference_model_step}")
    if with_clips:
        name += f"_{cfg.inference_n_clips}_{cfg.score_agg_func}"
    if int(cfg.max_eval_examples or 0) > 0:  # a subset's scores never overwrite the whole file's
        name += f"_first{int(cfg.max_eval_examples)}"
    return os.path.join(cfg.output_dir, f"{prefix}_{stem}", name)


def check_writable(result_dir: str) -> None:
    """Fail before the work, not after it: the folder the results will go to (or its nearest existing
    parent) must accept a new file."""
    folder = os.path.abspath(result_dir)
    while not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise write_error(result_dir, e) from e


def write_inference_outputs(result_dir: str, files: dict) -> None:
    """Rank 0 writes ``files`` ({file name: JSON-able object}) into ``result_dir``, created now: called
    once inference has succeeded, so a failed run neither leaves a result folder behind nor rewrites
    the ``merged_args.json`` of an earlier good one."""
    if hvd.rank() == 0:
        write_rank_outputs(result_dir, files)


def write_rank_outputs(result_dir: str, files: dict) -> None:
    """Every rank writes its own ``files`` (e.g. ``results_rank{r}.json``) into ``result_dir``."""
    os.makedirs(result_dir, exist_ok=True)
    for name, obj in files.items():
        with open(os.path.join(result_dir, name), "w") as f:
            json.dump(obj, f, indent=None if name.startswith("results") else 4, default=str)
