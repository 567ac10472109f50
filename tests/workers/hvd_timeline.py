"""A torchrun job with ``HOROVOD_TIMELINE`` set (tests/test_hvd_timeline.py).

Both ranks: an allreduce named ``test_allreduce`` (Horovod's test's), an unnamed broadcast, an allgather;
then rank 0 writes ``paused`` and both wait for ``go`` (the test reads the timeline while the job runs).
Then Horovod's API on rank 0 (the only rank that records): ``start_timeline(<out>/api.json,
mark_cycles=False)``, one allreduce, ``stop_timeline()``; and one more allreduce, recorded in neither file."""
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


def wait_for(name):
    deadline = time.monotonic() + a.wait_s
    while not os.path.exists(os.path.join(a.out, name)):
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {r}: {a.out}/{name} did not appear within {a.wait_s:.0f} s")
        time.sleep(0.05)


def signal(name):
    open(os.path.join(a.out, name), "w").close()


if r == 0:
    signal("paused")
wait_for("go")
# rank 1 submits only once rank 0 has switched files (the coordinator, rank 0, records the negotiation:
# a submission that reached it before its start_timeline() would open NEGOTIATE_ in the other file)
if r == 0:
    hvd.start_timeline(os.path.join(a.out, "api.json"), mark_cycles=False)
    signal("api_started")
wait_for("api_started")
hvd.allreduce(torch.ones(2), name="api_allreduce")
if r == 0:
    hvd.stop_timeline()
    signal("api_stopped")
wait_for("api_stopped")
hvd.allreduce(torch.ones(2), name="after_stop")
hvd.shutdown()
