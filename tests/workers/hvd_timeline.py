"""A torchrun job with ``HOROVOD_TIMELINE`` set (tests/test_hvd_timeline.py).

Both ranks: an allreduce named ``test_allreduce`` (Horovod's test's), an unnamed broadcast, an allgather;
then rank 0 writes ``paused`` and both wait for ``go`` (the test reads the timeline while the job runs).
Then Horovod's API: ``start_timeline(<out>/api.json, mark_cycles=False)``, one allreduce,
``stop_timeline()``; and one more allreduce, recorded in neither file."""
import argparse
import os
import time

import torch

import clipbert_legacy.compat.hvd as hvd

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--wait-s", type=float, default=600)
a = p.parse_args()

hvd.init()
r = hvd.rank()
total = hvd.allreduce(torch.tensor([1.0, 2.0, 3.0]), name="test_allreduce", op=hvd.Sum)
assert total.tolist() == [2.0, 4.0, 6.0], total
hvd.broadcast(torch.arange(6.0).view(2, 3), root_rank=1)
hvd.allgather(torch.ones(r + 1, 2), name="gather")
if r == 0:
    open(os.path.join(a.out, "paused"), "w").close()
deadline = time.monotonic() + a.wait_s
while not os.path.exists(os.path.join(a.out, "go")):
    if time.monotonic() > deadline:
        raise SystemExit(f"rank {r}: the test did not write {a.out}/go within {a.wait_s:.0f} s")
    time.sleep(0.05)
hvd.start_timeline(os.path.join(a.out, "api.json"), mark_cycles=False)
hvd.allreduce(torch.ones(2), name="api_allreduce")
hvd.stop_timeline()
hvd.allreduce(torch.ones(2), name="after_stop")
hvd.shutdown()
