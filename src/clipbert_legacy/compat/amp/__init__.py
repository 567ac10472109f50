"""The legacy ``apex.amp`` API, implemented natively on modern torch.

``from clipbert_legacy.compat import amp`` is used exactly like ``from apex import amp``::

    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", keep_batchnorm_fp32=True)
    with amp.scale_loss(loss, optimizer, delay_unscale=not last_micro_batch) as scaled:
        scaled.backward()
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
    optimizer.step()
    ckpt = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "amp": amp.state_dict()}

apex deleted ``amp`` upstream (PR #1896) and its old releases do not build on today's torch, while
ClipBERT's training code is written against it. This package keeps the behaviour of the last apex
releases that still shipped it: the O0-O3 property table and its override rules, the fp16 model
with fp32 affine BatchNorm (buffers cast in place) and optimizer-owned fp32 master weights (O2) taken
from the model at the first ``zero_grad``/``step``/backward after ``initialize``, the patched forward,
apex's dynamic loss scaler (2**16 start, window 2000, factor 2, min/max caps) and static scales,
delayed unscaling, ``master_params`` and the ``loss_scalerN`` state dict, O1's cast lists applied to
torch functions process-wide with the user registry (``register_half_function``,
``register_float_function``, ``register_promote_function``, the ``half_function`` /
``float_function`` / ``promote_function`` decorators, ``disable_casts()``), ``step(closure)`` passed
through wherever there are no master weights, and the "Gradient overflow.  Skipping step, loss
scaler N reducing loss scale to X" message on every rank. With ``AMP_BACKEND=apex`` and a real
legacy ``apex.amp`` importable, every call is delegated to apex (``num_skipped_steps()``, which apex
lacks, counts the skipping steps apex arms).

Layout (every module shares the one module-level state object, ``_state._amp_state``):

* ``_state``       the state object, logging, the error types
* ``_options``     ``Properties`` and the opt levels O0-O3 with apex's override rules
* ``_scaler``      ``LossScaler``
* ``_backend``     ``AMP_BACKEND`` selection and ``backend()``
* ``_model``       casting (BatchNorm kept fp32), the patched forward, fp32 state_dict hooks, model checks
* ``_optimizer``   fp32 masters, their lazy sync, the patched ``step`` / ``zero_grad`` /
  ``add_param_group`` and the one-shot skipping ``step``
* ``_handle``      ``scale_loss`` (scaling, unscaling into the masters, scaler update)
* ``_overflow``    the cross-rank overflow agreement and ``num_skipped_steps()``
* ``_checkpoint``  ``master_params``, ``state_dict``, ``load_state_dict``
* ``_cast_lists``  O1's function lists; ``_casts`` the wrappers and the cast handle; ``_o1`` their
  installation and the user registry
* ``_initialize``  ``initialize``

Deliberate differences from apex, and why:

* **CPU works.** apex required CUDA params and cuDNN, and O1 cast only CUDA tensors; here CPU models
  are accepted (tests, laptops), O1's casts apply on every device, and a warning is emitted once that
  fp16 on CPU is slow. The "An input tensor was not cuda." warning fires only for a CUDA model.
* **bf16.** ``cast_model_type=torch.bfloat16`` (O2/O3) casts to bf16 with fp32 masters. bf16 has fp32's
  range, so unless ``loss_scale`` is passed the scale is a *static 1.0*: no scaling and, like every
  static scale in apex, no overflow skipping.
* **Master tensors exist from ``initialize``; their values follow apex's lazy rule.** apex created
  the masters at the first ``zero_grad()``/backward, copying the model as it was then. Here the fp32
  master *objects* are swapped into the optimizer in ``initialize``, so optimizer state loaded before
  training is cast straight to fp32 (apex went through the fp16 params first, which can underflow
  Adam's ``exp_avg_sq``), and apex's delay_unscale bug cannot happen (its lazy init at the first
  non-delayed exit set the grads of fp32 params to None, dropping the delayed micro-batches). The
  *values* follow apex's timing: until the first ``zero_grad()``/``step()``/``scale_loss``/
  ``add_param_group`` a write to the model (``hvd.broadcast_parameters(model.named_parameters())``,
  loading fp16 weights) is copied into the masters, so ClipBERT's ``zero_grad(); step()`` "quick
  hack" keeps it. That costs an fp16 snapshot of the trainable weights until that first call.
* **``model.state_dict()`` holds the masters themselves** (fp32, sharing memory) for params with a
  master, fp32 copies for other low-precision tensors (apex: fp32 copies of everything). So an
  in-place write into the state dict reaches the weights, as for a plain torch module:
  ``hvd.broadcast_parameters(model.state_dict())`` after ``initialize`` works (apex silently lost it
  for the fp16 params). Frozen fp16 params and fp16 buffers have no master, so broadcast those before
  ``initialize`` (ClipBERT's order) or through ``named_parameters()``/``named_buffers()``.
* **Checkpoints keep fp32 precision.** The state dict carries the masters' fp32 values (apex: the
  fp16 weights upcast; they round to the same fp16 values), and ``model.load_state_dict`` also writes
  the loaded fp32 values into the masters. So a same-level save/restore continues bit-identically,
  where apex rebuilt masters from fp16-rounded weights.
* **Static scale 1.0 with masters keeps accumulated fp32 grads.** apex (commit ``20d00ab1``) took a
  shortcut for a unit static scale that dropped the grads stashed for fp32 params (BatchNorm) during
  accumulation; here they are added back like under any other scale.
* **Overflow decisions are global.** With a dynamic scale under ``clipbert_legacy.compat.hvd``/Horovod or
  ``torch.distributed`` (size > 1) the local overflow flag is all-reduced (one scalar per non-delayed
  ``scale_loss`` exit), so a rank-local inf skips the step on every rank and the scales never diverge
  (apex relied on grads being already averaged). Like ``synchronize()`` this is a collective: every
  rank must run the same number of non-delayed exits. ``AMP_SYNC_OVERFLOW=0`` turns it off.
* **O1 converts only between fp16 and fp32.** apex's casts also turned float64 (and anything not
  fp32) into fp16 or fp32, and its promote wrappers raised NotImplementedError on other dtype mixes;
  since O1's patches are process-wide that silently downcast unrelated float64 code (metrics), so
  float64 and bf16 tensors pass unchanged and other mixes are left to torch's own type promotion.
* **O1 in-place operators stay in place.** apex put ``__iadd__``/``__isub__``/``__imul__``/
  ``__itruediv__`` on its promote list, so ``a += b`` with an fp16 ``a`` and fp32 ``b`` rebound ``a``
  to a new fp32 tensor; here they follow apex's rule for every other in-place method (the other
  arguments take ``self``'s dtype).
* **O1's patches last while amp is initialized at O1.** apex never removed them (a later
  ``initialize`` at O2 still ran every torch function through O1's casts, and O1 twice stacked the
  wrappers); here every ``initialize`` (and resetting ``amp._amp_state``) restores the original torch
  functions first. Registrations stay in force for every later O1 ``initialize``, as they did in
  apex once applied. ``disable_casts()`` without O1 is an empty block (apex: AttributeError).
* **O1 weight-cast cache** is also dropped for a weight written since it was cast (apex reused it
  until the next ``scale_loss`` exit even after e.g. ``load_state_dict``). RNN weights are cast one
  by one (apex assembled them into one flat fp16 buffer for cuDNN, which may now warn that the
  weights are not contiguous).
* **O2 ``zero_grad(set_to_none=False)``** zeroes model grads (apex) unless ``set_to_none=True``, always
  sets master grads to None, and keeps Horovod's "zero_grad before synchronize" guard that apex's
  replacement silently removed.
* **The overflow check is elementwise** (inf/NaN in any gradient element), as apex's fused ``amp_C``
  kernel did. apex's Python fallback (apex built without ``--cuda_ext``) tested each gradient's fp32
  *sum* instead, so it also skipped for finite gradients whose sum overflowed, and stopped unscaling
  at the first overflowing tensor, leaving the other master grads uninitialised (``empty_like``);
  here every master grad holds its unscaled, possibly non-finite, value, so a grad norm taken before
  a skipped step is inf/NaN. ``max_loss_scale=None`` means no cap (apex: TypeError).
* **The skipping ``step`` clears a Horovod optimizer's "synchronized" flag**, as a real step would
  (apex's skip left it set, so Horovod's next plain ``step()`` warned about a missing ``skip_synchronize()``).
* Casting of forward inputs/outputs rebuilds lists, tuples (namedtuples too) and sets, keeps the type
  of mutable Mappings such as OrderedDict or transformers' ``ModelOutput`` (apex returned a plain dict,
  losing attribute access) and passes other iterables through (apex tried ``type(x)(...)``, which
  breaks on namedtuples, ranges and generators). No ``DeprecatedFeatureWarning`` is emitted, the
  option printout goes to ``logging`` instead of stdout, and so does the overflow message (as a
  WARNING, on every rank, when the skipped ``step()`` runs, silenced by ``verbosity=0`` as in apex).

Kept from apex on purpose: static scales never skip, so an inf gradient under a static scale reaches
the weights; ``load_state_dict`` matches scalers by key order, not by the number in the key;
``loss_id`` indexes the scalers like a list (``IndexError`` beyond ``num_losses``; ``LossIdError`` also
subclasses ValueError) and an optimizer never passed to ``initialize`` raises ``AttributeError``
(``OptimizerNotInitializedError``, also a RuntimeError); ``F.binary_cross_entropy`` refuses fp16 input
under O1 (apex's ``allow_banned`` belonged to its older ``amp.init`` API, not provided).
"""
# ``x as x`` marks a deliberate re-export. Private ones are there because the tests use them: the one
# state object (reset in place with ``amp._amp_state.__init__()``), the caster and the in-place cast.
from clipbert_legacy.compat.amp._backend import AMP_BACKENDS as AMP_BACKENDS
from clipbert_legacy.compat.amp._backend import backend
from clipbert_legacy.compat.amp._casts import disable_casts
from clipbert_legacy.compat.amp._checkpoint import load_state_dict, master_params, state_dict
from clipbert_legacy.compat.amp._handle import scale_loss
from clipbert_legacy.compat.amp._initialize import initialize
from clipbert_legacy.compat.amp._model import _cast as _cast
from clipbert_legacy.compat.amp._model import _convert_module as _convert_module
from clipbert_legacy.compat.amp._o1 import (
    float_function,
    half_function,
    promote_function,
    register_float_function,
    register_half_function,
    register_promote_function,
)
from clipbert_legacy.compat.amp._options import Properties, opt_levels
from clipbert_legacy.compat.amp._overflow import num_skipped_steps
from clipbert_legacy.compat.amp._scaler import LossScaler
from clipbert_legacy.compat.amp._state import LossIdError, OptimizerNotInitializedError
from clipbert_legacy.compat.amp._state import _amp_state as _amp_state

__all__ = ["initialize", "scale_loss", "master_params", "state_dict", "load_state_dict",
           "LossScaler", "Properties", "opt_levels", "num_skipped_steps", "backend",
           "register_half_function", "register_float_function", "register_promote_function",
           "half_function", "float_function", "promote_function", "disable_casts",
           "LossIdError", "OptimizerNotInitializedError"]
