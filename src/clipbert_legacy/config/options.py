"""ClipBERT's options (shared, retrieval, video QA) with their post-parse rules, declared as the task specs
``SHARED``, ``RETRIEVAL``, ``MSRVTT_MC`` and ``VIDEO_QA`` (known to the parser through
``clipbert_legacy.config.tasks``;
their task classes carry them: ``clipbert_legacy.tasks.run_*``)."""
import functools
import json
import os
import re

from clipbert_legacy.config.schema import Config, ConfigError
from clipbert_legacy.config.schema import Option as O
from clipbert_legacy.config.task_spec import TaskSpec
from clipbert_legacy.utils.errors import clip, shown

DECAYS = ("linear", "invsqrt", "constant", "multi_step", "cosine")
"""The LR schedules (``optimization.sched.get_lr_sched`` implements them; its ``SCHEDULES``)."""
FRAME_SAMPLING_STRATEGIES = ("rand", "uniform", "start", "middle", "end")
"""Which frames of a clip are taken (``clipbert_legacy.datasets.decoder`` implements them)."""
OPEN_ENDED_QA = ("frameqa", "msrvtt_qa")  # answers are labels of ans2label
IMG_RESIZE_MODES = ("exact", "uint8")  # ``img_resize``: ClipBERT's float values, or torch's uint8 resize
MAX_FRAME_PIXELS = 7680 * 4320  # ``max_frame_pixels``' default (8K UHD), as Pillow's MAX_IMAGE_PIXELS
MC_QA = ("action", "transition")  # 5 candidate answers per question
QA_TASKS = OPEN_ENDED_QA + MC_QA
"""The video QA sub-tasks (option ``task``; ``clipbert_legacy.datasets.dataset_video_qa`` reads them)."""
_UNUSED = "accepted for ClipBERT compatibility but has no effect"
_PRETRAIN = "a ClipBERT pretraining option; fine-tuning tasks ignore it"

