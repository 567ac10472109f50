"""ClipBERT's dataset_base: the legacy `extract_frames_from_video_binary` and the base dataset
(video loading from LMDB, bad-video replacement in training, reporting/failing in evaluation)."""
import logging
import random
from collections import Counter

import torch
from torch.utils.data import Dataset

from clipbert_legacy.config.options import MAX_FRAME_PIXELS
from clipbert_legacy.datasets.decoder import (
    SAMPLING_STRATEGIES,
    VideoDecodeError,
    decode_clip,
    decode_clips,
    open_container,
    strategy_to_clip,
)
from clipbert_legacy.datasets.image_ops import PaddedFrames
from clipbert_legacy.datasets.lmdb_store import LMDBStore
from clipbert_legacy.utils.errors import UserError

logger = logging.getLogger(__name__)


def get_video_decoding_kwargs(num_frames, target_fps, num_clips=None, clip_idx=None,
                              sampling_strategy="rand", safeguard_duration=False, video_max_pts=None):
    """ClipBERT's mapping: num_clips None -> strategy decides clip_idx; else explicit clip."""
    if num_clips is None:
        clip_idx, num_clips = strategy_to_clip(sampling_strategy)
        return {"num_frames": num_frames, "target_fps": target_fps, "clip_idx": clip_idx,
                "num_clips": num_clips}
    return {"num_frames": num_frames, "target_fps": target_fps, "clip_idx": clip_idx, "num_clips": num_clips,
            "safeguard_duration": safeguard_duration, "video_max_pts": video_max_pts}


def extract_frames_from_video_binary(in_mem_bytes_io, target_fps=3, num_frames=3, num_clips=None,
                                     clip_idx=None, multi_thread_decode=False, sampling_strategy="rand",
                                     safeguard_duration=False, video_max_pts=None):
    """Decode `num_frames` frames of one clip -> (uint8 (T, 3, H, W) RGB or None, video_max_pts).

    Same frame choice as ClipBERT for every strategy, and the same video_max_pts: on every selective
    decode the duration the clip window was computed with (pass it back to spare the safeguard's pts
    scan), None when the whole video had to be decoded (no duration in the header). Returns
    (None, None) if the container does not open and (None, video_max_pts) if decoding fails; the
    reason is logged. New code should call `clipbert_legacy.datasets.decoder.decode_clips`, which raises
    VideoDecodeError with the reason.
    """
    try:
        container = open_container(in_mem_bytes_io, multi_thread_decode)
    except VideoDecodeError as e:
        logger.info("Exception in loading video binary: %s", e)
        return None, None
    kwargs = get_video_decoding_kwargs(num_frames, target_fps, num_clips, clip_idx, sampling_strategy,
                                       safeguard_duration, video_max_pts)
    try:
        frames, video_max_pts = decode_clip(container, **kwargs)
    except VideoDecodeError as e:
        logger.info("Failed to decode video (%s): %s", e.reason, e)
        return None, getattr(e, "video_max_pts", video_max_pts)
    finally:
        container.close()
    return torch.from_numpy(frames).permute(0, 3, 1, 2), video_max_pts


# ---------------------------------------------------------------------------------------------
# Base dataset: video loading, bad-video handling and reporting
# ---------------------------------------------------------------------------------------------

class BadVideosError(UserError, RuntimeError):
    """Evaluation met videos that could not be loaded; `.bad` is [(key, reason)]."""

    def __init__(self, dataset_name, bad):
        self.bad = bad
        keys = ", ".join(f"{k} ({r})" for k, r in bad[:50])
        more = f" and {len(bad) - 50} more" if len(bad) > 50 else ""
        super().__init__(f"{dataset_name}: {len(bad)} video(s) could not be loaded: {keys}{more}; "
                         f"fix or remove them, or pass --skip_bad_videos 1 to evaluate without them")


class BadReason(str):
    """A bad video's reason ('too_large', ...) that carries its one-line message (``detail``) from the loader
    worker to the main process, which logs it (once per key and epoch: ``BadVideoLog.record_bad_videos``);
    equal to the plain reason string everywhere else."""

    def __new__(cls, reason: str, detail: str = ""):
        out = super().__new__(cls, reason)
        out.detail = detail
        return out

    def __reduce__(self):  # to the main process through the loader's queue
        return BadReason, (str(self), self.detail)


