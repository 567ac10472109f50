"""`src.compat.hvd` backend over `torch.distributed` (gloo on CPU, nccl on GPU), for `torchrun`.

Without a launcher (no WORLD_SIZE in the environment) it runs as a single process: size 1,
every collective is the identity and no process group is created.
"""
import atexit
import datetime
import os
import sys
import warnings

import torch
import torch.distributed as dist

from src.compat import _peer_watchdog
from src.compat._compression import Compression
from src.compat._row_sparse import average_rows

_S = {"rank": 0, "size": 1, "local_rank": 0, "local_size": 1, "group": False, "device": "cpu",
      "failed": False}


def init(*args, **kwargs):  # noqa: ARG001 (Horovod's signature)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    _S["rank"] = int(os.environ.get("RANK", "0"))
    _S["size"] = world
    _S["local_rank"] = int(os.environ.get("LOCAL_RANK", "0"))
    _S["local_size"] = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if world > 1 and not dist.is_initialized():
        use_nccl = torch.cuda.is_available() and os.environ.get("DIST_TORCH_BACKEND", "") != "gloo"
        if use_nccl:
            torch.cuda.set_device(_S["local_rank"])
        timeout = datetime.timedelta(seconds=float(os.environ.get("DIST_TIMEOUT_S", "1800")))
        dist.init_process_group("nccl" if use_nccl else "gloo", timeout=timeout,
                                **_restart_safe_store(world, timeout))
        _S["device"] = f"cuda:{_S['local_rank']}" if use_nccl else "cpu"
        _peer_watchdog.start(_S["rank"], world)
        atexit.register(_leave_together)
        sys.excepthook = _note_failure
    _S["group"] = world > 1


def _restarted():
    """This worker was started by ``torchrun --max-restarts`` after a failure (round > 0)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0


def _restart_safe_store(world, timeout):
    """After ``torchrun --max-restarts`` restarted the workers, the agent's store can still hold the
    previous round's process-group keys, and a new worker then reads a dead peer's address (gloo:
    "connectFullMesh failed ... Connection refused", seen in about half of the restarts here). Keys of
    restart round ``n`` > 0 go under their own prefix; a first round, or no agent store: the default."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or not _restarted():
        return {}
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=timeout)
    prefix = f"clipbert/restart_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return {"store": dist.PrefixStore(prefix, store), "rank": _S["rank"], "world_size": world}


def _leave_together():
    """At a clean interpreter exit: wait (10 s at most) until every rank is leaving, then tear the
    group down. A rank that exited while its peers' gloo threads still held connections to it made
    one of them abort at exit ("terminate called without an active exception", SIGABRT) in about
    every other 2-process run here, after all the work was done. After an uncaught exception, or if a
    peer does not arrive, nothing is waited for: the launcher ends the job."""
    _peer_watchdog.stop()  # a clean exit: peers stop watching this rank
    if _S["failed"] or not (_S["group"] and dist.is_initialized()) or dist.get_backend() != "gloo":
        return
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=10))
    except Exception:  # a peer is gone or stuck: leave without tearing down
        return
    shutdown()


def _note_failure(exc_type, exc, tb, _previous=sys.excepthook):
    _S["failed"] = True
    _previous(exc_type, exc, tb)


def shutdown():
    _peer_watchdog.stop()
    if _S["group"] and dist.is_initialized():
        dist.destroy_process_group()
    _S["group"] = False


def rank():
    return _S["rank"]


def size():
    return _S["size"]


def local_rank():
    return _S["local_rank"]


def local_size():
    return _S["local_size"]


def gloo_built():
    return dist.is_gloo_available()


def nccl_built():
    return dist.is_nccl_available()


def barrier():
    if _S["group"]:
        dist.barrier()


def busy():
    """Context: a long operation of this rank alone (a checkpoint save); see ``_peer_watchdog``."""
    return _peer_watchdog.busy()


