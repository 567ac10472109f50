"""Worker for tests/test_hvd_failing_rank.py: a rank that leaves the path its peer is on (issue 50).

Modes (``--mode``, several comma-separated run one after another in one job, each from ``hvd.init()`` to
``hvd.shutdown()``); each rank writes ``OUT/<mode><rank>.json``, or ``OUT/<mode><rank>.error`` (the traceback)
where the mode raised, and goes on to the next mode (``raise`` excepted: its exception ends the rank):
  shutdown  rank 1 "fails" (as a test that failed and ran Horovod's ``tearDown``: ``hvd.shutdown()``)
            while rank 0 waits in ``hvd.barrier()``: rank 0's error and how long it took; then both
            ``hvd.shutdown(); hvd.init()`` and one checked allreduce (the job goes on)
  diverge   rank 0 waits in ``hvd.barrier()``; rank 1 caught an exception and went on to an allreduce
            rank 0 never submits: both errors and how long they took; then both ``hvd.shutdown();
            hvd.init()`` and one checked allreduce
  raise     rank 1 raises (uncaught) while rank 0 waits in an allreduce: the launcher ends the job;
            rank 1 prints ``at t=<time>`` as it fails
  cycles    ``--cycles`` times: ``hvd.init()``, a checked named allreduce and unnamed broadcast,
            ``hvd.shutdown()``; writes the count and the seconds
"""
import argparse
import json
import os
import time
import traceback

import torch

import clipbert_legacy.compat.hvd as hvd


def _error_of(fn):
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # HorovodInternalError (or Horovod's RuntimeError) is what is expected
        return {"error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - t0}
    return {"error": None, "seconds": time.monotonic() - t0}


def _restart_and_check():
    hvd.shutdown()
    hvd.init()
    got = hvd.allreduce(torch.ones(2) * (hvd.rank() + 1), op=hvd.Sum, name="after").tolist()
    hvd.shutdown()
    return got


def shutdown_mode(r):
    hvd.init()
    hvd.allreduce(torch.ones(1), name="warm-up")
    if r == 0:
        res = _error_of(hvd.barrier)
    else:
        time.sleep(2.0)  # rank 0 is in its barrier by now
        res = {}
    res["after"] = _restart_and_check()
    return res


def diverge_mode(r):
    hvd.init()
    hvd.allreduce(torch.ones(1), name="warm-up")
    if r == 0:
        res = _error_of(hvd.barrier)
    else:
        res = _error_of(lambda: hvd.allreduce(torch.ones(3), name="only-rank-1"))
    res["after"] = _restart_and_check()
    return res


def raise_mode(r):
    hvd.init()
    hvd.allreduce(torch.ones(1), name="warm-up")
    if r == 1:
        time.sleep(1.0)
        print(f"rank 1 fails at t={time.time():.3f}", flush=True)
        raise RuntimeError("rank 1 failed")
    hvd.allreduce(torch.ones(1), name="never-complete")
    return {"error": None}


def cycles_mode(r, cycles):
    t0 = time.monotonic()
    for i in range(cycles):
        hvd.init()
        size = hvd.size()
        got = hvd.allreduce(torch.ones(3) * (hvd.rank() + 1), op=hvd.Sum, name=f"cycle.{i}").tolist()
        assert got == [size * (size + 1) / 2] * 3, (i, got)
        b = hvd.broadcast(torch.full((2,), float(hvd.rank() + i)), root_rank=0).tolist()
        assert b == [float(i)] * 2, (i, b)
        hvd.shutdown()
    return {"cycles": cycles, "seconds": time.monotonic() - t0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", required=True, help="shutdown, diverge, raise, cycles; or several: a,b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cycles", type=int, default=30)
    a = ap.parse_args()
    r = int(os.environ.get("HOROVOD_RANK", os.environ.get("RANK", "0")))
    modes = {"shutdown": shutdown_mode, "diverge": diverge_mode, "raise": raise_mode,
             "cycles": lambda rank: cycles_mode(rank, a.cycles)}
    for mode in a.mode.split(","):
        try:
            res = modes[mode](r)
        except Exception:
            if mode == "raise":  # uncaught on purpose: what the launcher does then is the test
                raise
            with open(os.path.join(a.out, f"{mode}{r}.error"), "w") as f:
                f.write(traceback.format_exc())
            hvd.shutdown()  # the next mode starts from hvd.init()
            continue
        with open(os.path.join(a.out, f"{mode}{r}.json"), "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()