class BadVideoLog:
    """Bad-video bookkeeping of a dataset (the loader reports each batch's failures in the main
    process): per-pass summaries, and in evaluation a failure unless ``skip_bad_videos``."""

    def init_bad_video_log(self, name, is_train, skip_bad_videos):
        self.name, self.is_train, self.skip_bad_videos = name, is_train, bool(skip_bad_videos)
        self._bad_seen = []  # (key, reason) recorded in this (main) process via record_bad_videos
        self._bad_logged = set()  # keys logged this epoch: a key drawn again (training) is not logged again
        self.last_pass_bad = []  # sorted (key, reason) of the last finished pass (evaluation reports them)
        self._epoch = 0

    def record_bad_videos(self, bad):
        """Called in the main process (by PrefetchLoader) with the batch's [(key, reason)]; logs each key
        once per epoch (every loader worker may draw it, training may draw it again as a replacement)."""
        for b in bad:
            key, reason = b[0], b[1]
            self._bad_seen.append((key, str(reason)))
            if key not in self._bad_logged:
                self._bad_logged.add(key)
                logger.warning("%s: bad video %r (%s): %s", self.name, key, reason,
                               getattr(reason, "detail", ""))

    def bad_video_report(self, reset=True, log=True):
        """Summary of bad videos recorded since the last reset: {count, by_reason, keys}."""
        bad = list(self._bad_seen)
        keys = sorted({k for k, _ in bad})
        report = {"epoch": self._epoch, "count": len(bad), "by_reason": dict(Counter(r for _, r in bad)),
                  "keys": keys}
        if log:
            what = "replaced" if self.is_train else ("skipped" if self.skip_bad_videos else "failed")
            if bad:
                shown = ", ".join(keys[:20]) + (f" (+{len(keys) - 20} more)" if len(keys) > 20 else "")
                logger.warning("%s epoch %d: %d bad video load(s) %s (%s): %s", self.name, self._epoch,
                               len(bad), what, ", ".join(f"{r}={n}" for r, n in report["by_reason"].items()),
                               shown)
            else:
                logger.info("%s epoch %d: 0 bad videos", self.name, self._epoch)
        if reset:
            self._bad_seen = []
            self._bad_logged = set()
            self._epoch += 1
        return report

    def end_of_pass(self):
        """Called after each full pass over the loader: log the summary; in evaluation raise
        BadVideosError listing the bad keys unless skip_bad_videos."""
        bad = sorted(set(self._bad_seen))
        self.last_pass_bad = bad
        self.bad_video_report(reset=True, log=True)
        if bad and not self.is_train and not self.skip_bad_videos:
            raise BadVideosError(self.name, bad)


