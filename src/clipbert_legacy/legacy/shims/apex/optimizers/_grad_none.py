"""apex's fused optimizers take ``set_grad_none`` in the constructor: ``zero_grad()``'s default then."""


class SetGradNoneDefault:
    """Mixin before the torch optimizer: ``zero_grad()`` without an argument uses ``self.set_grad_none``."""

    set_grad_none: bool

    def zero_grad(self, set_to_none=None):
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)
