"""Row-sparse gradient averaging for embedding tables (both ``hvd`` backends).

A batch touches a few hundred of the 30,522 rows of BERT's word-embedding table, yet a dense
allreduce moves all 11.7M gradient values (47 MB in fp32), and it is the last gradient the backward
produces, so none of it overlaps with compute. Here each rank finds the rows where its gradient is
non-zero, the ranks exchange those row ids, and only the union of rows is averaged; every other row
is zero on every rank, so its average is zero and is left as it is. The result is the dense average,
not an approximation (NaN and inf rows count as non-zero and travel like any other).

When the union covers more than half the table (a table tied to an output layer, like BERT's MLM
decoder, has a gradient in every row) the whole gradient is averaged densely instead: all ranks see
the same union, so they take the same branch.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

DENSE_FRACTION = 0.5
LAST = {"rows": 0, "table_rows": 0, "dense": False}  # the last reduction, for logs and tests


def average_rows(grad: torch.Tensor, allgather: Callable[[torch.Tensor], torch.Tensor],
                 average: Callable[[torch.Tensor, Any], torch.Tensor], compression) -> torch.Tensor:
    """Average ``grad`` (rows x ...) across ranks in place over the rows any rank touched.

    ``allgather`` concatenates a 1-D tensor of each rank's row ids (lengths may differ);
    ``average(packed, ctx)`` returns the decompressed cross-rank average of a compressed tensor,
    computed as the backend's dense gradient allreduce computes it (so the two agree bit for bit).
    Returns ``grad``.
    """
    g = grad.detach()
    rows2d = g.reshape(g.shape[0], -1)  # a view of a contiguous grad; others take the dense branch
    own = rows2d.ne(0).any(dim=1).nonzero().reshape(-1)
    union = torch.unique(allgather(own))  # sorted, the same on every rank
    dense = union.numel() > DENSE_FRACTION * g.shape[0] or not g.is_contiguous()
    LAST.update(rows=union.numel(), table_rows=g.shape[0], dense=dense)
    if dense:
        g.copy_(average(*compression.compress(g)).view_as(g))
    elif union.numel():
        rows = average(*compression.compress(rows2d.index_select(0, union)))
        rows2d.index_copy_(0, union, rows.to(g.dtype))
    return grad