SHARED_OPTIONS = [
    O("debug", bool, False, "stop training after 3 steps (evaluators may shorten validation)"),
    O("data_ratio", float, 1.0, "keep a random fraction of the training annotations", min=0,
      max=1, min_exclusive=True),
    O("max_eval_examples", int, 0, "validation and inference use only the first N rows of their "
      "annotation file (retrieval: those captions against their videos), for a quick check: the scores "
      "are over that subset (logged; inference writes them to a step_..._first{N} folder); 0: all",
      min=0, group="product", runtime=True),
    O("model_config", str, None, "path to the model json config (BERT config)", model=True),
    O("tokenizer_dir", str, None, "directory of the BertTokenizerFast files", model=True),
    O("output_dir", str, None, "where log/, ckpt/ and results go", runtime=True),
    O("max_txt_len", int, 20, "max text tokens including [CLS]/[SEP]", min=3, model=True),
    O("max_img_size", int, 448, "longer image side after resize; zero-padded to a square", min=1, model=True),
    O("img_pixel_mean", float, None, "per-channel pixel mean (in img_input_format order)", nargs=3,
      model=True),
    O("img_pixel_std", float, None, "per-channel pixel std", nargs=3, model=True),
    O("img_input_format", str, "BGR", "channel order fed to the CNN", choices=("BGR", "RGB"), model=True),
    O("max_n_example_per_group", int, 2, "texts sampled per video in a training group", min=1),
    O("fps", int, 1, "frame rate frames are sampled at", min=1),
    O("num_frm", int, 3, "frames per clip", min=1),
    O("frm_sampling_strategy", str, "rand", "which frames of a clip are taken",
      choices=FRAME_SAMPLING_STRATEGIES),
    O("train_n_clips", int, 3, "clips sampled per video in training", min=1),
    O("score_agg_func", str, "mean", "how clip scores are aggregated", choices=("mean", "max", "lse")),
    O("random_sample_clips", int, 1, "1: random clips in training, 0: evenly spaced", choices=(0, 1)),
    O("train_batch_size", int, 128, "training groups (videos) per process per micro-step", min=1),
    O("val_batch_size", int, 128, "validation groups per process", min=1, runtime=True),
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
    O("freeze_cnn", bool, False, "freeze the CNN body (cnn.feature.*)", model=True),
    O("detectron2_model_cfg", str, "", "", unused=_UNUSED + " (no detectron2; the backbone is cnn_type)"),
    O("e2e_weights_path", str, None, "full ClipBERT checkpoint to start from"),
    O("detectron2_weights_path", str, None, "legacy name of cnn_weights_path (copied there if unset)"),
    O("bert_weights_path", str, None, "BERT weights to initialise the transformer"),
    O("allow_unmatched_weights", bool, False, "accept a cnn/bert/e2e weights file that initialises less than "
      "half of the model part it is for (by default an error naming the file: it is usually another "
      "model's weights, and training would go on from random ones)", runtime=True),
    O("inference_model_step", int, -1, "checkpoint step used by --do_inference 1", runtime=True),
    O("do_inference", bool, False, "run inference from output_dir/ckpt instead of training", runtime=True),
    O("inference_split", str, "val", "split name used in inference result paths"),
    O("inference_txt_db", str, None, "annotation file for inference", runtime=True),
    O("inference_img_db", str, None, "video LMDB for inference", runtime=True),
    O("inference_batch_size", int, 64, "inference batch size", min=1, runtime=True),
    O("inference_n_clips", int, 1, "clips per video at inference", min=1, runtime=True),
    O("seed", int, 42, "random seed"),
    O("fp16", bool, False, "apex-amp O2 mixed precision (fp32 BatchNorm)"),
    O("n_workers", int, None, "DataLoader worker processes (unset: 4, at most the CPU cores per process)",
      min=0, runtime=True),
    O("pin_mem", bool, True, "pin DataLoader memory", runtime=True),
    # product additions
    O("dist_backend", str, "auto", "hvd backend: real Horovod or torch.distributed",
      choices=("auto", "horovod", "torch"), group="product", runtime=True),
    O("zero_stage", int, 0, "optimizer state sharded over ranks (ZeRO): 0 off; 1 each rank keeps the Adam "
      "moments (and amp O2's fp32 masters) of its share of the parameters, about 1/N of them; 2 also sums "
      "each gradient onto its owner only (torchrun + dist_backend torch); same weights as 0",
      choices=(0, 1, 2), group="product", runtime=True),
    O("cnn_type", str, None, "visual backbone (unset: the model config's cnn_type, else resnet50)",
      choices=("tiny", "resnet50"), group="product", model=True),
    O("cnn_weights_path", str, None, "CNN (grid-feat ResNet) weights", group="product"),
    O("grad_ckpt", bool, False, "gradient checkpointing in the transformer", group="product", model=True),
    O("skip_bad_videos", bool, True, "evaluation: leave out undecodable videos (listed in "
      "skipped_videos.json, metrics over the rest) instead of failing; training always replaces them "
      "(counted, logged)",
      group="product", runtime=True),
    O("min_video_frames", int, 2, "a video with fewer frames is bad ('too_short': a still is no video)",
      min=1, group="product"),
    O("max_frame_pixels", int, MAX_FRAME_PIXELS, "a video or image whose frames have more pixels (width x "
      "height, read from the header before decoding) is bad ('too_large'); default 8K UHD; 0: no limit",
      min=0, group="product"),
    O("img_resize", str, "exact", "exact: ClipBERT's float resize/pad, bit for bit, float32 batches; uint8: "
      "torch's uint8 resize (pixels within one level of exact), uint8 batches (4x fewer bytes from the "
      "workers), made float and normalised on the device (docs/benchmarks_loader.md)",
      choices=IMG_RESIZE_MODES, group="product"),
    O("bf16", bool, False, "bfloat16 autocast (no loss scaling); exclusive with fp16", group="product"),
    O("early_stop_patience", int, -1, "stop after this many validations without improvement; -1 off",
      group="product"),
    O("early_stop_min_delta", float, 0.0, "an improvement of best_metric by this much or less does not reset "
      "early_stop_patience (it still updates model_best.pt)", min=0.0, group="product"),
    O("best_metric", str, None, "validation metric for the best checkpoint (task default if unset)",
      group="product"),
    O("best_metric_mode", str, "auto", "max|min; auto: min for loss/medianR/meanR, else max",
      choices=("auto", "max", "min"), group="product"),
    O("grad_compression", str, "none", "gradient allreduce compression: none | fp16 (Horovod's "
      "Compression.fp16: half the bytes on the wire, gradients rounded to fp16)", choices=("none", "fp16"),
      group="product"),
    O("cpu_sched_batch", bool, True, "CPU jobs (no GPU visible): run the training process and its threads "
      "under Linux's SCHED_BATCH policy, so Horovod's and Gloo's many short wake-ups stop preempting "
      "the compute threads (2 ranks on 2 cores: +4% examples/s); no effect with a GPU or off Linux",
      group="product", runtime=True),
    O("row_sparse_allreduce", int, 0, "1: the word-embedding gradient (nn.Embedding tables of >= 1024 rows) "
      "is averaged over only the rows some rank's batch touched, not all 30,522 (exact: the other rows "
      "are zero on every rank); for links where the 47 MB dense table costs (several machines over "
      "Ethernet); no gain on one machine", choices=(0, 1), group="product", runtime=True),
    O("elastic_commit_steps", int, 50, "elastic training: optimizer steps between commits of the run's "
      "state (horovodrun --min-np/--max-np: to host memory, a failed worker rolls the others back to it; "
      "torchrun --max-restarts: to ckpt/restore.pt, restarted workers resume from it); unused otherwise",
      min=1, group="product", runtime=True),
    O("path_prefix", str, None, "folder standing for ClipBERT's container mounts: /txt/x, /img/x, "
      "/pretrain/x, /storage/x in the config and on the command line become DIR/txt/x etc. (or "
      "txt=D1,img=D2,... root by root; default $CLIPBERT_PATH_PREFIX)", group="product", runtime=True),
    O("log_interval", int, 100, "optimizer steps between log.txt progress lines", min=1,
      group="product", runtime=True),
    O("profile_steps", str, None, "A-B: a torch.profiler trace (CPU + CUDA, shapes) of optimizer steps A "
      "to B on rank 0 into log/profile/ (TensorBoard's profiler, Perfetto), and the top operators by self "
      "time in the log", group="product", runtime=True),
    O("find_batch_size", str, "none", "power | binsearch: before training, try real steps at growing "
      "train_batch_size until the GPU runs out of memory and train with 90% of the largest that fit "
      "(single process, CUDA only; a resumed run keeps the size it found)",
      choices=("none", "power", "binsearch"), group="product"),
    O("find_batch_size_keep_effective", bool, False, "with find_batch_size: also set "
      "gradient_accumulation_steps so that batch x accumulation stays at least the configured one",
      group="product"),
    O("wandb_project", str, None, "Weights & Biases project: log the TensorBoard scalars, the config and the "
      "final metrics there too (rank 0); a missing or unreachable wandb only warns",
      group="product", runtime=True),
    O("wandb_entity", str, None, "W&B entity (team or user); default: wandb's",
      group="product", runtime=True),
    O("wandb_run_name", str, None, "W&B run name; default: the output_dir's name",
      group="product", runtime=True),
    O("wandb_tags", str, None, "W&B run tags", nargs="+", group="product", runtime=True),
    O("wandb_mode", str, "auto", "online | offline | auto (online when a W&B API key is configured, "
      "else offline: synced later with `wandb sync`)", choices=("auto", "online", "offline"),
      group="product", runtime=True),
    O("keep_last_k", int, -1, "keep the k latest ckpt/model_step_*.pt (with keep_top_k: the union); -1 all. "
      "The best and the latest are never deleted", min=-1, group="product", runtime=True),
    O("keep_top_k", int, -1, "keep the k model_step_*.pt with the best validation metric (see keep_last_k)",
      min=-1, group="product", runtime=True),
    O("existing_run", str, "resume", "an earlier run in output_dir: resume it (same settings only), "
      "extend it under new settings, or restart (the old run moves to previous_runs/)",
      choices=("resume", "extend", "restart"), group="product", runtime=True),
    # ClipBERT pretraining options that may sit in shared config files
    O("itm_neg_prob", float, 0.5, "", unused=_PRETRAIN, group="pretrain"),
    O("use_itm", bool, False, "", unused=_PRETRAIN, group="pretrain"),
    O("use_mlm", bool, False, "", unused=_PRETRAIN, group="pretrain"),
    O("pixel_random_sampling_size", int, 0, "training (every task): keep this many random visual tokens per "
      "image, the same positions for the whole batch; 0 keeps all; evaluation always keeps all", min=0,
      group="pretrain"),
    # JSON-only
    O("train_datasets", list, None, "list of {name, txt, img[, vis_format, ratio]}", json_only=True),
    O("val_datasets", list, None, "list of {name, txt, img[, vis_format, ratio]}", json_only=True),
]