def join(device=-1):  # noqa: ARG001 (Horovod's signature)
    """Barrier returning the last rank to arrive (no uneven-input participation)."""
    if not _S["group"]:
        return 0
    stamps = [None] * _S["size"]
    dist.all_gather_object(stamps, (os.times().elapsed, _S["rank"]))
    return max(stamps)[1]


def _comm(tensor):
    """The tensor as the process group's device wants it (nccl needs CUDA tensors)."""
    return tensor.to(_S["device"]) if tensor.device.type != _S["device"].split(":")[0] else tensor


_REDUCE = {"sum": dist.ReduceOp.SUM, "average": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
           "max": dist.ReduceOp.MAX, "product": dist.ReduceOp.PRODUCT}


def _reduce_op(op):
    if op not in _REDUCE:
        raise ValueError(f"reduction op {op!r} is not supported by the torch backend "
                         f"(supported: {', '.join(_REDUCE)}); Adasum needs real Horovod")
    return _REDUCE[op]


def allreduce(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0):  # noqa: ARG001 (Horovod's signature)
    rop = _reduce_op(op)
    out = tensor.detach().clone()
    if prescale_factor != 1.0:
        out.mul_(prescale_factor)
    if _S["group"]:
        buf = _comm(out)
        dist.all_reduce(buf, op=rop)
        out = buf.to(tensor.device)
    if op == "average":
        out = _div(out, _S["size"])
    if postscale_factor != 1.0:
        out.mul_(postscale_factor)
    return out


def _div(t, n):
    return t.div_(n) if t.is_floating_point() else t.div_(n, rounding_mode="floor")


def allgather(tensor, name=None):  # noqa: ARG001 (Horovod's signature)
    if not _S["group"]:
        return tensor.detach().clone()
    t = _comm(tensor.detach().contiguous())
    n = torch.tensor([t.shape[0] if t.dim() else 1], device=t.device)
    ns = [torch.zeros_like(n) for _ in range(_S["size"])]
    dist.all_gather(ns, n)
    ns = [int(x.item()) for x in ns]
    flat = t.reshape(-1) if t.dim() else t.reshape(1)
    own_rows = ns[_S["rank"]]
    per_row = flat.numel() // max(own_rows, 1) if own_rows else int(torch.tensor(t.shape[1:]).prod())
    pad = torch.zeros(max(ns) * per_row, dtype=t.dtype, device=t.device)
    pad[:flat.numel()] = flat
    outs = [torch.empty_like(pad) for _ in range(_S["size"])]
    dist.all_gather(outs, pad)
    rest = tuple(t.shape[1:]) if t.dim() else ()
    parts = [o[:k * per_row].reshape((k,) + rest) for o, k in zip(outs, ns)]
    return torch.cat(parts, 0).to(tensor.device)


def broadcast(tensor, root_rank, name=None):  # noqa: ARG001 (Horovod's signature)
    out = tensor.detach().clone()
    return broadcast_(out, root_rank)


def broadcast_(tensor, root_rank, name=None):  # noqa: ARG001 (Horovod's signature)
    if _S["group"]:
        buf = _comm(tensor.data)
        dist.broadcast(buf, src=root_rank)
        if buf is not tensor.data:
            tensor.data.copy_(buf)
    return tensor


def allgather_object(obj, name=None):  # noqa: ARG001 (Horovod's signature)
    out = [None] * _S["size"]
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, root_rank=0, name=None):  # noqa: ARG001 (Horovod's signature)
    box = [obj if _S["rank"] == root_rank else None]
    dist.broadcast_object_list(box, src=root_rank)
    return box[0]