class VideoDatasetBase(BadVideoLog, Dataset):
    """Shared video loading for all task datasets.

    Args:
        datalist: task-specific list (see subclasses).
        img_lmdb_dir: LMDB directory (key = video name, value = raw video bytes); or an LMDBStore.
        fps: frames per second sampled inside a clip (ClipBERT `fps`).
        num_frm: frames per clip (`num_frm`).
        frm_sampling_strategy: rand|uniform|start|middle|end (`frm_sampling_strategy`).
        max_img_size: longer side after resize; frames are zero-padded to max_img_size^2.
        img_resize: "exact" (ClipBERT's float resize, bit for bit) or "uint8" (uint8 resize and
            batches; normalised to float on the device), see clipbert_legacy.datasets.image_ops.
        n_clips: clips per video, concatenated along T (T = n_clips * num_frm).
        clip_mode: "strategy" (each clip by the strategy, independently: ClipBERT's single clip and
            random multi-clip) or "uniform" (clip k of n_clips evenly spaced, with safeguard).
        is_train: training replaces a bad video by another random sample (counted and logged);
            evaluation reports it and fails at the end of the pass unless skip_bad_videos.
        skip_bad_videos: evaluation only: drop bad videos (reported) instead of failing.
        min_video_frames: a video with fewer frames is "too_short" (default 2: a still is no video).
        max_frame_pixels: a video (or image) with larger frames is "too_large", refused from its header
            before decoding (0: no limit).
        max_retries: training attempts per item before raising.
        name: used in log lines and errors.
    """

    def __init__(self, datalist, img_lmdb_dir, fps=1, num_frm=3, frm_sampling_strategy="rand",
                 max_img_size=448, n_clips=1, clip_mode="strategy", is_train=False, skip_bad_videos=False,
                 min_video_frames=2, max_retries=10, name="dataset", max_frame_pixels=MAX_FRAME_PIXELS,
                 img_resize="exact"):
        if frm_sampling_strategy not in SAMPLING_STRATEGIES:
            raise ValueError(f"frm_sampling_strategy={frm_sampling_strategy!r} is not one of "
                             f"{SAMPLING_STRATEGIES}")
        if clip_mode not in ("strategy", "uniform"):
            raise ValueError(f"clip_mode={clip_mode!r} must be 'strategy' or 'uniform'")
        if int(n_clips) < 1 or int(num_frm) < 1 or float(fps) <= 0:
            raise ValueError(f"need n_clips >= 1, num_frm >= 1, fps > 0; got {n_clips}, {num_frm}, {fps}")
        self.datalist = datalist
        self.store = img_lmdb_dir if isinstance(img_lmdb_dir, LMDBStore) else LMDBStore(img_lmdb_dir)
        self.fps, self.num_frm, self.frm_sampling_strategy = fps, int(num_frm), frm_sampling_strategy
        self.max_img_size, self.n_clips, self.clip_mode = int(max_img_size), int(n_clips), clip_mode
        self.img_resize = img_resize
        self.min_video_frames, self.max_retries = min_video_frames, max_retries
        self.max_frame_pixels = int(max_frame_pixels)
        self.init_bad_video_log(name, is_train, skip_bad_videos)

    # -- video ---------------------------------------------------------------------------------
    def padded(self, frames):
        """uint8 (T, 3, H, W) frames -> the PaddedFrames the collator writes into the batch as
        (T, 3, S, S) in [0, 255] (float32, or uint8 with img_resize "uint8")."""
        return PaddedFrames(frames, self.max_img_size, self.img_resize)

    def load_video(self, vid_id):
        """PaddedFrames of (n_clips*num_frm) frames (``.tensor()``: (T, 3, S, S) in [0, 255]); raises
        VideoDecodeError with a reason."""
        try:
            data = self.store.get(vid_id)
        except KeyError as e:
            raise VideoDecodeError("missing_key", e.args[0]) from None
        frames = decode_clips(data, num_frames=self.num_frm, target_fps=self.fps, n_clips=self.n_clips,
                              mode=self.clip_mode, sampling_strategy=self.frm_sampling_strategy,
                              min_video_frames=self.min_video_frames, max_frame_pixels=self.max_frame_pixels)
        h, w = frames.shape[-2:]
        if not (1 / 5 < h / w < 5):  # ClipBERT's aspect-ratio rule
            raise VideoDecodeError("aspect_ratio", f"frame size {h}x{w}: aspect ratio outside (1/5, 5)")
        return self.padded(frames)

    def try_load_video(self, vid_id):
        """(frames, None) or (None, reason_string); logs the failure with the key."""
        try:
            return self.load_video(vid_id), None
        except VideoDecodeError as e:  # logged by the main process (record_bad_videos), once per epoch
            return None, BadReason(e.reason, str(e))

    def load_item(self, index, build):
        """``build(index) -> (item, None) | (None, (key, reason))``: training replaces a bad video
        (:meth:`get_with_replacement`); evaluation returns an empty item carrying the failure, which
        the collator drops and the loader reports."""
        if self.is_train:
            return self.get_with_replacement(index, build)
        item, failure = build(index)
        if item is None:
            return {"vid": None, "examples": [], "n_examples": 0, "vid_id": failure[0],
                    "bad_videos": [failure]}
        item["bad_videos"] = []
        return item

    def get_with_replacement(self, index, build):
        """Training: `build(index) -> item or None` (None = bad video); on failure retry another
        random index. The item gets `bad_videos` [(key, reason)] of the ones it replaced."""
        bad = []
        for _ in range(self.max_retries):
            item, failure = build(index)
            if item is not None:
                item["bad_videos"] = bad
                return item
            bad.append(failure)
            index = random.randint(0, len(self) - 1)
        failures = ", ".join(f"{k} ({r})" for k, r in bad)
        raise RuntimeError(f"{self.name}: {self.max_retries} videos in a row failed to load: {failures}; "
                           f"check the LMDB store {self.store.path}")