RETRIEVAL_OPTIONS = [
    O("itm_neg_size", int, 1, "negative texts per positive in training", min=0, group="retrieval"),
    O("classifier", str, "mlp", "head type", choices=("mlp", "linear"), group="retrieval", model=True),
    O("cls_hidden_scale", int, 2, "mlp head hidden size multiplier", min=1, group="retrieval", model=True),
    O("margin", float, 0.2, "rank-loss margin", min=0, group="retrieval"),
    O("loss_type", str, "ce", "ce (2-way ITM) or rank (1 logit)", choices=("ce", "rank"),
      group="retrieval", model=True),
    O("eval_retrieval_batch_size", int, 256, "texts per forward in retrieval evaluation", min=1,
      group="retrieval", runtime=True),
    O("num_labels", int, 2, "derived: 1 for loss_type rank, else 2", derived=True,
      group="retrieval", model=True),
]

VIDEO_QA_OPTIONS = [
    O("task", str, None, "TGIF-QA / MSRVTT-QA task",
      choices=MC_QA + OPEN_ENDED_QA, nullable=False, group="video_qa", model=True),
    O("loss_type", str, "ce", "loss (video QA always uses ce)", choices=("ce",),
      group="video_qa", model=True),
    O("classifier", str, "mlp", "head type", choices=("mlp", "linear"), group="video_qa", model=True),
    O("cls_hidden_scale", int, 2, "mlp head hidden size multiplier", min=1, group="video_qa", model=True),
    O("ans2label_path", str, None, "json {answer: label}; required for frameqa/msrvtt_qa",
      group="video_qa", model=True),
    O("num_labels", int, None, "derived: 5 for action/transition, len(ans2label) otherwise",
      derived=True, group="video_qa", model=True),
]