# --------------------------------------------------------------------------------------------
# DistributedOptimizer
BUCKET_BYTES = int(os.environ.get("DIST_BUCKET_MB", "25")) * 2 ** 20


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed into a dynamic subclass of the user's optimizer class (as Horovod does)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, row_sparse=(), reduce_to=None):
        super(self.__class__, self).__init__(params)
        all_params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named_parameters = list(named_parameters)
            names = [n for n, _ in named_parameters]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"DistributedOptimizer: parameter names are not unique: {dup[:5]}")
            self._names = {p: n for n, p in named_parameters}
            unnamed = [p for p in all_params if p not in self._names]
            if unnamed:
                raise ValueError(f"DistributedOptimizer: named_parameters was given but {len(unnamed)} "
                                 "optimizer parameter(s) are not in it; pass model.named_parameters() "
                                 "of the model whose parameters the optimizer holds")
        else:
            self._names = {p: f"param.{i}" for i, p in enumerate(all_params)}
        if op not in ("average", "sum"):
            raise ValueError(f"DistributedOptimizer op {op!r}: the torch backend supports average and sum")
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self._op = op
        self._predivide = gradient_predivide_factor
        self._should_synchronize = True
        self._synchronized = False
        self._hook_handles = []
        self._buckets, self._bucket_of, self._delay = [], {}, {}
        # ZeRO stage 2 (ours): param -> the one rank its gradient is summed onto; others drop theirs
        self._owner = dict(reduce_to or {})
        if self._owner and op != "average":
            raise ValueError("DistributedOptimizer: reduce_to needs op=average")
        # reduced in synchronize(), over the rows some rank touched (src.compat._row_sparse)
        sparse_ids = {id(q) for q in row_sparse}
        self._row_sparse = [p for p in all_params if p.requires_grad and id(p) in sparse_ids]
        if self._row_sparse and op != "average":
            raise ValueError("DistributedOptimizer: row_sparse parameters need op=average")
        if size() > 1:
            self._build_buckets([p for p in all_params if p.requires_grad and id(p) not in sparse_ids])
            self._register_hooks()
        self._reset()

    # -- setup ------------------------------------------------------------------------------
    def _build_buckets(self, params):
        # Reverse order: gradients of the last layers are ready first during backward.
        cur, cur_bytes = [], 0
        for p in reversed(params):
            if cur and (cur_bytes + p.numel() * p.element_size() > BUCKET_BYTES
                        or cur[0].dtype != p.dtype or cur[0].device != p.device):
                self._buckets.append(cur)
                cur, cur_bytes = [], 0
            cur.append(p)
            cur_bytes += p.numel() * p.element_size()
        if cur:
            self._buckets.append(cur)
        for i, b in enumerate(self._buckets):
            for p in b:
                self._bucket_of[p] = i

    def _register_hooks(self):
        for p in self._bucket_of:
            self._hook_handles.append(p.register_post_accumulate_grad_hook(self._make_hook()))

    def _reset(self):
        for p in self._bucket_of:
            self._delay[p] = self.backward_passes_per_step
        self._ready = [0] * len(self._buckets)
        self._pending = {}      # bucket index -> (work, flat buffer, ctx)
        self._next_bucket = 0   # buckets are launched strictly in index order on every rank

    def _make_hook(self):
        def hook(p):
            if self._delay[p] <= 0:
                raise AssertionError(
                    f"Gradients were computed more than backward_passes_per_step="
                    f"{self.backward_passes_per_step} times before call to step() "
                    f"(parameter {self._names.get(p, '?')}). Increase backward_passes_per_step to "
                    "accumulate gradients locally, or call optimizer.synchronize()/step() after "
                    "every backward_passes_per_step backward passes.")
            self._delay[p] -= 1
            if self._delay[p] == 0:
                self._ready[self._bucket_of[p]] += 1
                self._launch_ready()
        return hook

    # -- communication ----------------------------------------------------------------------
    def _launch_ready(self):
        while (self._next_bucket < len(self._buckets)
               and self._ready[self._next_bucket] == len(self._buckets[self._next_bucket])):
            self._launch(self._next_bucket)
            self._next_bucket += 1

    def _launch(self, i):
        # Buckets are formed at wrap time (before amp may cast some params to fp16): reduce each
        # dtype of the bucket separately, in a fixed order, so fp16 grads travel as fp16.
        # With reduce_to, also per owner: a dist.reduce onto it instead of an allreduce.
        by_dtype = {}
        for p in self._buckets[i]:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            by_dtype.setdefault((str(p.grad.dtype), self._owner.get(p, -1)), []).append(p)
        works = []
        for key in sorted(by_dtype):
            params, owner = by_dtype[key], key[1]
            flat = torch.cat([p.grad.detach().reshape(-1) for p in params])
            if self._predivide != 1.0:
                flat.div_(self._predivide)
            comp, ctx = self._compression.compress(flat)
            comp = _comm(comp)
            work = (dist.all_reduce(comp, op=dist.ReduceOp.SUM, async_op=True) if owner < 0 else
                    dist.reduce(comp, dst=owner, op=dist.ReduceOp.SUM, async_op=True))
            works.append((work, comp, ctx, params, owner))
        self._pending[i] = works

    def _finish(self, i):
        for work, comp, ctx, params, owner in self._pending.pop(i):
            work.wait()
            if owner >= 0 and owner != _S["rank"]:  # reduced onto its owner: this rank drops it
                for p in params:
                    p.grad = None
                continue
            flat = self._compression.decompress(comp, ctx)
            if self._op == "average":
                flat = flat * (self._predivide / size())
            elif self._predivide != 1.0:
                flat = flat * self._predivide
            offset = 0
            for p in params:
                n = p.numel()
                p.grad.detach().copy_(flat[offset:offset + n].view_as(p.grad).to(p.grad.device, p.grad.dtype))
                offset += n

    def _average_packed(self, packed, ctx):
        """A row-sparse table's rows, averaged as ``_finish`` averages a bucket."""
        return self._compression.decompress(allreduce(packed, "sum"), ctx) * (1.0 / size())

    def synchronize(self):
        """Finish every gradient allreduce (launching those not yet started), then reset counts."""
        if size() > 1:
            for p in self._bucket_of:  # unused parameters / fewer backward passes: zeros
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            while self._next_bucket < len(self._buckets):
                self._launch(self._next_bucket)
                self._next_bucket += 1
            for i in sorted(self._pending):
                self._finish(i)
            for p in self._row_sparse:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                average_rows(p.grad, allgather, self._average_packed, self._compression)
                if self._owner.get(p, _S["rank"]) != _S["rank"]:
                    p.grad = None
            self._reset()
        self._synchronized = True

    class _SkipSync:
        def __init__(self, opt):
            self.opt = opt

        def __enter__(self):
            self.opt._should_synchronize = False

        def __exit__(self, *exc):
            self.opt._should_synchronize = True

    def skip_synchronize(self):
        """Inside this block `step()` does not allreduce (call `synchronize()` yourself before)."""
        return _DistributedOptimizer._SkipSync(self)

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                # stacklevel 3: the caller's step() line (torch wraps Optimizer.step in a profiling hook)
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context "
                              "after optimizer.synchronize(). This can cause training slowdown. You may "
                              "want to consider using optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.", stacklevel=3)
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def _in_flight(self):
        return bool(self._pending) or any(d != self.backward_passes_per_step for d in self._delay.values())

    def zero_grad(self, set_to_none=True):
        if self._in_flight():
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(); this would drop gradients "
                                 "already being reduced. Call step()/synchronize() first.")
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step=1, op="average", gradient_predivide_factor=1.0,
                         row_sparse=(), reduce_to=None, **kwargs):
    unknown = set(kwargs) - {"sparse_as_dense", "groups", "num_groups", "process_set"}
    if unknown:
        raise TypeError(f"DistributedOptimizer got unexpected argument(s) {sorted(unknown)}")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression or Compression.none,
               backward_passes_per_step, op, gradient_predivide_factor, row_sparse, reduce_to)
