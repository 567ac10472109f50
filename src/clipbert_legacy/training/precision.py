"""Numeric precision of the training step, behind one small interface.

The step (``Trainer.run_step``) is written once; what differs between fp32, bf16 autocast and apex-style
fp16 O2 lives here:

* :class:`FullPrecision` — fp32 weights, optionally ``torch.autocast`` to bf16 in the forward. The loss
  goes to ``backward`` unchanged, the optimizer's params are the model's params, nothing is skipped.
* :class:`AmpO2Precision` — ClipBERT's ``--fp16 1``: ``amp.initialize(opt_level="O2",
  keep_batchnorm_fp32=True)`` (fp16 model, fp32 BatchNorm, fp32 master weights owned by the optimizer,
  dynamic loss scaling). ``scale_loss`` is ``amp.scale_loss``; an overflowing step is skipped by amp.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

# Consecutive optimizer steps with a non-finite loss that dynamic loss scaling may absorb (by skipping
# them and halving the scale) before the run is stopped: 20 halvings take 2**16 down to 2**-4.
AMP_TOLERATED_NONFINITE_STEPS = 20


class FullPrecision:
    """fp32 training (``bf16=True``: the forward under ``torch.autocast(device, bfloat16)``)."""

    name = "fp32"
    #: consecutive steps with a non-finite loss tolerated before the run stops (0: the first one stops it)
    tolerated_nonfinite_steps = 0

    def __init__(self, device: torch.device, bf16: bool = False):
        self.device, self.bf16 = device, bf16
        if bf16:
            self.name = "bf16"

    def prepare(self, model: torch.nn.Module, optimizer):
        """Return ``(model, optimizer)`` ready for training (after the Horovod broadcast)."""
        return model, optimizer

    def before_training(self, optimizer, fresh_run: bool) -> None:
        """Anything that must happen once before the first step of this process."""

    def autocast(self):
        if self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def scale_loss(self, loss: torch.Tensor, optimizer,  # noqa: ARG002 (the precision interface; fp32 ignores)
                   delay_unscale: bool = False) -> Iterator[torch.Tensor]:  # noqa: ARG002 (the same)
        """The loss to call ``backward`` on (here: the loss itself)."""
        yield loss

    def master_params(self, optimizer) -> list[torch.Tensor]:
        """The tensors the optimizer updates: what gradient clipping must see."""
        return [p for g in optimizer.param_groups for p in g["params"]]

    def masters_by_name(self, _optimizer) -> dict[str, torch.Tensor] | None:
        """Parameter name -> fp32 master, where masters differ from the model's params (else None)."""
        return None

    def restore_weights(self, model: torch.nn.Module, optimizer, weights: dict) -> None:
        """Put fp32 ``weights`` (a restore file's model state) into wherever training reads them from.
        fp32: ``model.load_state_dict`` before the broadcast already did."""

    def skipped_steps(self) -> int:
        """Optimizer steps skipped so far for gradient overflow (never, without loss scaling)."""
        return 0

    def loss_scale(self) -> float | None:
        return None

    def state_dict(self) -> dict | None:
        return None

    def load_state_dict(self, state: dict | None) -> None:
        pass


class AmpO2Precision(FullPrecision):
    """apex.amp O2 through ``clipbert_legacy.compat.amp`` (its package docstring: the apex behaviour kept)."""

    name = "fp16 (amp O2)"
    tolerated_nonfinite_steps = AMP_TOLERATED_NONFINITE_STEPS

    def __init__(self, device: torch.device):
        super().__init__(device, bf16=False)
        from clipbert_legacy.compat import amp
        self.amp = amp
        self._skipped_before = amp.num_skipped_steps()  # amp counts since import (the finder's trials too)

    def prepare(self, model, optimizer):
        return self.amp.initialize(model, optimizer, opt_level="O2", keep_batchnorm_fp32=True, verbosity=0)

    def before_training(self, optimizer, fresh_run):
        """ClipBERT's "quick hack for amp delay_unscale bug": ``zero_grad(); step()`` once before a fresh
        run (with no gradients the step changes nothing; it makes apex create its masters)."""
        with optimizer.skip_synchronize():
            optimizer.zero_grad()
            if fresh_run:
                optimizer.step()

    def autocast(self):
        return contextlib.nullcontext()  # the model itself is fp16

    def scale_loss(self, loss, optimizer, delay_unscale=False):
        return self.amp.scale_loss(loss, optimizer, delay_unscale=delay_unscale)

    def master_params(self, optimizer):
        return list(self.amp.master_params(optimizer))

    def masters_by_name(self, optimizer):
        out = {}
        for g in optimizer.param_groups:
            out.update(zip(g["param_names"], g["params"]))
        return out

    def restore_weights(self, model, optimizer, weights):
        """Copy the saved fp32 values into the masters and the (fp16) model params."""
        masters = self.masters_by_name(optimizer)
        with torch.no_grad():
            for n, p in masters.items():
                p.copy_(weights[n])
            for n, p in model.named_parameters():
                if n in masters:
                    p.copy_(weights[n])

    def skipped_steps(self):
        return self.amp.num_skipped_steps() - self._skipped_before

    def loss_scale(self):
        sd = self.amp.state_dict()
        return float(next(iter(sd.values()))["loss_scale"]) if sd else None

    def state_dict(self):
        return self.amp.state_dict()

    def load_state_dict(self, state):
        if state is not None:
            self.amp.load_state_dict(state)


def build_precision(cfg, device: torch.device) -> FullPrecision:
    """``fp16`` -> amp O2; else fp32, with bf16 autocast when ``bf16``."""
    if cfg.fp16:
        return AmpO2Precision(device)
    return FullPrecision(device, bf16=bool(cfg.bf16))
