"""Bad videos at the end of a task's passes: the hook that reports the last, partly read training epoch,
and what evaluation tells about the videos it left out (``skipped_videos.json``)."""
import logging

from clipbert_legacy.training.contracts import Hook
from clipbert_legacy.utils.distributed import all_gather_list

logger = logging.getLogger(__name__)


class LastEpochBadVideos(Hook):
    """Logs the bad-video summary of the last, partly read epoch (full epochs report at their end)."""

    def after_train(self, trainer, _summary):
        dataset = trainer.train_dataset
        if trainer.state.examples_in_epoch and hasattr(dataset, "bad_video_report"):
            dataset.bad_video_report(reset=True, log=True)


def gather_bad_videos(dataset):
    """Collective: the (key, reason) pairs of every rank's last evaluation pass, sorted, unique."""
    merged = set()
    for part in all_gather_list(list(getattr(dataset, "last_pass_bad", []))):
        merged.update(tuple(b) for b in part)
    return sorted(merged)


def skipped_videos_report(bad, evaluated):
    """``skipped_videos.json``: the videos left out (undecodable, ``skip_bad_videos 1``) and the
    denominators the metrics were computed over."""
    if bad:
        logger.warning("evaluation skipped %d undecodable video(s) (%s); metrics are over %s",
                       len(bad), ", ".join(k for k, _ in bad[:10]) + (" ..." if len(bad) > 10 else ""),
                       ", ".join(f"{k} {v}" for k, v in evaluated.items()))
    return {"count": len(bad), "keys": [{"key": k, "reason": r} for k, r in bad], "evaluated": evaluated}
