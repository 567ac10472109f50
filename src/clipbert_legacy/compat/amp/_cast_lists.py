"""O1's function lists: which torch functions run in fp16, which in fp32, which promote mixed inputs.

These are the names apex's O1 used (its ``lists/functional_overrides.py``, ``torch_overrides.py`` and
``tensor_overrides.py`` in the last releases that shipped amp), for torch >= 1.1 with CUDA >= 9.1 (so
``mean`` is not blacklisted and the batched matmuls are on the fp16 list). Names a torch build does not
have are skipped when the patches are installed.
"""
from __future__ import annotations

# torch.nn.functional
F_FP16 = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
          "conv_tbc", "linear")
F_FP32 = (
    "interpolate", "grid_sample",                                        # interpolation
    "softplus", "softmin", "log_softmax", "softmax", "gelu",             # pointwise
    "layer_norm", "group_norm", "local_response_norm", "normalize", "cosine_similarity",  # norms
    "poisson_nll_loss", "cosine_embedding_loss", "cross_entropy", "hinge_embedding_loss", "kl_div",
    "l1_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "multilabel_soft_margin_loss", "multi_margin_loss", "nll_loss", "binary_cross_entropy_with_logits",
    "smooth_l1_loss", "soft_margin_loss", "triplet_margin_loss", "ctc_loss",  # losses
)
F_BANNED = {
    "binary_cross_entropy": (
        "amp O1 does not run F.binary_cross_entropy / nn.BCELoss on fp16 input (its input must already "
        "be fp32). Use nn.BCEWithLogitsLoss (sigmoid and BCE in one, on the fp32 list), or call "
        "amp.register_float_function(torch, 'sigmoid') before amp.initialize()."),
}

# torch
TORCH_FP16 = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
              "conv_tbc", "prelu", "addmm", "addmv", "addr", "matmul", "mm", "mv",
              "addbmm", "baddbmm", "bmm")
TORCH_FP32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "reciprocal",
              "rsqrt", "sinh", "tan", "pow", "cumprod", "cumsum", "dist", "norm", "prod", "std", "sum",
              "var", "renorm")
TORCH_PROMOTE = ("addcdiv", "addcmul", "atan2", "cross", "bilinear", "dot", "add", "div", "mul",
                 "eq", "equal", "ge", "gt", "le", "lt", "ne")
TORCH_SEQUENCE_PROMOTE = ("cat", "stack")

# torch.Tensor methods: these plus every name of the torch lists that is also a Tensor method
TENSOR_FP16 = ("__matmul__",)
TENSOR_FP32 = ("__ipow__", "__pow__", "__rpow__", "cpu")  # cpu: fp32 before leaving the device
TENSOR_PROMOTE = ("__add__", "__div__", "__eq__", "__ge__", "__gt__", "__le__", "__lt__", "__mul__",
                  "__ne__", "__radd__", "__rdiv__", "__rmul__", "__rsub__", "__rtruediv__", "__sub__",
                  "__truediv__")
# apex put these on its promote list too, which replaced ``a += b`` on an fp16 ``a`` by a new fp32
# tensor; here they take the dtype of ``self`` like every other in-place method (package docstring).
TENSOR_INPLACE_OPERATORS = ("__iadd__", "__idiv__", "__imul__", "__isub__", "__itruediv__")

RNN_FUNCTIONS = ("rnn_relu", "rnn_tanh", "gru", "lstm",
                 "rnn_relu_cell", "rnn_tanh_cell", "gru_cell", "lstm_cell")
