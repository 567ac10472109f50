"""The datasets' resize/pad (PaddedFrames, write_resized, stack_visual) against ClipBERT's ImageResize +
ImagePad on float frames: "exact" bit for bit, "uint8" within about one level; batches in shared memory in
DataLoader workers; uint8 batches made float and normalised by the PrefetchLoader."""
import itertools

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from clipbert_legacy.datasets.collate import stack_visual
from clipbert_legacy.datasets.data_utils import ImageNorm, ImagePad, ImageResize
from clipbert_legacy.datasets.image_ops import PaddedFrames, get_resize_size, resize_and_pad, write_resized
from clipbert_legacy.datasets.loaders import PrefetchLoader

MEAN, STD = [123.675, 116.28, 103.53], [1.0, 1.0, 1.0]
# (H, W) sources: MSRVTT-like 240p, 360p/720p (downscale to 448), odd sizes, portrait, tiny
SOURCES = [(240, 320), (360, 640), (720, 1280), (239, 321), (480, 360), (32, 32), (64, 48), (7, 5)]
TARGETS = [448, 224, 40, 768]


def reference(frames, size):
    """ClipBERT's per-video steps 3-5 exactly as it ran them: float, ImageResize, ImagePad."""
    x = frames.to(torch.float32, memory_format=torch.contiguous_format)
    return ImagePad(size, size)(ImageResize(size, "bilinear")(x))


def decoded_like(h, w, t=3, seed=0):
    """uint8 (T, 3, H, W) as the decoder returns it: a channel-first view of (T, H, W, 3)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (t, h, w, 3), dtype=torch.uint8, generator=g).permute(0, 3, 1, 2)


@pytest.mark.parametrize("hw,size", list(itertools.product(SOURCES, TARGETS)))
def test_exact_is_clipberts_resize_and_pad_bit_for_bit(hw, size):
    frames = decoded_like(*hw)
    ref = reference(frames, size)
    assert ref.shape == (3, 3, size, size)
    for src in (frames, frames.contiguous(), frames.float()):  # decoder view, NCHW uint8, float input
        out = PaddedFrames(src, size).tensor()
        assert out.dtype == torch.float32 and out.is_contiguous()
        assert torch.equal(out, ref), (hw, size, (out - ref).abs().max())
    assert torch.equal(resize_and_pad(frames, size), ref)


@pytest.mark.parametrize("hw,size", list(itertools.product(SOURCES, TARGETS)))
def test_uint8_within_one_level_of_exact(hw, size):
    frames = decoded_like(*hw, seed=1)
    ref = reference(frames, size)
    out = PaddedFrames(frames, size, "uint8").tensor()
    assert out.dtype == torch.uint8 and out.shape == ref.shape
    h, w = get_resize_size(frames, size)
    assert (out[..., h:, :] == 0).all() and (out[..., :h, w:] == 0).all()  # zero padding, as ClipBERT
    diff = (out.float() - ref).abs()
    assert diff.max() < 1.05 and diff.mean() < 0.45  # torch's fixed-point uint8 kernel, then rounding
    if (h, w) == tuple(frames.shape[-2:]):  # nothing to resize: the same values
        assert torch.equal(out.float(), ref)


def test_write_into_a_dirty_buffer_overwrites_everything():
    """The batch buffer may hold old bytes (torch.empty): the padding is written, not assumed."""
    frames = decoded_like(240, 320)
    for mode, dtype in (("exact", torch.float32), ("uint8", torch.uint8)):
        out = torch.full((3, 3, 448, 448), 7, dtype=dtype)
        write_resized(out, frames, 448, mode)
        assert torch.equal(out.float(), reference(frames, 448)) if mode == "exact" else \
            (out[..., 336:, :] == 0).all()


def test_invalid_mode_and_shape():
    with pytest.raises(ValueError, match="img_resize='fp16' must be one of"):
        PaddedFrames(decoded_like(8, 8), 16, "fp16")
    with pytest.raises(ValueError, match=r"\(T, 3, H, W\)"):
        PaddedFrames(torch.zeros(2, 8, 8, 3, dtype=torch.uint8), 16)


class _Videos(Dataset):
    """Items as the task datasets make them: {"vid": PaddedFrames} of mixed source sizes."""

    def __init__(self, mode):
        self.mode, self.sizes = mode, [(240, 320), (360, 640), (32, 32), (480, 360)]

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, i):
        return {"vid": PaddedFrames(decoded_like(*self.sizes[i], t=4, seed=i), 64, self.mode)}


def _collate(items):
    v = stack_visual(items)
    return {"visual_inputs": v, "shared": v.is_shared()}


@pytest.mark.parametrize("mode", ["exact", "uint8"])
def test_stack_visual_in_workers_writes_shared_memory_batches(mode):
    ds = _Videos(mode)
    want = torch.stack([reference(ds[i]["vid"].frames, 64) for i in range(len(ds))])
    in_process = _collate([ds[i] for i in range(len(ds))])
    assert not in_process["shared"]
    loader = DataLoader(ds, batch_size=2, num_workers=2, collate_fn=_collate)
    got = list(loader)
    assert all(b["shared"] for b in got)  # allocated in shared memory by the worker: no copy on the way
    batch = torch.cat([b["visual_inputs"] for b in got])
    assert batch.dtype == (torch.float32 if mode == "exact" else torch.uint8)
    if mode == "exact":
        assert torch.equal(batch, want) and torch.equal(in_process["visual_inputs"], want)
    else:
        assert (batch.float() - want).abs().max() < 1.05
    assert torch.equal(in_process["visual_inputs"], batch)


def test_stack_visual_rejects_mixed_items_and_stacks_tensors():
    a, b = PaddedFrames(decoded_like(8, 8), 16), PaddedFrames(decoded_like(8, 8), 16, "uint8")
    with pytest.raises(ValueError, match="differ in shape/dtype"):
        stack_visual([{"vid": a}, {"vid": b}])
    t = torch.rand(3, 3, 16, 16)
    assert torch.equal(stack_visual([{"vid": t}, {"vid": a}])[1], a.tensor())


def test_prefetch_loader_normalises_uint8_batches_like_float_ones():
    """img_resize "uint8": the loader hands uint8 batches; the PrefetchLoader makes them float on the
    device and normalises them: the same tensor as normalising the float batch of the same pixels."""
    u8 = torch.randint(0, 256, (2, 4, 3, 16, 16), dtype=torch.uint8)
    norm = ImageNorm(MEAN, STD)
    got = [b["visual_inputs"] for b in PrefetchLoader([{"visual_inputs": u8.clone()}], norm, "cpu")]
    assert got[0].dtype == torch.float32
    assert torch.equal(got[0], ImageNorm(MEAN, STD)(u8.float().clone()))
    raw = [b["visual_inputs"] for b in PrefetchLoader([{"visual_inputs": u8.clone()}], None, "cpu")]
    assert raw[0].dtype == torch.float32 and torch.equal(raw[0], u8.float())