# ----------------------------------------------------------------------------------------------
# post-parse rules
def _shared_post(cfg: Config, notices: list) -> None:
    if cfg.fp16 and cfg.bf16:
        raise ConfigError("fp16=1 and bf16=1 are exclusive: choose one mixed-precision mode")
    if cfg.grad_norm != -1 and cfg.grad_norm <= 0:
        raise ConfigError(f"grad_norm={cfg.grad_norm:g} is invalid: expected > 0, or -1 to disable clipping")
    if cfg.early_stop_patience != -1 and cfg.early_stop_patience < 1:
        raise ConfigError(f"early_stop_patience={cfg.early_stop_patience} is invalid: expected >= 1, "
                          "or -1 to disable early stopping")
    for key in ("keep_last_k", "keep_top_k"):
        if getattr(cfg, key) == 0:
            raise ConfigError(f"{key}=0 would delete every step checkpoint: expected >= 1, or -1 to keep all")
    if cfg.profile_steps is not None:
        profile_range(cfg.profile_steps)
    if not 0 <= cfg.warmup_ratio < 1:
        raise ConfigError(f"warmup_ratio={cfg.warmup_ratio:g} is invalid: expected 0 <= value < 1")
    for sched, key in (("decay", "step_decay_epochs"), ("cnn_lr_decay", "cnn_step_decay_epochs")):
        if cfg[sched] == "multi_step" and not cfg[key]:
            raise ConfigError(f"{sched}='multi_step' needs {key} (milestone epochs, e.g. [2, 4])")
    if cfg.detectron2_weights_path and not cfg.cnn_weights_path:
        cfg.cnn_weights_path = cfg.detectron2_weights_path
        notices.append("detectron2_weights_path is used as cnn_weights_path")
    if "score_agg_func" in cfg:
        check_lse_loss(cfg.score_agg_func, cfg.get("loss_type"))


