"""``hvd.elastic`` on each backend (tests/test_hvd_elastic_backend.py).

``--expect torch``: after ``hvd.init()`` and one allreduce (the backend works), the script uses
``hvd.elastic.run`` as Horovod's examples do; the torch backend must refuse it at once with its one
line (the job fails). Each rank prints ``at t=<time>`` just before, so the test can time the failure.
``--expect horovod``: ``hvd.elastic`` is Horovod's own module, and a ``TorchState`` synced through
``hvd.elastic.run`` carries rank 0's values to every rank; rank r writes ``elastic<r>.json``."""
import argparse
import json
import os
import sys
import time

import torch

import clipbert_legacy.compat.hvd as hvd

p = argparse.ArgumentParser()
p.add_argument("--expect", choices=["torch", "horovod"], required=True)
p.add_argument("--out", default="")
a = p.parse_args()

hvd.init()
total = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="elastic.before").item()
assert total == hvd.size(), total
if a.expect == "torch":
    print(f"rank {hvd.rank()} uses hvd.elastic at t={time.time():.3f}", flush=True)
    sys.stdout.flush()


model = torch.nn.Linear(2, 1)
with torch.no_grad():
    model.weight.fill_(float(hvd.rank() + 1))


@hvd.elastic.run
def train(state):
    return {"rank": hvd.rank(), "weight": state.model.weight.flatten().tolist(), "epoch": state.epoch,
            "module": hvd.elastic.__name__}


state = hvd.elastic.TorchState(model=model, epoch=hvd.rank() + 5)
result = train(state)
json.dump(result, open(os.path.join(a.out, f"elastic{hvd.rank()}.json"), "w"))
