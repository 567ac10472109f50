"""The ``ops`` mode of tests/workers/hvd_api.py: every collective's result against Horovod's definition.

Each rank's inputs are a function of its rank, so every rank can compute every expected value itself.
The same checks run under horovodrun (real Horovod: this is what makes them Horovod's definitions) and
under torchrun (the torch backend); ``run_checks`` returns ``{check: None (equal) | what differed}``.
"""
import torch


def _diff(actual, expected):
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return f"expected {len(expected)} results, got {actual!r}"
        for a, e in zip(actual, expected):
            d = _diff(a, e)
            if d:
                return d
        return None
    if not torch.is_tensor(actual):
        return None if actual == expected else f"{actual!r} != {expected!r}"
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return f"dtype/shape {actual.dtype}{list(actual.shape)} != {expected.dtype}{list(expected.shape)}"
    return None if torch.equal(actual, expected) else f"{actual.tolist()} != {expected.tolist()}"


def _rows(dim0, n):
    """Horovod's reducescatter split: the first dim0 % n ranks get one row more."""
    return [dim0 // n + (1 if r < dim0 % n else 0) for r in range(n)]


def _mine(t, r, n):
    return t.split(_rows(t.shape[0], n))[r]


def reducescatter_checks(hvd, r, n):
    base = torch.arange(10.).reshape(5, 2)
    total = sum(k + 1 for k in range(n))
    ints = torch.tensor([[-3], [3], [5], [7]])
    return {
        "reducescatter_sum": (hvd.reducescatter(base * (r + 1), op=hvd.Sum), _mine(base * total, r, n)),
        "reducescatter_average_scaled": (
            hvd.reducescatter(base * (r + 1), op=hvd.Average, prescale_factor=0.5, postscale_factor=3.0),
            _mine(sum(base * (k + 1) * 0.5 for k in range(n)) * (3.0 / n), r, n)),
        "reducescatter_int_average_truncates": (
            hvd.reducescatter(ints * (r + 1), op=hvd.Average),
            _mine((ints * total).double().mul(1.0 / n).to(torch.int64), r, n)),
        "grouped_reducescatter": (
            hvd.grouped_reducescatter([base * (r + 1), torch.arange(4.) * (r + 1)], op=hvd.Sum),
            [_mine(base * total, r, n), _mine(torch.arange(4.) * total, r, n)]),
    }


def alltoall_checks(hvd, r, n):
    def splits(k):
        return [(k + j) % 2 + 1 for j in range(n)]

    def data(k):
        return torch.arange(float(sum(splits(k)))) + 100 * k

    out, received = hvd.alltoall(data(r), torch.tensor(splits(r), dtype=torch.int32))
    expected = torch.cat([data(k)[sum(splits(k)[:r]):sum(splits(k)[:r + 1])] for k in range(n)])
    equal = hvd.alltoall(torch.arange(2. * n) + 100 * r)
    return {
        "alltoall_splits": ([out, received], [expected, torch.tensor([splits(k)[r] for k in range(n)],
                                                                     dtype=torch.int32)]),
        "alltoall_equal_split": (equal, torch.cat([torch.arange(2. * n)[2 * r:2 * r + 2] + 100 * k
                                                   for k in range(n)])),
    }


def reduction_checks(hvd, r, n):
    total = sum(k + 1 for k in range(n))
    a, b = torch.ones(3) * r, torch.arange(4, dtype=torch.float64) * (r + 1)
    inplace = [torch.ones(2) * (r + 1), torch.ones(3, dtype=torch.int32) * (r + 1)]
    hvd.grouped_allreduce_(inplace, op=hvd.Sum)
    ints = torch.tensor([5, -5, 7])
    return {
        "grouped_allreduce_average": (hvd.grouped_allreduce([a, b], op=hvd.Average),
                                      [torch.ones(3) * sum(range(n)) / n, torch.arange(4, dtype=torch.float64)
                                       * total / n]),
        "grouped_allreduce_inplace": (inplace, [torch.ones(2) * total,
                                                torch.ones(3, dtype=torch.int32) * total]),
        "int16_allgather_broadcast": (
            [hvd.allgather(torch.tensor([[30000, -5]], dtype=torch.int16) * (r + 1)),
             hvd.broadcast(torch.tensor([7, -7], dtype=torch.int16) * r, root_rank=n - 1)],
            [torch.cat([torch.tensor([[30000, -5]], dtype=torch.int16) * (k + 1) for k in range(n)]),
             torch.tensor([7, -7], dtype=torch.int16) * (n - 1)]),
        "int_prescale_truncates": (hvd.allreduce(ints, op=hvd.Sum, prescale_factor=0.5),
                                   (ints.double() * 0.5).to(torch.int64) * n),
        "int_postscale": (hvd.allreduce(ints, op=hvd.Sum, postscale_factor=0.3),
                          (ints.double() * n * 0.3).to(torch.int64)),
        "min_max_product": ([hvd.allreduce(torch.tensor([1., 5.]) * (r + 1), op=op)
                             for op in (hvd.Min, hvd.Max, hvd.Product)],
                            [torch.tensor([1., 5.]), torch.tensor([1., 5.]) * n,
                             torch.tensor([1., 5. ** n]) * float(torch.arange(1., n + 1).prod())]),
    }


def async_checks(hvd, r, n):
    handles = [hvd.allreduce_async(torch.ones(4) * i * (r + 1), op=hvd.Sum, name=f"async.{i}")
               for i in range(4)]
    polls = [hvd.poll(h) for h in handles]
    sums = [hvd.synchronize(h) for h in handles]
    gather = hvd.allgather_async(torch.ones(r + 1, 2) * r)
    inplace = torch.ones(3) * r
    bcast = hvd.broadcast_async_(inplace, root_rank=n - 1)
    gathered = hvd.synchronize(gather)
    hvd.synchronize(bcast)
    total = sum(k + 1 for k in range(n))
    return {
        "async_allreduce": (sums, [torch.ones(4) * i * total for i in range(4)]),
        "poll_is_bool": (all(isinstance(p, bool) for p in polls), True),
        "allgather_async_variable_rows": (gathered, torch.cat([torch.ones(k + 1, 2) * k for k in range(n)])),
        "broadcast_async_inplace": (inplace, torch.ones(3) * (n - 1)),
        "objects": ([hvd.allgather_object({"r": r}), hvd.broadcast_object("root" if r == 0 else None)],
                    [[{"r": k} for k in range(n)], "root"]),
    }


def process_set_checks(hvd, r, n):
    evens = hvd.add_process_set([k for k in range(n) if k % 2 == 0])
    odds = hvd.add_process_set([k for k in range(n) if k % 2 == 1])
    mine = evens if r % 2 == 0 else odds
    members = mine.ranks
    out = {
        "process_set_allreduce": (hvd.allreduce(torch.ones(2) * (r + 1), op=hvd.Sum, process_set=mine),
                                  torch.ones(2) * sum(k + 1 for k in members)),
        "process_set_allgather": (hvd.allgather(torch.ones(1) * r, process_set=mine),
                                  torch.tensor([float(k) for k in members])),
        "process_set_broadcast": (hvd.broadcast(torch.ones(1) * r, root_rank=members[-1], process_set=mine),
                                  torch.ones(1) * members[-1]),
        "process_set_rank_size": ([mine.rank(), mine.size(), mine.included()],
                                  [members.index(r), len(members), True]),
    }
    hvd.barrier(process_set=mine)
    hvd.barrier()
    out["process_set_removed"] = (hvd.remove_process_set(odds) and hvd.remove_process_set(evens), True)
    return out


def _model(rank):
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    model[1].num_batches_tracked += rank + 7  # an int64 buffer between float ones, at an odd offset
    return model


def parameter_checks(hvd, r, n):
    model = _model(r)
    hvd.broadcast_parameters(model.state_dict(), root_rank=n - 1)
    named = _model(r)
    hvd.broadcast_parameters(named.named_parameters(), root_rank=n - 1)
    expected = _model(n - 1).state_dict()
    return {"broadcast_parameters_state_dict": (list(model.state_dict().values()), list(expected.values())),
            "broadcast_parameters_named": ([p.detach() for p in named.parameters()],
                                           [p.detach() for p in _model(n - 1).parameters()])}


def torch_backend_checks(hvd, r, n):
    """Beyond Horovod (its allreduce rejects int16): summed as int32 and cast back, wrapping like int16."""
    if hvd.backend_name() != "torch":
        return {}
    mine = torch.tensor([30000, -5], dtype=torch.int16) * (r + 1)
    expected = (torch.tensor([30000, -5], dtype=torch.int32) * sum(range(1, n + 1))).to(torch.int16)
    return {"int16_sum_wraps": (hvd.allreduce(mine, op=hvd.Sum), expected)}


def run_checks(hvd):
    r, n = hvd.rank(), hvd.size()
    results = {}
    for part in (reducescatter_checks, alltoall_checks, reduction_checks, async_checks, process_set_checks,
                 parameter_checks, torch_backend_checks):
        for name, (actual, expected) in part(hvd, r, n).items():
            results[name] = _diff(actual, expected)
    return results