def check_lse_loss(score_agg_func: str, loss_type: str | None) -> None:
    """ClipBERT's lse loss is a cross-entropy over the classes of every clip: ``score_agg_func`` 'lse'
    needs ``loss_type`` 'ce'. The one check of that rule (at parse time, and by the loss itself)."""
    if score_agg_func == "lse" and loss_type not in (None, "ce"):
        raise ConfigError(f"score_agg_func='lse' requires loss_type='ce', got loss_type={shown(loss_type)}")


def profile_range(spec: str) -> tuple[int, int]:
    """``profile_steps`` "A-B" (or "A") -> (A, B), optimizer steps counted from 1."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", spec)
    first, last = (int(m.group(1)), int(m.group(2) or m.group(1))) if m else (0, 0)
    if not m or not 1 <= first <= last:
        raise ConfigError(f"profile_steps={shown(spec)} is invalid: expected A-B with 1 <= A <= B (optimizer "
                          f"steps, e.g. 10-15), or one step A")
    return first, last


def _retrieval_post(cfg: Config, _notices: list) -> None:
    cfg.num_labels = 1 if cfg.loss_type == "rank" else 2
    cfg.task_type = "retrieval"


def _mc_post(cfg: Config, _notices: list) -> None:
    if not cfg.do_inference:
        raise ConfigError("msrvtt_mc is inference only: set do_inference=1 (with inference_txt_db, "
                          "inference_img_db, inference_model_step)")


def load_ans2label(path: str) -> dict:
    """``ans2label_path``'s ``{answer: label}``, checked: a non-empty object with labels 0..n-1.

    The one reader of the file (config check, datasets, evaluation): it is read once per process and
    version (path, size, modification time); each caller gets its own copy."""
    if not os.path.isfile(path):
        raise ConfigError(f"ans2label_path={shown(path)}: file not found")
    st = os.stat(path)
    return dict(_read_ans2label(os.path.realpath(path), st.st_size, st.st_mtime_ns, path))


@functools.lru_cache(maxsize=8)
def _read_ans2label(real_path: str, _size: int, _mtime_ns: int, path: str) -> dict:
    """The checked file content; ``_size``/``_mtime_ns`` only key the cache (a changed file is re-read)."""
    try:
        with open(real_path, encoding="utf-8-sig") as f:
            ans2label = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"ans2label_path={shown(path)}: invalid JSON ({e})") from None
    if not isinstance(ans2label, dict) or not ans2label:
        raise ConfigError(f"ans2label_path={shown(path)}: expected a non-empty JSON object {{answer: label}}")
    if sorted(ans2label.values()) != list(range(len(ans2label))):
        raise ConfigError(f"ans2label_path={shown(path)}: labels must be 0..{len(ans2label) - 1} "
                          "without gaps")
    return ans2label


def _video_qa_post(cfg: Config, _notices: list) -> None:
    if cfg.task is None:
        if cfg.do_inference:  # inference takes task (and the derived keys) from the trained run
            return
        raise ConfigError("task=null is invalid: video QA needs task, one of "
                          "action|transition|frameqa|msrvtt_qa")
    cfg.max_n_example_per_group = 1
    cfg.loss_type = "ce"
    if cfg.task in MC_QA:
        cfg.num_labels = 5
        cfg.task_type = "qa_mc"
        return
    cfg.task_type = "qa_open"
    path = cfg.ans2label_path
    if not path:
        raise ConfigError(f"ans2label_path=null is invalid for task={cfg.task!r}: give the "
                          "{answer: label} json of the training answers")
    cfg.num_labels = len(load_ans2label(path))
    if "train_datasets" in cfg and cfg.train_datasets:
        for key in ("train_datasets", "val_datasets"):
            for i, d in enumerate(cfg.get(key) or []):
                if isinstance(d.txt, dict) and cfg.task not in d.txt:
                    raise ConfigError(f"{key}[{i}].txt has no entry for task {cfg.task!r}; "
                                      f"keys: {clip(', '.join(d.txt), 300)}")


SHARED = TaskSpec("shared", SHARED_OPTIONS, _shared_post, parent=None)
RETRIEVAL = TaskSpec("retrieval", RETRIEVAL_OPTIONS, _retrieval_post)
MSRVTT_MC = TaskSpec("msrvtt_mc", [], _mc_post, parent="retrieval")
VIDEO_QA = TaskSpec("video_qa", VIDEO_QA_OPTIONS, _video_qa_post)
