"""torch backend's gradient buckets without processes: the packing buffer is kept on the CPU (and rebuilt
when the bucket's gradients change), fresh on other devices; the one-pass write-back equals the
scaled copy it replaces, element for element. The reductions themselves: tests/test_hvd*.py jobs."""
import torch

from clipbert_legacy.compat.hvd.compression import Compression
from clipbert_legacy.compat.hvd.torch_backend.buckets import Buckets
from clipbert_legacy.compat.hvd.torch_backend.execute import scale


def _buckets(params, compression=Compression.none):
    return Buckets(params, group=None, size=2, rank=0, device="cpu", op="average", predivide=1.0,
                   compression=compression, owners={}, header_index=None)


def test_the_cpu_packing_buffer_is_kept_and_rebuilt_when_its_gradients_change():
    params = [torch.nn.Parameter(torch.zeros(3, 4)), torch.nn.Parameter(torch.zeros(5))]
    for p in params:
        p.grad = torch.randn_like(p)
    b = _buckets(params)
    first = b._buffer(0, ("torch.float32", -1), params)
    assert first.numel() == 17 and b._buffer(0, ("torch.float32", -1), params) is first
    fewer = b._buffer(0, ("torch.float32", -1), params[:1])  # a gradient left to the sparse path: smaller
    assert fewer is not first and fewer.numel() == 12
    meta = [torch.nn.Parameter(torch.zeros(4, device="meta"))]
    meta[0].grad = torch.zeros(4, device="meta")
    assert b._buffer(1, ("torch.float32", -1), meta) is not b._buffer(1, ("torch.float32", -1), meta)


def test_the_one_pass_write_back_equals_scale_then_copy():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(7, 3)), torch.nn.Parameter(torch.zeros(11))]
    flat = torch.randn(32) * 1e3
    b = _buckets(params)
    for post in (0.5, 1 / 3, 1.0):
        for p in params:
            p.grad = torch.full_like(p, 9.0)
        assert b._write_back_scaled(flat, post, params)
        expect = scale(flat, post)
        assert torch.equal(torch.cat([p.grad.reshape(-1) for p in params]), expect)
    # compressed or not float32: not its case, nothing written
    for p in params:
        p.grad = torch.full_like(p, 9.0)
    assert not _buckets(params, Compression.fp16)._write_back_scaled(flat, 0.5, params)
    assert not b._write_back_scaled(flat.double(), 0.5, params)
    assert all(bool((p.grad == 9.0).all()) for p in params)
