"""What every part of the GPU check shares: its settings, the device, and a result file written early.

Each part is its own process (``python tools/gpu_check_parts/<part>.py --result FILE [--cpu-dry-run]``)
started by tools/gpu_check.py. :class:`Result` rewrites FILE (atomically) every time the part has
a new figure, so a part killed by its timeout still leaves what it had measured; the driver then adds
the error. ``GPU_CHECK_FAIL_PART=<name>`` makes that part raise at its start (the CI test's forced
failure: the other parts must still write their files).
"""
import argparse
import json
import os
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# ClipBERT's base model at its MSRVTT retrieval input (16 videos x 2 texts, 2 frames at 448 px)
GPU = dict(model="configs/model/base_model.json", cnn="resnet50", videos=16, texts=2, frames=2, img=448,
           txt_len=20, warmup=5, steps=20, loader_batches=12)
# the same code paths on CPU with the tiny model, in seconds
DRY = dict(model="configs/model/tiny_model.json", cnn="tiny", videos=2, texts=2, frames=2, img=64,
           txt_len=12, warmup=1, steps=2, loader_batches=2)
FAIL_ENV = "GPU_CHECK_FAIL_PART"


def parse(description: str, extra=None) -> argparse.Namespace:
    """The arguments every part takes (``extra(parser)`` adds the part's own)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--result", required=True, help="the part's JSON result file")
    ap.add_argument("--cpu-dry-run", action="store_true", help="CPU, tiny model: code paths only")
    ap.add_argument("--work", default=None, help="scratch folder (logs, build outputs)")
    if extra:
        extra(ap)
    return ap.parse_args()


def setup(a) -> dict:
    """The part's measurement settings (GPU or dry run)."""
    return dict(DRY if a.cpu_dry_run else GPU)


def device(a):
    import torch
    if not a.cpu_dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible to torch; use --cpu-dry-run on a CPU machine")
    return torch.device("cpu" if a.cpu_dry_run else "cuda")


def sync(dev) -> None:
    import torch
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class Result:
    """The part's result file: ``status`` ``running`` until :meth:`finish`; every :meth:`save` rewrites
    the file whole (write + rename), so the file on disk is always complete JSON."""

    def __init__(self, name: str, path: str, dry: bool):
        self.path, self.t0 = path, time.time()
        self.data = {"part": name, "status": "running", "dry_run": dry}
        if os.environ.get(FAIL_ENV) == name:
            raise RuntimeError(f"forced failure of part '{name}' ({FAIL_ENV}={name})")

    def save(self, **fields) -> None:
        self.data.update(fields)
        self.data["seconds"] = round(time.time() - self.t0, 1)
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        os.replace(tmp, self.path)

    def finish(self, ok: bool, **fields) -> int:
        """Final status ``ok`` or ``failed`` (the part ran, a check did not hold); the exit status."""
        self.save(status="ok" if ok else "failed", **fields)
        return 0 if ok else 1
