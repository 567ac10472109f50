"""The legacy ``apex.amp`` API, implemented natively on modern torch.

``from src.compat import amp`` is used exactly like ``from apex import amp``::

    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", keep_batchnorm_fp32=True)
    with amp.scale_loss(loss, optimizer, delay_unscale=not last_micro_batch) as scaled:
        scaled.backward()
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
    optimizer.step()
    ckpt = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "amp": amp.state_dict()}

apex deleted ``amp`` upstream (PR #1896) and its old releases do not build on today's torch, while
ClipBERT's training code is written against it. This package keeps the behaviour of the last apex
releases that still shipped it: the O0-O3 property table and its override rules, the fp16 model
with fp32 affine BatchNorm and optimizer-owned fp32 master weights (O2), the patched forward,
apex's dynamic loss scaler (2**16 start, window 2000, factor 2, min/max caps) and static scales,
delayed unscaling, ``master_params`` and the ``loss_scalerN`` state dict. O1 is ``torch.autocast``
(fp16). With ``AMP_BACKEND=apex`` and a real legacy ``apex.amp`` importable, every call is delegated
to apex.

Layout (every module shares the one module-level state object, ``_state._amp_state``):

* ``_state``       the state object and logging
* ``_options``     ``Properties`` and the opt levels O0-O3 with apex's override rules
* ``_scaler``      ``LossScaler``
* ``_backend``     ``AMP_BACKEND`` selection and ``backend()``
* ``_model``       casting (BatchNorm kept fp32), the patched forward, fp32 state_dict hooks, model checks
* ``_optimizer``   fp32 masters and the patched ``step`` / ``zero_grad`` / ``add_param_group``
* ``_handle``      ``scale_loss`` (scaling, unscaling into the masters, scaler update)
* ``_overflow``    the cross-rank overflow agreement and ``num_skipped_steps()``
* ``_checkpoint``  ``master_params``, ``state_dict``, ``load_state_dict``
* ``_initialize``  ``initialize``

Deliberate differences from apex, and why:

* **CPU works.** apex required CUDA params and cuDNN; here CPU models are accepted (tests, laptops)
  and a warning is emitted once that fp16 on CPU is slow. O1 autocasts on the device type of the
  model's parameters. The "An input tensor was not cuda." warning fires only for a CUDA model.
* **bf16.** ``cast_model_type=torch.bfloat16`` (O2/O3) casts to bf16 with fp32 masters. bf16 has fp32's
  range, so unless ``loss_scale`` is passed the scale is a *static 1.0*: no scaling and, like every
  static scale in apex, no overflow skipping.
* **Masters are created eagerly** in ``initialize`` (apex: lazily, at the first ``zero_grad``/
  ``scale_loss``). That removes apex's delay_unscale bug (lazy init at the first non-delayed exit set
  the grads of fp32 params to None, dropping the delayed micro-batches; ClipBERT's "quick hack" of
  ``zero_grad(); step()`` before training is no longer needed but still harmless) and means optimizer
  state loaded after ``initialize`` is cast straight to fp32 (apex cast it to fp16 first, which can
  underflow Adam's ``exp_avg_sq``). Writes to the model made before the first ``scale_loss`` (e.g.
  ``hvd.broadcast_parameters(model.named_parameters())`` after initialize) still reach the masters,
  as they did with apex's lazy init: changed params are re-copied at the first ``scale_loss``.
* **Checkpoints keep fp32 precision.** Under O2 ``model.state_dict()`` holds fp32 copies of the
  *master* weights (apex: the fp16 weights upcast; they round to the same fp16 values), and
  ``model.load_state_dict`` also writes the loaded fp32 values into the masters. So a same-level
  save/restore continues bit-identically, where apex rebuilt masters from fp16-rounded weights.
* **Static scale 1.0 with masters keeps accumulated fp32 grads.** apex (commit ``20d00ab1``) took a
  shortcut for a unit static scale that dropped the grads stashed for fp32 params (BatchNorm) during
  accumulation; here they are added back like under any other scale.
* **Overflow decisions are global.** With a dynamic scale under ``src.compat.hvd``/Horovod or
  ``torch.distributed`` (size > 1) the local overflow flag is all-reduced (one scalar per non-delayed
  ``scale_loss`` exit), so a rank-local inf skips the step on every rank and the scales never diverge
  (apex relied on grads being already averaged). Like ``synchronize()`` this is a collective: every
  rank must run the same number of non-delayed exits. ``AMP_SYNC_OVERFLOW=0`` turns it off.
* **O1** is ``torch.autocast(<model's device type>, torch.float16)`` around the model's forward; apex
  patched torch functions globally (also outside the forward). Both keep weights fp32 and run GEMMs in
  fp16 and reductions/softmax/losses in fp32 on CUDA (CPU autocast has its own, shorter fp32 list).
* **O2 ``zero_grad(set_to_none=False)``** zeroes model grads (apex) unless ``set_to_none=True``, always
  sets master grads to None, and keeps Horovod's "zero_grad before synchronize" guard that apex's
  replacement silently removed.
* Casting of forward inputs/outputs rebuilds lists, tuples (namedtuples too) and sets, keeps the type
  of mutable Mappings such as OrderedDict or transformers' ``ModelOutput`` (apex returned a plain dict,
  losing attribute access) and passes other iterables through (apex tried ``type(x)(...)``, which
  breaks on namedtuples, ranges and generators). No ``DeprecatedFeatureWarning`` is emitted,
  and the option printout goes to ``logging`` instead of stdout.

Kept from apex on purpose: static scales never skip, so an inf gradient under a static scale reaches
the weights; ``load_state_dict`` matches scalers by key order, not by the number in the key.
"""
# ``x as x`` marks a deliberate re-export. Private ones are there because the tests use them: the one
# state object (reset in place with ``amp._amp_state.__init__()``), the caster and the in-place cast.
from src.compat.amp._backend import AMP_BACKENDS as AMP_BACKENDS
from src.compat.amp._backend import backend
from src.compat.amp._checkpoint import load_state_dict, master_params, state_dict
from src.compat.amp._handle import scale_loss
from src.compat.amp._initialize import initialize
from src.compat.amp._model import _cast as _cast
from src.compat.amp._model import _convert_module as _convert_module
from src.compat.amp._options import Properties, opt_levels
from src.compat.amp._overflow import num_skipped_steps
from src.compat.amp._scaler import LossScaler
from src.compat.amp._state import _amp_state as _amp_state

__all__ = ["initialize", "scale_loss", "master_params", "state_dict", "load_state_dict",
           "LossScaler", "Properties", "opt_levels", "num_skipped_steps", "backend"]

