"""Small helpers with ClipBERT's names: seeding, zero-filling unused grads, a do-nothing object."""
import random

import numpy as np
import torch


def set_random_seed(seed):
    """Seed python, numpy and torch (CPU and every CUDA device), as ClipBERT did at start-up."""
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def zero_none_grad(model_or_params):
    """Give every trainable parameter without a gradient a zero one.

    Parameters unused in a forward (e.g. a head not used by this batch) would otherwise leave
    ``.grad`` None; collective allreduce then sees different tensor sets on different ranks
    (a Horovod stall), and optimizers would skip them. Zero grads keep every rank in step.
    Takes a module or an iterable of parameters (the engine passes its cached trainable list, so
    the per-step call does not walk the module tree).
    """
    params = model_or_params.parameters() if hasattr(model_or_params, "parameters") else model_or_params
    for p in params:
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)


class NoOp:
    """Accepts any attribute access or call and does nothing (stands in for rank>0 loggers)."""

    def __getattr__(self, name):
        return self.noop

    def noop(self, *_args, **_kwargs):
        return None

    def __bool__(self):
        return False


def get_rng_states():
    """Snapshot of every RNG the training loop draws from (python, numpy, torch CPU, CUDA), in tensors
    and plain values only (numpy's state as ints, not a pickled ndarray), so a restore file holding it
    loads with ``torch.load(weights_only=True)``."""
    _, key, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(),
             "numpy": {"key": key.tolist(), "pos": int(pos), "has_gauss": int(has_gauss),
                       "gauss": float(gauss)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_states(state):
    """Inverse of :func:`get_rng_states`; also takes numpy's own tuple (restore files written before the
    state was stored as plain values)."""
    random.setstate(state["python"])
    np_state = state["numpy"]
    if isinstance(np_state, dict):
        np_state = ("MT19937", np.asarray(np_state["key"], dtype=np.uint32), np_state["pos"],
                    np_state["has_gauss"], np_state["gauss"])
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
